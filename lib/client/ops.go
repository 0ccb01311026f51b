package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// maxNodesAnswer bounds the `nodes` subsystem answer psh reads (100k nodes
// at ~250 bytes each).
const maxNodesAnswer = 64 << 20

// ListNodes asks the proxy's `nodes` subsystem which nodes of cluster the
// user may reach: `nodes` for the proxy's own cluster (cluster empty or
// the profile's), `nodes@CLUSTER` for a leaf, whose proxy answers from its
// own RBAC. An unknown cluster, or one the user may not reach, is the
// proxy's `cluster "X" not found`.
func ListNodes(ctx context.Context, creds *Credentials, cluster string) ([]proxyapi.NodeEntry, error) {
	name := NodesSubsystem(cluster, creds.Profile.Cluster)
	pc, err := DialProxy(ctx, creds)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	defer pc.Close()
	ch, err := OpenSubsystem(ctx, pc, SubsystemConfig{Name: name})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	defer ch.closeWith(pc)
	stop := context.AfterFunc(ctx, func() { ch.Close() })
	defer stop()
	data, err := io.ReadAll(io.LimitReader(ch, maxNodesAnswer))
	if err != nil {
		return nil, trace.ConnectionProblem(err, "reading the node list: %v", err)
	}
	var nodes []proxyapi.NodeEntry
	if err := json.Unmarshal(data, &nodes); err != nil {
		if msg := ch.Explain(); msg != "" {
			return nil, trace.BadParameter("%s", msg)
		}
		return nil, trace.BadParameter("the proxy sent an invalid node list: %v", err)
	}
	return nodes, nil
}

// NodesSubsystem names the `nodes` subsystem for cluster as seen from the
// proxy's cluster local: plain `nodes` for the local one.
func NodesSubsystem(cluster, local string) string {
	if cluster == "" || strings.EqualFold(cluster, local) {
		return proxyapi.SubsystemNodes
	}
	return proxyapi.SubsystemNodes + "@" + cluster
}

// WriteNodesTable prints nodes as an aligned table.
func WriteNodesTable(w io.Writer, nodes []proxyapi.NodeEntry) error {
	// Node-supplied text is escaped (by the table, and label by label by
	// FormatLabels): a label or hostname must not drive the user's
	// terminal.
	tw := services.NewTable(w, "HOSTNAME", "ADDRESS", "LABELS", "LOGINS", "UUID")
	for _, n := range nodes {
		tw.Row(n.Hostname, services.NodeAddrText(n.Addr, n.Tunnel), services.FormatLabels(n.Labels), services.EscapeList(n.Logins, ","), n.UUID)
	}
	return trace.Wrap(tw.Flush())
}

// ProxyStdio is `psh proxy ssh`: the raw bytes of the node's SSH port on
// stdin/stdout, for OpenSSH's ProxyCommand. Half-close is kept: stdin EOF
// is sent as EOF, and the tunnel ends when the node's side ends.
func ProxyStdio(ctx context.Context, creds *Credentials, subsystem string, stdin io.ReadCloser, stdout io.WriteCloser, stderr io.Writer) error {
	pc, err := DialProxy(ctx, creds)
	if err != nil {
		return trace.Wrap(err)
	}
	defer pc.Close()
	// The proxy's stderr goes to ours: OpenSSH shows a ProxyCommand's
	// stderr, so a "not found" or ambiguous-host list reaches the user.
	ch, err := OpenSubsystem(ctx, pc, SubsystemConfig{Name: subsystem, Tee: stderr})
	if err != nil {
		return trace.Wrap(err)
	}
	defer ch.closeWith(pc)
	fromNode, _, err := utils.Splice(ctx, ch, stdio{stdin, stdout})
	if err != nil {
		return trace.Wrap(err)
	}
	// A refused route ends the channel after explaining on stderr (already
	// copied to ours): exit non-zero without repeating it. The exit-status
	// may be lost when our close crosses the proxy's, so a tunnel that
	// never carried a byte from the node (every SSH server speaks first)
	// counts as failed too.
	if st := ch.ExitStatus(); st > 0 || fromNode == 0 {
		if ch.Explain() == "" {
			return trace.ConnectionProblem(nil, "the proxy closed the tunnel before the node answered")
		}
		return &ExitStatusError{Status: 1}
	}
	return nil
}

// stdio is stdin and stdout as one stream; CloseWrite closes stdout so
// that OpenSSH sees the end.
type stdio struct {
	io.ReadCloser
	out io.WriteCloser
}

func (s stdio) Write(p []byte) (int, error) { return s.out.Write(p) }
func (s stdio) CloseWrite() error           { return s.out.Close() }
func (s stdio) Close() error {
	err := s.ReadCloser.Close()
	if err2 := s.out.Close(); err == nil {
		err = err2
	}
	return err
}

