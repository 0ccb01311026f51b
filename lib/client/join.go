package client

import (
	"context"
	"io"
	"os"
	"sort"
	"sync"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"
	"golang.org/x/term"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/api/sessionapi"
	"github.com/postern-dev/postern/lib/proxy"
)

// SessionEntry is a live session the user may join, as `psh sessions ls`
// shows it: the node's answer plus how to reach that node again.
type SessionEntry struct {
	sessionapi.Info
	// NodeUUID and Cluster route a join to the node that holds it.
	NodeUUID string `json:"node_uuid"`
	Cluster  string `json:"cluster,omitempty"`
	// login is the login the node was reached with.
	login string
}

// listParallel bounds the nodes asked at once.
const listParallel = 8

// ListSessions asks every node the user may reach which of its live
// sessions the user may join (each node's `sessions` subsystem, which
// answers from the user's own certificate roles). It asks the nodes
// rather than a central list so that a node behind a tunnel or another
// proxy answers through the same route as any dial, and so that what a
// user sees is decided by the node that holds the session. A node that
// cannot be reached or does not serve the subsystem (an OpenSSH node)
// has no joinable sessions.
func ListSessions(ctx context.Context, creds *Credentials, cluster string) ([]SessionEntry, error) {
	nodes, err := ListNodes(ctx, creds, cluster)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var (
		mu  sync.Mutex
		out []SessionEntry
		wg  sync.WaitGroup
	)
	sem := make(chan struct{}, listParallel)
	for _, n := range nodes {
		if len(n.Logins) == 0 {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(n proxyapi.NodeEntry) {
			defer wg.Done()
			defer func() { <-sem }()
			got, err := nodeSessions(ctx, creds, n)
			if err != nil {
				return
			}
			mu.Lock()
			out = append(out, got...)
			mu.Unlock()
		}(n)
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out, nil
}

func nodeTarget(n proxyapi.NodeEntry) proxy.Target {
	return proxy.Target{Host: n.UUID, Cluster: n.Cluster}
}

func nodeSessions(ctx context.Context, creds *Credentials, n proxyapi.NodeEntry) ([]SessionEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, DialTimeout*2)
	defer cancel()
	nc, err := DialNode(ctx, creds, ClusterTarget(nodeTarget(n)), n.Logins[0], KeepAliveConfig{})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	defer nc.Close()
	infos, err := sessionapi.List(nc.Client, n.Hostname)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	entries := make([]SessionEntry, 0, len(infos))
	for _, i := range infos {
		entries = append(entries, SessionEntry{Info: i, NodeUUID: n.UUID, Cluster: n.Cluster, login: n.Logins[0]})
	}
	return entries, nil
}

// JoinConfig is one `psh join`.
type JoinConfig struct {
	SessionID string
	Mode      sessionapi.Mode
	Cluster   string
	Stdin     *os.File
	Stdout    io.Writer
	Stderr    io.Writer
}

// JoinEscape is psh join's escape character, Ctrl-]: `Ctrl-] .` leaves,
// `Ctrl-] t` ends the session for everyone (a moderator's), Ctrl-]
// twice sends one. Not ~ as in psh ssh: a joiner types into someone
// else's shell, where a line starting with ~ must go through untouched.
const JoinEscape = 0x1d

// JoinSession finds the node holding the session (see ListSessions: a
// session the user may not join is not found, like one that does not
// exist) and joins it in the terminal.
func JoinSession(ctx context.Context, creds *Credentials, cfg JoinConfig) error {
	id, err := sessionapi.ParseSessionID(cfg.SessionID)
	if err != nil {
		return trace.Wrap(err)
	}
	if _, err := sessionapi.ParseMode(string(cfg.Mode)); err != nil {
		return trace.Wrap(err)
	}
	all, err := ListSessions(ctx, creds, cfg.Cluster)
	if err != nil {
		return trace.Wrap(err)
	}
	var found *SessionEntry
	for i := range all {
		if all[i].ID == id {
			found = &all[i]
		}
	}
	if found == nil {
		return trace.NotFound("session %v not found", id)
	}
	nc, err := DialNode(ctx, creds, ClusterTarget(proxy.Target{Host: found.NodeUUID, Cluster: found.Cluster}), found.login, KeepAliveConfig{})
	if err != nil {
		return trace.Wrap(err)
	}
	defer nc.Close()
	sess, err := nc.Client.NewSession()
	if err != nil {
		return trace.Wrap(err)
	}
	defer sess.Close()
	stdin, err := sess.StdinPipe()
	if err != nil {
		return trace.Wrap(err)
	}
	stdout, err := sess.StdoutPipe()
	if err != nil {
		return trace.Wrap(err)
	}
	stderr, err := sess.StderrPipe()
	if err != nil {
		return trace.Wrap(err)
	}
	isTerm := cfg.Stdin != nil && term.IsTerminal(int(cfg.Stdin.Fd()))
	restore, err := startPTY(ctx, sess, cfg.Stdin, isTerm)
	if err != nil {
		return trace.Wrap(err)
	}
	defer restore()
	if err := sess.RequestSubsystem(sessionapi.JoinSubsystem(id, cfg.Mode)); err != nil {
		msg, _ := io.ReadAll(io.LimitReader(stderr, 4096))
		if len(msg) > 0 {
			return trace.BadParameter("%s", trimNodeMessage(msg))
		}
		return trace.NotFound("session %v not found", id)
	}
	errDone := make(chan struct{})
	go func() {
		defer close(errDone)
		_, _ = io.Copy(cfg.Stderr, stderr)
	}()
	if cfg.Stdin != nil {
		go func() {
			_, _ = io.Copy(stdin, &joinEscapeReader{r: cfg.Stdin, onLeave: func() { _ = sess.Close() }, onEnd: func() {
				_ = sess.Signal(ssh.SIGHUP)
			}})
		}()
	}
	stop := context.AfterFunc(ctx, func() { _ = sess.Close() })
	defer stop()
	_, _ = io.Copy(cfg.Stdout, stdout)
	_ = sess.Close()
	<-errDone
	return nil
}

// trimNodeMessage is the node's one-line refusal without its "postern: "
// prefix and line end.
func trimNodeMessage(b []byte) string {
	s := string(b)
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r') {
		s = s[:len(s)-1]
	}
	if len(s) > 9 && s[:9] == "postern: " {
		s = s[9:]
	}
	return s
}

// joinEscapeReader passes the joiner's keystrokes on, acting on JoinEscape
// sequences: `.` leaves (onLeave), `t` ends the session (onEnd), the
// escape twice sends one; anything else after it is sent with it.
type joinEscapeReader struct {
	r       io.Reader
	onLeave func()
	onEnd   func()
	pending bool
	left    bool
}

func (e *joinEscapeReader) Read(p []byte) (int, error) {
	if e.left {
		return 0, io.EOF
	}
	// Half of p: an escape and the byte after it may both be sent.
	buf := make([]byte, max(1, len(p)/2))
	for {
		n, err := e.r.Read(buf)
		out := p[:0]
		for _, b := range buf[:n] {
			if e.pending {
				e.pending = false
				switch b {
				case '.':
					e.left = true
					e.onLeave()
					return len(out), nil
				case 't':
					e.onEnd()
					continue
				case JoinEscape:
					out = append(out, JoinEscape)
					continue
				default:
					out = append(out, JoinEscape)
				}
			} else if b == JoinEscape {
				e.pending = true
				continue
			}
			out = append(out, b)
		}
		if len(out) > 0 || err != nil {
			return len(out), err
		}
	}
}
