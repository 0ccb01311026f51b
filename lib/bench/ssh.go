package bench

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/client"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/sshalgo"
)

// Phase names, in the order an SSH session through the proxy passes them.
// Each ends at a point the x/crypto client exposes:
//   - tcp: the TCP connect to the proxy;
//   - proxy_kex: version exchange and key exchange with the proxy, until
//     its host certificate is checked (HostKeyCallback);
//   - proxy_auth: NEWKEYS, service request and certificate authentication,
//     until NewClientConn returns;
//   - route_dial: the session channel, the proxy:HOST subsystem request,
//     the proxy's routing and its dial of the node, until the node's first
//     byte (its version line) arrives through the channel;
//   - node_kex, node_auth: the same two steps with the node, inside the
//     channel;
//   - channel_open: the session channel on the node;
//   - first_byte: with a command, from its exec request to the first byte
//     of output (or its exit, if it prints nothing).
//
// "queue", the wait for a concurrency slot, comes first (the engine's).
const (
	PhaseTCP         = "tcp"
	PhaseProxyKex    = "proxy_kex"
	PhaseProxyAuth   = "proxy_auth"
	PhaseRouteDial   = "route_dial"
	PhaseNodeKex     = "node_kex"
	PhaseNodeAuth    = "node_auth"
	PhaseChannelOpen = "channel_open"
	PhaseFirstByte   = "first_byte"
)

// SSHConfig configures SSHSession.
type SSHConfig struct {
	// Credentials are psh's (key, certificate, host CA check). Required.
	Credentials *client.Credentials
	// Target is the node. Required.
	Target proxy.Target
	// Login is the OS login on the node. Required.
	Login string
	// Command, when set, is run and timed to its first byte of output.
	Command string
	// Sources are local addresses to dial from, in turn (the proxy caps
	// new connections per source address). Empty means the system's
	// choice.
	Sources []net.IP
	// Timeout bounds one session's setup. Zero means client.DialTimeout.
	Timeout time.Duration
	// Jump reaches the node the way `ssh -J` does, through a direct-tcpip
	// channel, instead of psh's proxy:HOST subsystem: the proxy then holds
	// an ssh -J session (no session channel of its own).
	Jump bool
}

// CheckAndSetDefaults validates the config.
func (c *SSHConfig) CheckAndSetDefaults() error {
	switch {
	case c.Credentials == nil:
		return trace.BadParameter("bench: missing Credentials")
	case c.Target.Host == "":
		return trace.BadParameter("bench: missing target host")
	case c.Login == "":
		return trace.BadParameter("no login: name one as LOGIN@HOST (the certificate names no default principal)")
	}
	if c.Timeout <= 0 {
		c.Timeout = client.DialTimeout
	}
	return nil
}

// SSHSession returns the Session of an SSH connection to a node through
// the proxy, made the way psh makes it (the proxy:HOST subsystem, then an
// SSH client inside the channel), with every phase recorded.
func SSHSession(cfg SSHConfig) (Session, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	var next atomic.Uint64
	return func(ctx context.Context, rec *Recorder) (io.Closer, error) {
		ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
		var src net.IP
		if len(cfg.Sources) > 0 {
			src = cfg.Sources[next.Add(1)%uint64(len(cfg.Sources))]
		}
		return dialSSH(ctx, cfg, src, rec)
	}, nil
}

// sshSession is an open benchmark session; Close ends both connections.
type sshSession struct {
	node, proxy *ssh.Client
}

func (s *sshSession) Close() error {
	var err error
	if s.node != nil {
		err = s.node.Close()
	}
	if perr := s.proxy.Close(); err == nil {
		err = perr
	}
	return err
}

// clientConfig offers what psh offers (sshalgo's defaults), so that
// the handshake measured is the one users get.
func (c *SSHConfig) clientConfig(login string, rec *Recorder, phase string) *ssh.ClientConfig {
	return sshalgo.Lists{}.ClientConfig(&ssh.ClientConfig{
		User: login,
		Auth: []ssh.AuthMethod{ssh.PublicKeys(c.Credentials.Signer)},
		HostKeyCallback: func(host string, remote net.Addr, key ssh.PublicKey) error {
			rec.Mark(phase)
			return c.Credentials.HostKeyCallback(host, remote, key)
		},
	})
}

