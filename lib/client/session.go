package client

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/term"
)

// SessionConfig is one `psh ssh` session on a connected node.
type SessionConfig struct {
	// Command is what to run; empty means a login shell.
	Command []string
	// TTY: nil means a pty when Command is empty and Stdin is a terminal
	// (OpenSSH's default); true forces one (-t), false refuses one (-T).
	TTY *bool
	// AgentSock, when set, is forwarded to the node (-A). Nothing is
	// opened until something on the node uses it.
	AgentSock string
	// EscapeChar, when not 0, is OpenSSH's escape character (~) for a
	// session with a pty: after a newline, ESC . disconnects and ESC ESC
	// sends ESC once.
	EscapeChar byte
	Stdin      *os.File
	Stdout     io.Writer
	Stderr     io.Writer
}

// ExitStatusError carries the remote command's non-zero exit status, which
// psh makes its own.
type ExitStatusError struct {
	Status int
	// Message, when set, is printed (one line, "psh: MESSAGE") before psh
	// exits with Status: why a session ended without an exit status.
	Message string
	// missing: the session ended without an exit status or signal
	// (NodeClient.Explain fills in Message).
	missing bool
}

func (e *ExitStatusError) Error() string { return "remote command exited with a non-zero status" }

// RunSession runs a shell or a command on clt and returns nil for exit
// status 0, *ExitStatusError for another status, or a connection error.
func RunSession(ctx context.Context, clt *ssh.Client, cfg SessionConfig) error {
	sess, err := clt.NewSession()
	if err != nil {
		return trace.ConnectionProblem(err, "opening a session: %v", err)
	}
	defer sess.Close()
	if cfg.AgentSock != "" {
		if err := agent.ForwardToRemote(clt, cfg.AgentSock); err != nil {
			return trace.Wrap(err)
		}
		if err := agent.RequestAgentForwarding(sess); err != nil {
			return trace.Wrap(err, "agent forwarding refused")
		}
	}
	sendLocaleEnv(sess, os.Environ())
	stdinTerm := cfg.Stdin != nil && term.IsTerminal(int(cfg.Stdin.Fd()))
	wantTTY := len(cfg.Command) == 0 && stdinTerm
	if cfg.TTY != nil {
		wantTTY = *cfg.TTY
	}
	sess.Stdout = cfg.Stdout
	// stderr is held back until the command has started: a node that
	// refuses it (a recording it cannot write, a pty it cannot open) says
	// why on stderr, and that reason becomes psh's one-line error instead
	// of x/crypto's "command ... failed".
	errPipe, err := sess.StderrPipe()
	if err != nil {
		return trace.Wrap(err)
	}
	stderr := cfg.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	held := &heldWriter{w: stderr}
	errDone := make(chan struct{})
	go func() {
		defer close(errDone)
		_, _ = io.Copy(held, errPipe)
	}()
	defer func() {
		// The copy ends with the channel: close it first.
		_ = sess.Close()
		<-errDone
	}()
	var escaped atomic.Bool
	if cfg.Stdin != nil {
		sess.Stdin = cfg.Stdin
		if wantTTY && cfg.EscapeChar != 0 {
			sess.Stdin = newEscapeReader(cfg.Stdin, cfg.EscapeChar, func() {
				escaped.Store(true)
				_ = clt.Close()
			})
		}
	}
	if wantTTY {
		restore, err := startPTY(ctx, sess, cfg.Stdin, stdinTerm)
		if err != nil {
			return trace.Wrap(err)
		}
		defer restore()
	}
	if len(cfg.Command) == 0 {
		err = sess.Shell()
	} else {
		err = sess.Start(strings.Join(cfg.Command, " "))
	}
	if err != nil {
		// The node wrote its reason before refusing; closing the
		// session ends the stderr stream once it is read.
		_ = sess.Close()
		waitTimeout(clockwork.NewRealClock(), errDone, stderrWait)
		return &ExitStatusError{Status: 255, Message: refusalMessage(held.held(), err, len(cfg.Command) == 0)}
	}
	held.release()
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	err = sess.Wait()
	if escaped.Load() {
		return &ExitStatusError{Status: 255, Message: "connection closed (~.)"}
	}
	return exitError(err)
}

// refusalMessage is the one line psh prints for a command or shell the
// node refused: the node's reason when it gave one.
func refusalMessage(stderr []byte, err error, shell bool) string {
	var b bannerBuffer
	_ = b.add(string(stderr))
	if msg := b.reason(); msg != "" {
		return msg
	}
	if shell {
		return "the node refused to start a shell"
	}
	return "the node refused to run the command: " + strings.TrimPrefix(err.Error(), "ssh: ")
}

// waitTimeout waits for ch to close, at most d on clock (the real one in
// psh: it bounds how long psh waits for a peer's bytes).
func waitTimeout(clock clockwork.Clock, ch <-chan struct{}, d time.Duration) {
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.Chan():
	}
}