// Status describes the current login.
type Status struct {
	Proxy    string `json:"proxy"`
	ProxySSH string `json:"proxy_ssh"`
	User     string `json:"user"`
	Cluster  string `json:"cluster"`
	// Leaves are the leaf clusters whose host CAs the login holds.
	Leaves  []string `json:"leaf_clusters,omitempty"`
	Logins  []string `json:"logins"`
	Roles   []string `json:"roles"`
	Expires string   `json:"valid_until"`
}

// StatusOf summarizes credentials.
func StatusOf(c *Credentials) Status {
	var roles []string
	_ = json.Unmarshal([]byte(c.Cert.Permissions.Extensions[services.CertExtensionRoles]), &roles)
	return Status{
		Proxy: c.Profile.Proxy, ProxySSH: c.Profile.ProxySSH, User: c.Profile.User, Cluster: c.Profile.Cluster, Leaves: c.Profile.Clusters,
		Logins: c.Cert.ValidPrincipals, Roles: roles, Expires: c.Expires().UTC().Format("2006-01-02 15:04:05 MST"),
	}
}

// OpenSSHConfig is what `psh config` prints: a block per cluster, the
// proxy's own and each leaf of the profile, making `ssh LOGIN@HOST.CLUSTER`
// go through the proxy with `psh proxy ssh --cluster=CLUSTER` as
// ProxyCommand; and the proxy itself (so `ssh -J PROXY HOST.CLUSTER` works
// too). Every one uses the login's key, certificate and known_hosts, with
// StrictHostKeyChecking: the known_hosts lines trust the proxy's host CA
// for every name and a leaf's only for *.LEAF, so nothing is ever
// trusted on first use. pshPath is psh's absolute path.
//
// The blocks are meant to be appended to ~/.ssh/config, so they match only
// names that are the cluster's: a cluster named like a special-use or
// public suffix (local, a TLD) gets no *.CLUSTER block, and a proxy
// reached by IP or localhost is named CLUSTER-proxy (ownSuffix,
// proxyAlias).
func (s *Store) OpenSSHConfig(p *Profile, pshPath string) (string, error) {
	if err := p.check(); err != nil {
		return "", trace.Wrap(err)
	}
	host, port, err := net.SplitHostPort(p.ProxySSH)
	if err != nil {
		return "", trace.BadParameter("profile proxy_ssh %q: %v", p.ProxySSH, err)
	}
	alias, ownHost := proxyAlias(host, p.Cluster)
	q := func(path string) string { return `"` + path + `"` }
	var own, special []string
	for _, c := range append([]string{p.Cluster}, p.Clusters...) {
		if ownSuffix(c) {
			own = append(own, c)
		} else {
			special = append(special, c)
		}
	}
	patterns := []string{}
	for _, c := range own {
		patterns = append(patterns, "*."+c)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Postern cluster %q through proxy %s (generated by `psh config`)\n", p.Cluster, p.Proxy)
	if ownSuffix(p.Cluster) {
		// Only the proxy's own cluster issues per-session certificates
		// (a leaf's nodes that need one refuse a root user).
		b.WriteString(s.sessionMFAMatch(p.Cluster, alias, pshPath))
	}
	fmt.Fprintf(&b, "Host %s\n", strings.Join(append(patterns, alias), " "))
	fmt.Fprintf(&b, "    UserKnownHostsFile %s\n", q(s.KnownHostsPath()))
	fmt.Fprintf(&b, "    StrictHostKeyChecking yes\n")
	fmt.Fprintf(&b, "    IdentityFile %s\n", q(s.KeyPath(p)))
	fmt.Fprintf(&b, "    CertificateFile %s\n", q(s.CertPath(p)))
	fmt.Fprintf(&b, "    IdentitiesOnly yes\n")
	// The proxy splices the node's bytes and cannot probe the user's SSH
	// connection for them: OpenSSH's own keep-alives end a session to a
	// frozen node (or proxy) within 30-45s instead of never.
	fmt.Fprintf(&b, "    ServerAliveInterval 15\n")
	fmt.Fprintf(&b, "    ServerAliveCountMax 2\n")
	if !ownHost {
		fmt.Fprintf(&b, "# The proxy %s, as `ssh -J %s`: its address alone would match every `ssh %s`\n", host, alias, host)
	}
	fmt.Fprintf(&b, "Host %s\n", alias)
	if !ownHost {
		fmt.Fprintf(&b, "    HostName %s\n", host)
	}
	fmt.Fprintf(&b, "    Port %s\n", port)
	for i, c := range own {
		if c != p.Cluster || i > 0 {
			fmt.Fprintf(&b, "# Postern leaf cluster %q, reached through the proxy of %q\n", c, p.Cluster)
		}
		fmt.Fprintf(&b, "Host *.%s !%s\n", c, alias)
		// --home names this store explicitly: OpenSSH runs the
		// ProxyCommand with its own environment, which may lack the
		// POSTERN_HOME this profile was found through (another shell, an
		// IDE, cron), and psh would then look for a login in ~/.postern.
		fmt.Fprintf(&b, "    ProxyCommand %s --home=%s proxy ssh --cluster=%s %%r@%%h:%%p\n", q(pshPath), q(s.Dir), c)
	}
	for _, c := range special {
		fmt.Fprintf(&b, "# No Host *.%s block: %q is a special-use or public suffix, the block would capture hosts outside Postern; use `psh ssh` or `ssh -J %s`\n", c, c, alias)
	}
	return b.String(), nil
}

// ListRecordings asks the proxy's `recordings` subsystem which session
// recordings the user may see.
func ListRecordings(ctx context.Context, creds *Credentials) ([]proxyapi.RecordingEntry, error) {
	data, err := readSubsystem(ctx, creds, proxyapi.SubsystemRecordings, maxNodesAnswer, nil)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var out []proxyapi.RecordingEntry
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, trace.BadParameter("the proxy sent an invalid recording list: %v", err)
	}
	return out, nil
}

