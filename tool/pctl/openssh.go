package main

// pctl nodes add-openssh and rotate-openssh: a stock sshd taken into the
// inventory. The host key is what the whole arrangement rests on (users'
// clients, the proxies' health checks and `ssh -J` all trust the
// certificate auth signs for it), so it is given in a file or, when
// fetched from the server, shown to the admin and confirmed: never
// trusted silently.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/sshalgo"
	"github.com/postern-dev/postern/lib/utils"
)

// The files add-openssh and rotate-openssh write into --out DIR. sshd
// takes any path for HostCertificate (sshd_config(5)): the certificate
// is paired with the HostKey whose public key it certifies.
const (
	openSSHHostCertFile = "ssh_host_cert"
	openSSHUserCAFile   = "postern_user_ca.pub"
	openSSHSnippetFile  = "sshd_config.snippet"
)

// hostKeyFetchTimeout bounds fetching a server's host key: one TCP
// connection and the SSH key exchange.
const hostKeyFetchTimeout = 10 * time.Second

// openSSHFlags are the flags add-openssh and rotate-openssh share.
type openSSHFlags struct {
	hostKey string
	yes     bool
	out     string
}

func (f *openSSHFlags) register(cmd *kingpin.CmdClause) {
	cmd.Flag("host-key", "The server's public host key (FILE.pub, e.g. a copy of its /etc/ssh/ssh_host_ed25519_key.pub). Without it, the key is fetched from the server and shown for confirmation.").StringVar(&f.hostKey)
	cmd.Flag("yes", "Trust the fetched host key without asking (scripts; its fingerprint is still printed).").BoolVar(&f.yes)
	cmd.Flag("out", "Directory to write ssh_host_cert, postern_user_ca.pub and sshd_config.snippet into (created if missing).").Required().StringVar(&f.out)
}

func (c *cli) registerOpenSSH(nodes *kingpin.CmdClause, add adder) {
	var name, addr, labels string
	var af openSSHFlags
	a := nodes.Command("add-openssh", "Register an OpenSSH server (nothing of Postern runs on it): sign a host certificate for its host key and write the files its sshd needs.")
	a.Flag("name", "The node's name (what users type; a principal of its host certificate with NAME.CLUSTER).").Required().StringVar(&name)
	a.Flag("addr", "HOST:PORT where the proxies reach its sshd.").Required().StringVar(&addr)
	a.Flag("labels", "Labels k=v,k2=v2 (RBAC node_labels match them).").StringVar(&labels)
	af.register(a)
	add(a, func(ctx context.Context) error { return c.nodesAddOpenSSH(ctx, name, addr, labels, af) })

	var rname string
	var rf openSSHFlags
	r := nodes.Command("rotate-openssh", "Reissue an OpenSSH server's host certificate: for the key it presents now (or --host-key, a new one).")
	r.Arg("name", "The node's name (or uuid).").Required().StringVar(&rname)
	rf.register(r)
	add(r, func(ctx context.Context) error { return c.nodesRotateOpenSSH(ctx, rname, rf) })
}

func (c *cli) nodesAddOpenSSH(ctx context.Context, name, addr, labelText string, f openSSHFlags) error {
	labels, err := config.ParseLabels(labelText)
	if err != nil {
		return trace.BadParameter("--labels: %v", trace.UserMessage(err))
	}
	if _, _, err := services.SplitAddr(addr); err != nil {
		return trace.BadParameter("--addr %q: %v", addr, trace.UserMessage(err))
	}
	dir, err := prepareOutDir(f.out)
	if err != nil {
		return trace.Wrap(err)
	}
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	pub, err := c.hostKey(ctx, addr, f, nil)
	if err != nil {
		return trace.Wrap(err)
	}
	resp, err := clt.AddOpenSSHNode(ctx, authapi.OpenSSHNodeRequest{Name: name, Addr: addr, Labels: labels, PublicKey: pub})
	if err != nil {
		return trace.Wrap(err)
	}
	if err := writeOpenSSHFiles(dir, resp); err != nil {
		return trace.Wrap(err, "node %q is registered (uuid %s), but its files could not be written: run pctl nodes rotate-openssh %s --out DIR", name, resp.Node.UUID, name)
	}
	fmt.Fprintf(c.stdout, "OpenSSH node %q registered (uuid %s, %s).\n", resp.Node.Hostname, resp.Node.UUID, resp.Node.Addr)
	c.printSnippetHelp(dir)
	return nil
}