// heldWriter keeps what is written until release, then passes it on and
// everything after it. The held bytes are bounded (maxStderr).
type heldWriter struct {
	mu       sync.Mutex
	w        io.Writer
	buf      []byte
	released bool
}

func (h *heldWriter) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return h.w.Write(p)
	}
	if len(h.buf)+len(p) <= maxStderr {
		h.buf = append(h.buf, p...)
	}
	return len(p), nil
}

func (h *heldWriter) held() []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.buf)
}

// release writes what was held and lets the rest through.
func (h *heldWriter) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.buf) > 0 {
		_, _ = h.w.Write(h.buf)
	}
	h.buf, h.released = nil, true
}

func exitError(err error) error {
	if err == nil {
		return nil
	}
	var exitErr *ssh.ExitError
	if errors.As(err, &exitErr) {
		if exitErr.ExitStatus() == 0 && exitErr.Signal() != "" {
			// Killed by a signal: 128+n is what shells report; without
			// the number at hand, OpenSSH's 255 for "no status".
			return &ExitStatusError{Status: 255, Message: "the remote command was killed by signal " + exitErr.Signal()}
		}
		return &ExitStatusError{Status: exitErr.ExitStatus()}
	}
	var missing *ssh.ExitMissingError
	if errors.As(err, &missing) {
		return &ExitStatusError{Status: 255, missing: true, Message: "the session ended without an exit status"}
	}
	return trace.ConnectionProblem(err, "session ended: %v", err)
}

// startPTY requests a pty sized like the local terminal, puts the local
// terminal in raw mode and forwards window changes (SIGWINCH). The
// returned function restores the terminal and stops the forwarding.
func startPTY(ctx context.Context, sess *ssh.Session, stdin *os.File, isTerm bool) (func(), error) {
	w, h := 80, 24
	if isTerm {
		if cw, ch, err := term.GetSize(int(stdin.Fd())); err == nil {
			w, h = cw, ch
		}
	}
	termName := os.Getenv("TERM")
	if termName == "" {
		termName = "xterm"
	}
	modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 38400, ssh.TTY_OP_OSPEED: 38400}
	if err := sess.RequestPty(termName, h, w, modes); err != nil {
		return nil, trace.Wrap(err, "pty refused")
	}
	if !isTerm {
		return func() {}, nil
	}
	state, err := term.MakeRaw(int(stdin.Fd()))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-winch:
				if cw, ch, err := term.GetSize(int(stdin.Fd())); err == nil {
					_ = sess.WindowChange(ch, cw)
				}
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		cancel()
		<-done
		_ = term.Restore(int(stdin.Fd()), state)
	}, nil
}

// ForwardSpec is an -L or -R spec: [BIND:]PORT:HOST:HOSTPORT.
type ForwardSpec struct {
	BindHost string
	BindPort string
	Host     string
	HostPort string
}

// ParseForwardSpec parses [BIND:]PORT:HOST:HOSTPORT (IPv6 in brackets).
func ParseForwardSpec(s string) (ForwardSpec, error) {
	parts, err := splitForward(s)
	if err != nil {
		return ForwardSpec{}, trace.BadParameter("invalid forward %q: %v (want [BIND:]PORT:HOST:HOSTPORT)", s, err)
	}
	var f ForwardSpec
	switch len(parts) {
	case 3:
		f = ForwardSpec{BindHost: "127.0.0.1", BindPort: parts[0], Host: parts[1], HostPort: parts[2]}
	case 4:
		f = ForwardSpec{BindHost: parts[0], BindPort: parts[1], Host: parts[2], HostPort: parts[3]}
	default:
		return ForwardSpec{}, trace.BadParameter("invalid forward %q: want [BIND:]PORT:HOST:HOSTPORT", s)
	}
	if f.BindHost == "" || f.BindHost == "localhost" {
		f.BindHost = "127.0.0.1"
	}
	if f.BindHost == "*" {
		f.BindHost = ""
	}
	if f.Host == "" || f.BindPort == "" || f.HostPort == "" {
		return ForwardSpec{}, trace.BadParameter("invalid forward %q: want [BIND:]PORT:HOST:HOSTPORT", s)
	}
	return f, nil
}

func splitForward(s string) ([]string, error) {
	var parts []string
	for len(s) > 0 {
		if s[0] == '[' {
			end := strings.IndexByte(s, ']')
			if end < 0 {
				return nil, errors.New("unclosed [")
			}
			parts = append(parts, s[1:end])
			s = s[end+1:]
			if s != "" && s[0] != ':' {
				return nil, errors.New("expected : after ]")
			}
			s = strings.TrimPrefix(s, ":")
			continue
		}
		i := strings.IndexByte(s, ':')
		if i < 0 {
			parts = append(parts, s)
			break
		}
		parts = append(parts, s[:i])
		s = s[i+1:]
	}
	return parts, nil
}

func (f ForwardSpec) bind() string   { return net.JoinHostPort(f.BindHost, f.BindPort) }
func (f ForwardSpec) target() string { return net.JoinHostPort(f.Host, f.HostPort) }