// FetchRecording streams recording id (an asciicast v2 file) into w.
func FetchRecording(ctx context.Context, creds *Credentials, id string, w io.Writer) error {
	_, err := readSubsystem(ctx, creds, proxyapi.SubsystemRecordingPrefix+id, 0, w)
	return trace.Wrap(err)
}

// maxChunkLine bounds one line of the recording-chunks answer: a chunk
// is at most a few MiB compressed (recording.MaxChunkDecoded bounds it
// decompressed), base64 in JSON.
const maxChunkLine = 4*recording.MaxChunkDecoded/3 + 4096

// FetchRecordingChunks streams recording id's stored chunks, hashes
// included, calling fn for each in index order, so that the caller checks
// the hash chain itself. A stream the proxy ended with a failure (a chunk
// it could not read) is an error naming the proxy's reason.
func FetchRecordingChunks(ctx context.Context, creds *Credentials, id string, fn func(recording.Chunk) error) error {
	pc, err := DialProxy(ctx, creds)
	if err != nil {
		return trace.Wrap(err)
	}
	defer pc.Close()
	return trace.Wrap(fetchRecordingChunks(ctx, pc, id, fn))
}

// ChunksUnsupported reports whether err is an older proxy's refusal of
// the recording-chunks subsystem (it takes any unknown name for a
// proxy:HOST:PORT request): the caller can only fetch the cast, unchecked.
func ChunksUnsupported(err error) bool {
	return err != nil && strings.Contains(err.Error(), "invalid proxy subsystem request")
}

func fetchRecordingChunks(ctx context.Context, pc *ssh.Client, id string, fn func(recording.Chunk) error) error {
	name := proxyapi.SubsystemRecordingChunksPrefix + id
	ch, err := OpenSubsystem(ctx, pc, SubsystemConfig{Name: name})
	if err != nil {
		return trace.Wrap(err)
	}
	defer ch.closeWith(pc)
	stop := context.AfterFunc(ctx, func() { ch.Close() })
	defer stop()
	sc := bufio.NewScanner(ch)
	sc.Buffer(make([]byte, 64<<10), maxChunkLine)
	n := 0
	for sc.Scan() {
		var c recording.Chunk
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return trace.BadParameter("the proxy sent an invalid chunk after %d chunks: %v", n, err)
		}
		if err := fn(c); err != nil {
			return trace.Wrap(err)
		}
		n++
	}
	if err := sc.Err(); err != nil {
		return trace.ConnectionProblem(err, "reading %s: %v", name, err)
	}
	if code := ch.ExitStatus(); code != 0 {
		msg := ch.Explain()
		if msg == "" {
			msg = fmt.Sprintf("the proxy ended the stream after %d chunks without saying why (exit status %d)", n, code)
		}
		if n == 0 {
			return trace.BadParameter("%s", msg)
		}
		return trace.BadParameter("reading recording %s stopped after %d chunks: %s", id, n, msg)
	}
	return nil
}

// readSubsystem opens a proxy subsystem and reads its answer: into w when
// set, else into memory (at most limit bytes). A refusal comes back with
// the proxy's message.
func readSubsystem(ctx context.Context, creds *Credentials, name string, limit int64, w io.Writer) ([]byte, error) {
	pc, err := DialProxy(ctx, creds)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	defer pc.Close()
	ch, err := OpenSubsystem(ctx, pc, SubsystemConfig{Name: name})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	defer ch.closeWith(pc)
	stop := context.AfterFunc(ctx, func() { ch.Close() })
	defer stop()
	if w != nil {
		n, err := io.Copy(w, ch)
		if err != nil {
			return nil, trace.ConnectionProblem(err, "reading %s: %v", name, err)
		}
		if n == 0 {
			if msg := ch.Explain(); msg != "" {
				return nil, trace.BadParameter("%s", msg)
			}
		}
		return nil, nil
	}
	data, err := io.ReadAll(io.LimitReader(ch, limit))
	if err != nil {
		return nil, trace.ConnectionProblem(err, "reading %s: %v", name, err)
	}
	if len(data) == 0 {
		if msg := ch.Explain(); msg != "" {
			return nil, trace.BadParameter("%s", msg)
		}
	}
	return data, nil
}