func dialSSH(ctx context.Context, cfg SSHConfig, src net.IP, rec *Recorder) (io.Closer, error) {
	addr := cfg.Credentials.Profile.ProxySSH
	d := net.Dialer{}
	if src != nil {
		d.LocalAddr = &net.TCPAddr{IP: src}
	}
	tcp, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, trace.ConnectionProblem(err, "cannot reach the proxy at %s: %v", addr, err)
	}
	rec.Mark(PhaseTCP)
	// Ends a handshake that ctx's deadline overtakes.
	stop := context.AfterFunc(ctx, func() { tcp.Close() })
	defer stop()
	// The proxy checks the certificate, not the login: any principal does.
	sconn, chans, reqs, err := ssh.NewClientConn(tcp, addr, cfg.clientConfig(cfg.Login, rec, PhaseProxyKex))
	if err != nil {
		tcp.Close()
		return nil, trace.ConnectionProblem(err, "the proxy at %s: %v", addr, ctxErr(ctx, err))
	}
	rec.Mark(PhaseProxyAuth)
	sess := &sshSession{proxy: ssh.NewClient(sconn, chans, reqs)}
	fail := func(err error) (io.Closer, error) {
		sess.Close()
		return nil, err
	}
	port := cfg.Target.Port
	if port == "" || port == "0" {
		port = "22" // the router's "any port"
	}
	nodeAddr := net.JoinHostPort(cfg.Target.Host, port)
	var ch ssh.Channel
	explain := func() string { return "" }
	if cfg.Jump {
		ch, err = openDirectTCPIP(sess.proxy, cfg.Target.Host, port)
		if err != nil {
			return fail(err)
		}
	} else {
		sub, err := client.OpenSubsystem(ctx, sess.proxy, client.SubsystemConfig{Name: cfg.Target.SubsystemString()})
		if err != nil {
			return fail(trace.Wrap(err))
		}
		ch, explain = sub, sub.Explain
	}
	conn := &firstByteConn{Channel: ch, local: tcp.LocalAddr(), remote: tcp.RemoteAddr(), onFirst: func() { rec.Mark(PhaseRouteDial) }}
	nconn, nchans, nreqs, err := ssh.NewClientConn(conn, nodeAddr, cfg.clientConfig(cfg.Login, rec, PhaseNodeKex))
	if err != nil {
		// The proxy ends the channel when it cannot route; its reason
		// (not found, ambiguous) is on stderr.
		if msg := explain(); msg != "" {
			return fail(trace.BadParameter("%s", msg))
		}
		return fail(trace.ConnectionProblem(err, "node %s: %v", cfg.Target.Host, ctxErr(ctx, err)))
	}
	rec.Mark(PhaseNodeAuth)
	sess.node = ssh.NewClient(nconn, nchans, nreqs)
	s, err := sess.node.NewSession()
	if err != nil {
		return fail(trace.ConnectionProblem(err, "node %s refused a session: %v", cfg.Target.Host, err))
	}
	rec.Mark(PhaseChannelOpen)
	if cfg.Command == "" {
		return sess, nil
	}
	out := &firstWrite{done: make(chan struct{})}
	s.Stdout, s.Stderr = out, out
	if err := s.Start(cfg.Command); err != nil {
		return fail(trace.ConnectionProblem(err, "node %s: starting %q: %v", cfg.Target.Host, cfg.Command, err))
	}
	waited := make(chan error, 1)
	go func() { waited <- s.Wait() }()
	select {
	case <-out.done:
	case err := <-waited:
		// Exited without output: the exit is its answer.
		if err != nil {
			return fail(trace.BadParameter("node %s: %q failed: %v", cfg.Target.Host, cfg.Command, err))
		}
		waited <- nil
	case <-ctx.Done():
		return fail(trace.ConnectionProblem(ctx.Err(), "node %s: no output from %q: %v", cfg.Target.Host, cfg.Command, ctx.Err()))
	}
	rec.Mark(PhaseFirstByte)
	return closerFunc(func() error {
		err := sess.Close()
		<-waited
		return err
	}), nil
}

// openDirectTCPIP opens the channel `ssh -J` opens. The proxy routes (or
// refuses) before it answers, so a refusal's message is the reason (not
// found, ambiguous, denied).
func openDirectTCPIP(c *ssh.Client, host, port string) (ssh.Channel, error) {
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, trace.BadParameter("port %q is not a number", port)
	}
	payload := ssh.Marshal(struct {
		Host       string
		Port       uint32
		OriginHost string
		OriginPort uint32
	}{host, uint32(p), "127.0.0.1", 0})
	ch, reqs, err := c.OpenChannel("direct-tcpip", payload)
	if err != nil {
		var oe *ssh.OpenChannelError
		if errors.As(err, &oe) {
			return nil, trace.BadParameter("%s", oe.Message)
		}
		return nil, trace.ConnectionProblem(err, "direct-tcpip to %s: %v", host, err)
	}
	go ssh.DiscardRequests(reqs)
	return ch, nil
}

// ctxErr prefers the context's reason (timeout) over the closed conn's.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// firstWrite closes done at the first byte written to it.
type firstWrite struct {
	once sync.Once
	done chan struct{}
}

func (w *firstWrite) Write(p []byte) (int, error) {
	if len(p) > 0 {
		w.once.Do(func() { close(w.done) })
	}
	return len(p), nil
}

// firstByteConn is the proxy channel as a net.Conn for the node's SSH
// client; onFirst runs when the node's first byte arrives. Deadlines are
// not supported (the SSH client does not use them).
type firstByteConn struct {
	ssh.Channel
	local, remote net.Addr
	onFirst       func()
	seen          atomic.Bool
	closeOnce     sync.Once
}

func (c *firstByteConn) Read(p []byte) (int, error) {
	n, err := c.Channel.Read(p)
	if n > 0 && !c.seen.Swap(true) {
		c.onFirst()
	}
	return n, err
}

func (c *firstByteConn) Close() error {
	err := errors.New("closed")
	c.closeOnce.Do(func() { err = c.Channel.Close() })
	return err
}
func (c *firstByteConn) LocalAddr() net.Addr              { return c.local }
func (c *firstByteConn) RemoteAddr() net.Addr             { return c.remote }
func (c *firstByteConn) SetDeadline(time.Time) error      { return nil }
func (c *firstByteConn) SetReadDeadline(time.Time) error  { return nil }
func (c *firstByteConn) SetWriteDeadline(time.Time) error { return nil }
