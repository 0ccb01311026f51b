package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/sshalgo"
	"github.com/postern-dev/postern/lib/utils"
)

// DialTimeout bounds the TCP connect and SSH handshake with the proxy.
const DialTimeout = 30 * time.Second

// stderrWait bounds how long psh waits for the proxy's explanation of a
// refused subsystem (it is sent before the refusal, so it is normally
// already there).
const stderrWait = 5 * time.Second

// clientConfig offers sshalgo's defaults (psh has no config file: the
// servers' lists are widened, if ever, for other clients) and asks for
// host certificates only, which is all HostKeyCallback accepts.
// Banners the server sends are kept in banner: a refused authentication
// carries its reason there (a locked user, a login the roles do not
// allow), as SSH has no other place for it.
func (c *Credentials) clientConfig(login string, banner *bannerBuffer) *ssh.ClientConfig {
	return sshalgo.Lists{}.ClientConfig(&ssh.ClientConfig{
		User:            login,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(c.Signer)},
		HostKeyCallback: c.HostKeyCallback,
		BannerCallback:  banner.add,
		Timeout:         DialTimeout,
	})
}

// bannerBuffer collects the SSH_MSG_USERAUTH_BANNERs of one handshake.
type bannerBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

// maxBanner bounds what a server can make psh keep.
const maxBanner = 4 << 10

func (b *bannerBuffer) add(msg string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len()+len(msg) <= maxBanner {
		b.buf.WriteString(msg)
	}
	return nil
}

// reason is the banners as one line for an error: the server's
// "postern: " prefix dropped, control characters (a hostile server's
// terminal escapes) replaced.
func (b *bannerBuffer) reason() string {
	b.mu.Lock()
	msg := b.buf.String()
	b.mu.Unlock()
	msg = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == '\t' {
			return ' '
		}
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return -1
		}
		return r
	}, msg)
	msg = strings.Join(strings.Fields(msg), " ")
	return strings.TrimPrefix(msg, "postern: ")
}

// DefaultLogin is the login psh presents when the user names none: the
// certificate's first principal.
func (c *Credentials) DefaultLogin() string {
	if len(c.Cert.ValidPrincipals) == 0 {
		return ""
	}
	return c.Cert.ValidPrincipals[0]
}

// DialProxy connects to the proxy's SSH port with the certificate and
// checks the proxy's host certificate against the host CA.
func DialProxy(ctx context.Context, creds *Credentials) (*ssh.Client, error) {
	addr := creds.Profile.ProxySSH
	d := net.Dialer{Timeout: DialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, trace.ConnectionProblem(err, "cannot reach the proxy at %s: %v", addr, rootCause(err))
	}
	// The login presented to the proxy does not matter (the proxy checks
	// the certificate, not the login); use the default one.
	var banner bannerBuffer
	cfg := creds.clientConfig(creds.DefaultLogin(), &banner)
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	sconn, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		conn.Close()
		return nil, handshakeError("the proxy at "+addr, err, banner.reason())
	}
	return ssh.NewClient(sconn, chans, reqs), nil
}

// handshakeError explains a failed handshake; banner is the reason the
// server gave, if any, which says more than psh can guess.
func handshakeError(what string, err error, banner string) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "unable to authenticate") && banner != "":
		return trace.AccessDenied("%s refused the login: %s", what, banner)
	case strings.Contains(msg, "unable to authenticate"):
		return trace.AccessDenied("%s refused the certificate: run `psh login` again", what)
	case strings.Contains(msg, "host key") || strings.Contains(msg, "certificate") || strings.Contains(msg, "principal"):
		return trace.AccessDenied("%s could not be verified against the cluster's host CA: %s", what, oneLine(err))
	}
	return trace.ConnectionProblem(err, "%s: %s", what, oneLine(err))
}

// Subsystem is an accepted subsystem channel on the proxy. The proxy
// explains a refusal on stderr and then ends the channel (it accepts the
// request first, because OpenSSH would not print stderr after a refused
// one), so stderr is captured for Explain.
//
// Its two goroutines (the channel's request loop and the stderr reader)
// end when the channel does: Close it, or the proxy connection.
type Subsystem struct {
	ssh.Channel
	clock clockwork.Clock
	// stderrDone is closed when the stderr stream has ended; reqsDone
	// when the channel's requests have (the channel is closed).
	stderrDone, reqsDone chan struct{}
	// exitStatus is the proxy's exit-status for the channel; -1 if none.
	exitStatus atomic.Int64
	// mu guards stderr.
	mu     sync.Mutex
	stderr bytes.Buffer
}