func (c *cli) nodesRotateOpenSSH(ctx context.Context, name string, f openSSHFlags) error {
	dir, err := prepareOutDir(f.out)
	if err != nil {
		return trace.Wrap(err)
	}
	clt, id, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	node, err := findNode(ctx, clt, id.ClusterName, name, true)
	if err != nil {
		return trace.Wrap(err)
	}
	// The key the server holds a certificate of this cluster's for, under
	// its name, needs no confirmation: the cluster vouched for it before.
	var trusted func(ssh.PublicKey) (ssh.PublicKey, bool)
	if f.hostKey == "" {
		ca, err := clt.GetCertAuthority(ctx, id.ClusterName, services.HostCA, false)
		if err != nil {
			return trace.Wrap(err)
		}
		cas, err := parseCAKeys(ca.SSHPublicKeys)
		if err != nil {
			return trace.Wrap(err)
		}
		trusted = func(key ssh.PublicKey) (ssh.PublicKey, bool) {
			if authz.CheckHostCert(cas, node.Hostname, key, clockwork.NewRealClock()) != nil {
				return nil, false
			}
			return key.(*ssh.Certificate).Key, true
		}
	}
	pub, err := c.hostKey(ctx, node.Addr, f, trusted)
	if err != nil {
		return trace.Wrap(err)
	}
	resp, err := clt.RotateOpenSSHNode(ctx, node.UUID, pub)
	if err != nil {
		return trace.Wrap(err)
	}
	if err := writeOpenSSHFiles(dir, resp); err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "Host certificate of OpenSSH node %q reissued.\n", resp.Node.Hostname)
	c.printSnippetHelp(dir)
	return nil
}

func (c *cli) printSnippetHelp(dir string) {
	fmt.Fprintf(c.stdout, "Wrote %s, %s and %s into %s.\n", openSSHHostCertFile, openSSHUserCAFile, openSSHSnippetFile, dir)
	fmt.Fprintf(c.stdout, "Copy the directory to the server (same path), add the lines of %s to its sshd_config (or Include it) and reload sshd.\n", openSSHSnippetFile)
}

// prepareOutDir makes DIR absolute (the snippet names its files by
// absolute path: sshd resolves a relative one against its own working
// directory) and creates it, before anything is registered.
func prepareOutDir(out string) (string, error) {
	dir, err := filepath.Abs(out)
	if err != nil {
		return "", trace.Wrap(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", trace.BadParameter("--out %s: %v", out, err)
	}
	return dir, nil
}

// writeOpenSSHFiles writes the three files. Nothing of them is secret
// (a certificate and public keys), hence 0644: sshd reads them as root,
// and an admin may inspect them as anyone.
func writeOpenSSHFiles(dir string, resp *authapi.OpenSSHNodeResponse) error {
	cert := filepath.Join(dir, openSSHHostCertFile)
	ca := filepath.Join(dir, openSSHUserCAFile)
	snippet := fmt.Sprintf("# Postern: users log in with certificates of the cluster's user CA, as the\n"+
		"# logins the certificate names; the host proves itself with a host certificate.\n"+
		"TrustedUserCAKeys %s\nHostCertificate %s\nAuthorizedPrincipalsFile none\n", ca, cert)
	return trace.Wrap(utils.WriteFilesAtomic([]utils.File{
		{Path: cert, Data: resp.HostCert, Mode: 0o644},
		{Path: ca, Data: []byte(strings.Join(resp.UserCAKeys, "\n") + "\n"), Mode: 0o644},
		{Path: filepath.Join(dir, openSSHSnippetFile), Data: []byte(snippet), Mode: 0o644},
	}))
}

// hostKey returns the host key to certify, in authorized_keys format:
// from --host-key, or fetched from addr. A fetched key is one trusted
// says it vouches for (rotate: the server's current certificate), or
// one the admin confirms after seeing its fingerprint (or --yes).
func (c *cli) hostKey(ctx context.Context, addr string, f openSSHFlags, trusted func(ssh.PublicKey) (ssh.PublicKey, bool)) ([]byte, error) {
	if f.hostKey != "" {
		data, err := os.ReadFile(f.hostKey)
		if err != nil {
			return nil, trace.BadParameter("--host-key: %v", err)
		}
		pub, _, _, _, err := ssh.ParseAuthorizedKey(data)
		if err != nil {
			return nil, trace.BadParameter("--host-key %s: not a public key (want the .pub file, authorized_keys format): %v", f.hostKey, err)
		}
		if _, ok := pub.(*ssh.Certificate); ok {
			return nil, trace.BadParameter("--host-key %s is a certificate: give the plain public key", f.hostKey)
		}
		return ssh.MarshalAuthorizedKey(pub), nil
	}
	if trusted != nil {
		key, err := fetchHostKey(ctx, addr, sshalgo.HostKeyAlgorithms())
		if err == nil {
			if pub, ok := trusted(key); ok {
				fmt.Fprintf(c.stdout, "The server at %s presents a host certificate of this cluster for its key %s %s: reissuing it for that key.\n", addr, pub.Type(), ssh.FingerprintSHA256(pub))
				return ssh.MarshalAuthorizedKey(pub), nil
			}
		}
	}
	key, err := fetchHostKey(ctx, addr, plainHostKeyAlgorithms)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "The server at %s presents the host key %s %s.\n", addr, key.Type(), ssh.FingerprintSHA256(key))
	if f.yes {
		fmt.Fprintln(c.stdout, "Trusting it (--yes).")
		return ssh.MarshalAuthorizedKey(key), nil
	}
	fmt.Fprint(c.stdout, "Compare it with `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` on the server. Is it the server's key? [y/N] ")
	line, err := bufio.NewReader(c.stdin).ReadString('\n')
	if err != nil && line == "" {
		fmt.Fprintln(c.stdout)
		return nil, trace.BadParameter("no answer on stdin: the host key was not confirmed (give it with --host-key, or --yes in scripts)")
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return ssh.MarshalAuthorizedKey(key), nil
	}
	return nil, trace.BadParameter("host key not confirmed: nothing was registered")
}