// maxStderr bounds the captured stderr: an ambiguous-host candidate list
// for a few hundred nodes fits.
const maxStderr = 64 << 10

// SubsystemConfig names the subsystem OpenSubsystem requests.
type SubsystemConfig struct {
	// Name is the subsystem, e.g. "proxy:HOST:PORT" or "nodes" (required).
	Name string
	// Tee, when set, also receives the proxy's stderr as it arrives.
	Tee io.Writer
	// Deps: Clock times the short waits of Explain and ExitStatus.
	observe.Deps
}

// CheckAndSetDefaults checks the name and fills in the clock.
func (c *SubsystemConfig) CheckAndSetDefaults() error {
	if c.Name == "" {
		return trace.BadParameter("missing subsystem name")
	}
	c.Deps.SetDefaults(observe.ComponentClient)
	return nil
}

// OpenSubsystem opens a session channel on the proxy and requests
// cfg.Name. A refusal is an error carrying what the proxy wrote on stderr
// (for an ambiguous host, the candidate list). Stderr of an accepted
// subsystem is captured (first 64 KiB) and, when cfg.Tee is set, also
// copied there.
//
// When ctx ends before the subsystem is open, proxyClient is closed:
// x/crypto has no way to abandon a channel open or a request the peer has
// not answered, and every caller dials the proxy for this one channel.
func OpenSubsystem(ctx context.Context, proxyClient *ssh.Client, cfg SubsystemConfig) (*Subsystem, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := ctx.Err(); err != nil {
		return nil, trace.ConnectionProblem(err, "opening %s on the proxy: %v", cfg.Name, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = proxyClient.Close() })
	defer stop()
	sub, err := openSubsystem(proxyClient, cfg)
	// stop reports false when ctx ended meanwhile: the proxy connection
	// is closed (or closing), whatever openSubsystem saw.
	if !stop() {
		if sub != nil {
			_ = sub.Close()
		}
		return nil, trace.ConnectionProblem(ctx.Err(), "opening %s on the proxy: %v", cfg.Name, ctx.Err())
	}
	return sub, trace.Wrap(err)
}

func openSubsystem(proxyClient *ssh.Client, cfg SubsystemConfig) (*Subsystem, error) {
	ch, reqs, err := proxyClient.OpenChannel("session", nil)
	if err != nil {
		return nil, trace.ConnectionProblem(err, "proxy refused a session: %v", err)
	}
	sub := &Subsystem{Channel: ch, clock: cfg.Clock, stderrDone: make(chan struct{}), reqsDone: make(chan struct{})}
	sub.exitStatus.Store(-1)
	go func() {
		defer close(sub.reqsDone)
		for req := range reqs {
			var st struct{ Status uint32 }
			if req.Type == "exit-status" && ssh.Unmarshal(req.Payload, &st) == nil {
				sub.exitStatus.Store(int64(st.Status))
			}
			if req.WantReply {
				_ = req.Reply(false, nil)
			}
		}
	}()
	go func() {
		defer close(sub.stderrDone)
		buf := make([]byte, 4096)
		for {
			n, err := ch.Stderr().Read(buf)
			if n > 0 {
				sub.mu.Lock()
				if sub.stderr.Len() < maxStderr {
					sub.stderr.Write(buf[:n])
				}
				sub.mu.Unlock()
				if cfg.Tee != nil {
					_, _ = cfg.Tee.Write(buf[:n])
				}
			}
			if err != nil {
				return
			}
		}
	}()
	ok, err := ch.SendRequest("subsystem", true, ssh.Marshal(struct{ Name string }{cfg.Name}))
	if err != nil {
		ch.Close()
		return nil, trace.ConnectionProblem(err, "proxy connection lost: %v", err)
	}
	if !ok {
		ch.Close()
		if msg := sub.Explain(); msg != "" {
			return nil, trace.BadParameter("%s", msg)
		}
		return nil, trace.BadParameter("the proxy refused %s", cfg.Name)
	}
	return sub, nil
}

// waitClosed waits for the subsystem's goroutines, which end once the
// channel is closed by both sides or the proxy connection is: call it after
// closing the proxy connection.
func (s *Subsystem) waitClosed() {
	<-s.reqsDone
	<-s.stderrDone
}

// closeWith closes the subsystem and proxyClient, the connection it runs
// on, and waits for the subsystem's goroutines.
func (s *Subsystem) closeWith(proxyClient *ssh.Client) {
	_ = s.Close()
	_ = proxyClient.Close()
	s.waitClosed()
}

// Explain waits (briefly) for the stderr stream to end and returns what
// the proxy wrote there, trimmed; "" when it wrote nothing. Call it when
// the stream ended early: the reason is there.
func (s *Subsystem) Explain() string {
	timer := s.clock.NewTimer(stderrWait)
	defer timer.Stop()
	select {
	case <-s.stderrDone:
	case <-timer.Chan():
	}
	s.mu.Lock()
	msg := s.stderr.String()
	s.mu.Unlock()
	msg = strings.TrimSpace(strings.ReplaceAll(msg, "\r\n", "\n"))
	return strings.TrimPrefix(msg, "postern: ")
}

// ExitStatus waits (briefly) for the channel to close and returns the
// exit status the proxy sent for it: 0 for a subsystem that ended well,
// 1 for one it refused or that failed; -1 when none came.
func (s *Subsystem) ExitStatus() int {
	timer := s.clock.NewTimer(stderrWait)
	defer timer.Stop()
	select {
	case <-s.reqsDone:
	case <-timer.Chan():
	}
	return int(s.exitStatus.Load())
}

// NodeClient is an SSH client to a node through the proxy. Both SSH
// connections (to the proxy, and to the node inside it) are kept alive
// with keepalive@openssh.com probes.
type NodeClient struct {
	*ssh.Client
	proxy *ssh.Client
	// host is the node as the user named it.
	host              string
	kaNode, kaProxy   *utils.SSHKeepAlive
	clock             clockwork.Clock
	nodeDone, pxyDone chan struct{}
	// sub is the proxy:TARGET channel the node connection runs in.
	sub *Subsystem
}

// Close closes the node connection, then the proxy connection, and waits
// for the goroutines watching them, which end with the connections.
func (c *NodeClient) Close() error {
	err := c.Client.Close()
	if perr := c.proxy.Close(); err == nil {
		err = perr
	}
	c.kaNode.Close()
	c.kaProxy.Close()
	c.sub.waitClosed()
	<-c.nodeDone
	<-c.pxyDone
	return err
}

// lostWait bounds how long Explain waits for a connection whose session
// just ended without an exit status to report itself closed.
const lostWait = 2 * time.Second

// Explain turns the end of a session into what the user is told: a
// session that ended without an exit status (psh exits 255, as OpenSSH
// does) gets a one-line reason, the keep-alive's when it gave up, or which
// connection was lost.
func (c *NodeClient) Explain(err error) error {
	if err == nil {
		return nil
	}
	var exit *ExitStatusError
	if errors.As(err, &exit) && !exit.missing {
		return err
	}
	if exit == nil {
		// Another end (the connection broke mid-request): only a
		// keep-alive's verdict says more than the error itself.
		cause := c.kaProxy.Err()
		if cause == nil {
			cause = c.kaNode.Err()
		}
		if cause == nil {
			return err
		}
		return &ExitStatusError{Status: 255, Message: cause.Error()}
	}
	timer := c.clock.NewTimer(lostWait)
	defer timer.Stop()
	select {
	case <-c.nodeDone:
	case <-c.pxyDone:
	case <-timer.Chan():
	}
	switch {
	case c.kaProxy.Err() != nil:
		exit.Message = c.kaProxy.Err().Error()
	case c.kaNode.Err() != nil:
		exit.Message = c.kaNode.Err().Error()
	case isDone(c.pxyDone):
		exit.Message = "connection to the proxy lost"
	case isDone(c.nodeDone):
		exit.Message = fmt.Sprintf("connection to %s lost: the node or the proxy closed it", c.host)
	default:
		exit.Message = fmt.Sprintf("%s ended the session without an exit status", c.host)
	}
	return exit
}