// plainHostKeyAlgorithms ask for the server's plain host key: a server
// that already has a certificate would otherwise present that (for its
// key, but signed by whoever). Only the kinds whose certificates
// Postern's clients accept (sshalgo.HostKeyAlgorithms), best first.
var plainHostKeyAlgorithms = []string{ssh.KeyAlgoED25519, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256}

// errGotHostKey ends the handshake at the host key: nothing after it
// (logging in) is needed, or wanted.
var errGotHostKey = errors.New("host key received")

// fetchHostKey runs an SSH handshake with addr up to the host key, offering
// algos, and returns the key the server presented.
func fetchHostKey(ctx context.Context, addr string, algos []string) (ssh.PublicKey, error) {
	ctx, cancel := context.WithTimeout(ctx, hostKeyFetchTimeout)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, trace.ConnectionProblem(err, "fetching the host key of %s: %v", addr, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	var got ssh.PublicKey
	_, _, _, err = ssh.NewClientConn(conn, addr, &ssh.ClientConfig{
		User:              "postern-host-key",
		ClientVersion:     "SSH-2.0-Postern-pctl",
		HostKeyAlgorithms: algos,
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			got = key
			return errGotHostKey
		},
	})
	if got != nil {
		return got, nil
	}
	if ctx.Err() != nil {
		return nil, trace.ConnectionProblem(err, "fetching the host key of %s: no SSH answer within %v", addr, hostKeyFetchTimeout)
	}
	return nil, trace.ConnectionProblem(err, "fetching the host key of %s: %v", addr, err)
}

func parseCAKeys(lines []string) ([]ssh.PublicKey, error) {
	var out []ssh.PublicKey
	for _, l := range lines {
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(l))
		if err != nil {
			return nil, trace.BadParameter("invalid host CA key: %v", err)
		}
		out = append(out, k)
	}
	return out, nil
}

// findNode returns the node of cluster named by uuid or, failing that,
// by hostname (case-insensitive), when exactly one has it; openssh asks
// for an OpenSSH node.
func findNode(ctx context.Context, clt *auth.Client, cluster, name string, openssh bool) (services.Node, error) {
	nodes, err := clt.GetNodes(ctx, cluster)
	if err != nil {
		return services.Node{}, trace.Wrap(err)
	}
	var byName []services.Node
	for _, n := range nodes {
		if openssh && !n.IsOpenSSH() {
			continue
		}
		if n.UUID == name {
			return n, nil
		}
		if strings.EqualFold(n.Hostname, name) {
			byName = append(byName, n)
		}
	}
	switch len(byName) {
	case 1:
		return byName[0], nil
	case 0:
		if openssh {
			return services.Node{}, trace.NotFound("no OpenSSH node named %q in cluster %q (pctl nodes ls)", name, cluster)
		}
		return services.Node{}, trace.NotFound("no node %q in cluster %q (pctl nodes ls)", name, cluster)
	}
	ids := make([]string, len(byName))
	for i, n := range byName {
		ids[i] = n.UUID
	}
	return services.Node{}, trace.BadParameter("%d nodes are named %q: name one by its uuid (%s)", len(byName), name, strings.Join(ids, ", "))
}