func isDone(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitDone returns a channel closed when clt's connection has ended.
// The goroutine ends with the connection (Close ends it).
func waitDone(clt *ssh.Client) chan struct{} {
	ch := make(chan struct{})
	go func() {
		_ = clt.Wait()
		close(ch)
	}()
	return ch
}

// KeepAliveConfig configures psh's keep-alives on the proxy and node
// connections (zero: every 10s, given up after 3 unanswered).
type KeepAliveConfig = utils.SSHKeepAliveConfig

// DialNode dials the proxy, opens `proxy:TARGET` and runs an SSH client
// over it as login. The node's host certificate must be signed by the host
// CA and name target.Host (hostnames, UUIDs, HOST.CLUSTER and IPs are all
// among a node's principals). ka configures the keep-alives of both
// connections (zero: the defaults).
func DialNode(ctx context.Context, creds *Credentials, target proxy.Target, login string, ka KeepAliveConfig) (*NodeClient, error) {
	ka.CheckAndSetDefaults()
	pc, err := DialProxy(ctx, creds)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	ch, err := OpenSubsystem(ctx, pc, SubsystemConfig{Name: target.SubsystemString(), Deps: observe.Deps{Clock: ka.Clock}})
	if err != nil {
		pc.Close()
		return nil, trace.Wrap(err)
	}
	port := target.Port
	if port == "" || port == "0" {
		port = "22"
	}
	// A leaf's node is checked as HOST.LEAF, the only names the leaf's
	// host CA vouches for.
	addr := net.JoinHostPort(creds.HostKeyName(target), port)
	conn := &channelConn{Channel: ch, local: pc.LocalAddr(), remote: pc.RemoteAddr()}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	var banner bannerBuffer
	sconn, chans, reqs, err := ssh.NewClientConn(conn, addr, creds.clientConfig(login, &banner))
	if err != nil {
		conn.Close()
		// The proxy ends the channel when it cannot route; its reason
		// (not found, ambiguous with the candidates) is on stderr.
		msg := ch.Explain()
		ch.closeWith(pc)
		if msg != "" {
			return nil, trace.BadParameter("%s", msg)
		}
		if leaf := creds.leafOf(target); leaf != "" && !slices.Contains(creds.Profile.Clusters, leaf) {
			return nil, trace.AccessDenied("node %s of cluster %q could not be verified: your login holds no host CA for that cluster (added since you logged in?): run `psh login` again", target.Host, leaf)
		}
		return nil, handshakeError("node "+target.Host, err, banner.reason())
	}
	nc := &NodeClient{Client: ssh.NewClient(sconn, chans, reqs), proxy: pc, host: target.Host, clock: ka.Clock, sub: ch}
	nc.nodeDone, nc.pxyDone = waitDone(nc.Client), waitDone(pc)
	nc.kaProxy = utils.StartSSHKeepAlive(pc, "the proxy at "+creds.Profile.ProxySSH, ka)
	nc.kaNode = utils.StartSSHKeepAlive(nc.Client, target.Host, ka)
	return nc, nil
}

// leafOf is the leaf cluster target names, by --cluster or as HOST.LEAF
// of a leaf in the profile; "" for the proxy's own cluster.
func (c *Credentials) leafOf(target proxy.Target) string {
	if target.Cluster != "" {
		if strings.EqualFold(target.Cluster, c.Profile.Cluster) {
			return ""
		}
		return target.Cluster
	}
	for _, leaf := range c.Profile.Clusters {
		if authz.HasClusterSuffix(target.Host, leaf) {
			return leaf
		}
	}
	return ""
}

// ClusterTarget writes a target with a cluster as the proxy best routes
// it: HOST.CLUSTER with that same cluster (what `psh config`'s
// ProxyCommand sends, %h being HOST.CLUSTER) becomes HOST in CLUSTER.
func ClusterTarget(t proxy.Target) proxy.Target {
	if authz.HasClusterSuffix(t.Host, t.Cluster) {
		t.Host = t.Host[:len(t.Host)-len(t.Cluster)-1]
	}
	return t
}

// channelConn makes an SSH channel a net.Conn for ssh.NewClientConn.
// Deadlines are not supported (the SSH client does not use them).
type channelConn struct {
	ssh.Channel
	local, remote net.Addr
	closeOnce     sync.Once
}

func (c *channelConn) Close() error {
	var err error
	c.closeOnce.Do(func() { err = c.Channel.Close() })
	return err
}
func (c *channelConn) LocalAddr() net.Addr                { return c.local }
func (c *channelConn) RemoteAddr() net.Addr               { return c.remote }
func (c *channelConn) SetDeadline(t time.Time) error      { return nil }
func (c *channelConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *channelConn) SetWriteDeadline(t time.Time) error { return nil }
