package srv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	oteltrace "go.opentelemetry.io/otel/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// keepAliveRequest is OpenSSH's client-alive probe. Any answer, even a
// failure ("unknown request"), proves the peer is alive.
const keepAliveRequest = "keepalive@openssh.com"

// authKey is the ssh.Permissions.ExtraData key of the authResult.
type authKey struct{}

// authResult is what authentication decided, handed from the public key
// callback to the connection.
type authResult struct {
	id      *authz.Identity
	permits Permits
	node    services.Node
	// signedBy is the CA key that signed a root cluster user's
	// certificate (nil for this cluster's users): the trust sweep ends the
	// connection once this cluster no longer trusts it (trust.go).
	signedBy ssh.PublicKey
}

// errDenied is what the client sees for any refused authentication; the
// reason is logged only, so that a client cannot probe which part failed.
var errDenied = errors.New("access denied")

// MsgAuthUnavailable is the banner sent when the server cannot check a
// certificate because auth (or its backend) does not answer. Without it
// OpenSSH would print only "Permission denied (publickey)", and a user
// with a perfectly valid certificate would look for the fault in their
// key. It says nothing about the certificate, so it is no oracle.
const MsgAuthUnavailable = "postern: the auth server is unavailable, try again later\r\n"

// accessPointTimeout bounds the access point calls of one authentication.
// A backend that stops answering (etcd down) would otherwise hold the
// callback until the handshake timeout closes the connection, and the
// client would never hear why. It is well above a normal call (a few
// backend reads, or one auth API round trip) and below
// DefaultHandshakeTimeout, so the banner reaches the client. Real time:
// it bounds I/O, like the auth client's own timeout.
const accessPointTimeout = 10 * time.Second

// errUnavailable refuses an authentication that failed on the access point
// (not on the certificate): the client is told auth is unavailable, in an
// SSH_MSG_USERAUTH_BANNER that OpenSSH prints before giving up.
func errUnavailable() error {
	return &ssh.BannerError{Err: errDenied, Message: MsgAuthUnavailable}
}

// authenticate is the PublicKeyCallback: certificate checks, then (node
// mode) RBAC, once per connection.
func (s *Server) authenticate(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
	log := s.cfg.Logger.WithFields(logrus.Fields{
		"remote_addr": meta.RemoteAddr().String(),
		"login":       meta.User(),
	})
	cert, ok := key.(*ssh.Certificate)
	if !ok {
		// OpenSSH clients offer every key they hold; plain keys are
		// expected noise, not an attack worth a warning.
		log.WithField("key_type", key.Type()).Debug("Rejected a plain public key: only user certificates are accepted.")
		return nil, errDenied
	}
	log = log.WithFields(logrus.Fields{"key_id": cert.KeyId, "serial": cert.Serial})
	deny := func(reason string) (*ssh.Permissions, error) {
		log.WithField("reason", reason).Warn("Access denied.")
		s.emitDenied(meta, cert, reason)
		return nil, errDenied
	}

	apCtx, cancel := context.WithTimeout(s.ctx, accessPointTimeout)
	defer cancel()
	ca, trusted, reason, err := s.userCAFor(apCtx, cert)
	switch {
	case reason != "":
		return deny(reason)
	case err != nil:
		log.WithError(err).Error("Cannot fetch the user CA: the auth server or its backend is unavailable.")
		s.emitDenied(meta, cert, unavailableReason(err))
		return nil, errUnavailable()
	}
	caCluster := ca.ClusterName
	checker := &ssh.CertChecker{
		IsUserAuthority: func(auth ssh.PublicKey) bool { return isUserAuthority(ca, auth) },
		Clock:           s.cfg.Clock.Now,
	}
	perms, err := checker.Authenticate(meta, key)
	if err != nil {
		if !isUserAuthority(ca, cert.SignatureKey) {
			return deny(fmt.Sprintf("certificate is not signed by the user CA of cluster %q", caCluster))
		}
		if cert.CertType == ssh.UserCert && onlyPrincipalWrong(checker, cert, meta.User()) {
			// A login the roles do not grant (the certificate's
			// principals are the roles' logins): say so, as below.
			_, _ = deny(certValidityReason(err, cert, s.cfg.Clock.Now()))
			return nil, &ssh.BannerError{Err: errDenied, Message: loginRefusal(cert, meta.User()) + "\r\n"}
		}
		return deny(certValidityReason(err, cert, s.cfg.Clock.Now()))
	}
	id, err := authz.FromCertificate(cert, meta.User())
	if err != nil {
		return deny(err.Error())
	}
	log = log.WithField("user", id.User)
	if trusted != nil {
		if err := id.MapTrusted(trusted); err != nil {
			return deny(err.Error())
		}
		log = log.WithFields(logrus.Fields{"user_cluster": id.Cluster, "remote_roles": id.RemoteRoles, "roles": id.Roles})
	} else if err := id.CheckCluster(s.cfg.ClusterName); err != nil {
		return deny(err.Error())
	}
	if err := s.checkLocks(id); err != nil {
		// The one refusal explained before authentication ends: the user
		// is known (the certificate checked out) and must learn why.
		msg := lockRefusal(err)
		_, _ = deny(msg)
		return nil, &ssh.BannerError{Err: errDenied, Message: msg + "\r\n"}
	}
	if err := id.Load(apCtx, s.cfg.AccessPoint); err != nil {
		log.WithError(err).Error("Cannot fetch roles: the auth server or its backend is unavailable.")
		s.emitDenied(meta, cert, unavailableReason(err))
		return nil, errUnavailable()
	}
	res := &authResult{id: id}
	if trusted != nil {
		res.signedBy = cert.SignatureKey
	}
	if s.policy.checkNode {
		res.node = s.cfg.GetNode()
		if err := id.CheckLogin(&res.node, id.Login); err != nil {
			// The certificate checked out: the user is who they say and
			// must learn that their roles, not their login, are at
			// fault (else psh and OpenSSH say only "permission denied"
			// and the user logs in again for nothing). The message
			// names only what the user may see anyway: their own
			// logins (loginRefusal).
			_, _ = deny(err.Error())
			return nil, &ssh.BannerError{Err: errDenied, Message: loginRefusal(cert, id.Login) + "\r\n"}
		}
		// require_session_mfa holds here too, not only at the proxy: a
		// user who reaches this port directly needs the per-session
		// certificate of this node as well. A root cluster's user
		// (trusted) never has one of this cluster's, so where the
		// mapped roles require it the session is refused.
		if err := id.CheckSessionMFA(&res.node, s.cfg.ClusterName); err != nil {
			_, _ = deny(err.Error())
			return nil, &ssh.BannerError{Err: errDenied, Message: trace.UserMessage(err) + "\r\n"}
		}
		res.permits = permitsFor(perms.Extensions, id.Checker, &res.node)
	}
	log.Debug("Authenticated.")
	return &ssh.Permissions{
		CriticalOptions: perms.CriticalOptions,
		Extensions:      perms.Extensions,
		ExtraData:       map[any]any{authKey{}: res},
	}, nil
}

// userCAFor picks the user CA to check cert against: this cluster's, or
// for a certificate that says it was issued by another cluster, that
// cluster's, and only while an enabled trusted_cluster names it (only a
// leaf has one: a root stores its leaves' CAs but never accepts their
// users); trusted is then that trusted_cluster. The cluster extension is
// read before the signature is checked, but it only picks the CA: a
// forged one leads to a CA that did not sign the certificate. A refusal
// comes back as reason (for the audit event), a failure to ask the
// access point as err.
func (s *Server) userCAFor(ctx context.Context, cert *ssh.Certificate) (ca *services.CertAuthority, trusted *services.TrustedCluster, reason string, err error) {
	return userCAFor(ctx, s.cfg.AccessPoint, s.cfg.ClusterName, cert)
}

func userCAFor(ctx context.Context, ap AccessPoint, clusterName string, cert *ssh.Certificate) (ca *services.CertAuthority, trusted *services.TrustedCluster, reason string, err error) {
	caCluster := clusterName
	if c := cert.Permissions.Extensions[services.CertExtensionCluster]; c != "" && c != clusterName {
		tc, err := ap.GetTrustedCluster(ctx, c)
		switch {
		case trace.IsNotFound(err) || (err == nil && !tc.Spec.Enabled):
			return nil, nil, fmt.Sprintf("certificate was issued by cluster %q, which this cluster does not trust", c), nil
		case err != nil:
			return nil, nil, "", trace.Wrap(err)
		}
		caCluster, trusted = c, tc
	}
	ca, err = ap.GetCertAuthority(ctx, caCluster, services.UserCA, false)
	if trusted != nil && trace.IsNotFound(err) {
		return nil, nil, fmt.Sprintf("certificate was issued by cluster %q, whose user CA this cluster does not hold", caCluster), nil
	}
	if err != nil {
		return nil, nil, "", trace.Wrap(err)
	}
	return ca, trusted, "", nil
}

// conn is one authenticated SSH connection.
type conn struct {
	srv   *Server
	cfg   *Config
	nc    net.Conn
	sconn *ssh.ServerConn
	auth  *authResult
	id    string // conn_id
	log   logrus.FieldLogger

	// ctx is cancelled when the connection ends; cause says why.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// wg counts every goroutine the connection starts.
	wg sync.WaitGroup
	// lastActive is the Clock time (unix nanoseconds) of the last channel
	// data, read by the idle timer.
	lastActive atomic.Int64
	// keepAlivesAnswered counts answered probes (diagnostics; tests wait
	// on it to step a fake clock in lockstep with the loop).
	keepAlivesAnswered atomic.Int64
	// ending is set by the first endWith: a connection that two sweeps
	// (a lock and a trust change, or two trust changes) both cover is
	// told why and ended once, so no explanation is still being written
	// while its sessions close.
	ending atomic.Bool

	// mu guards everything below. Lock order: after Server.mu, before
	// session.mu; never held across network I/O.
	mu          sync.Mutex
	closed      bool
	forwards    map[uint32]*remoteForward // -R listeners by bound port
	agentWanted bool                      // auth-agent-req accepted
	agent       *agentSocket              // created on first session that needs it
	sessions    map[*session]struct{}     // open session channels (lockOut)

	// chanReqs hands forwarded channels' request streams to the control
	// loop (discardRequests).
	chanReqs chan (<-chan *ssh.Request)
}

func newConn(s *Server, nc net.Conn, sconn *ssh.ServerConn, traced context.Context) *conn {
	res, _ := authResultOf(sconn)
	// The connection keeps the id the first proxy gave it (a connection
	// that arrived over a tunnel or a peer carries it), else gets one.
	id := observe.ConnID(traced)
	if id == "" {
		id = uuid.NewString()
	}
	// The client's address rides the context: a proxy dialing a tunnel
	// node for this connection passes it on (utils.ClientAddr); so do the
	// connection id and the span of its accept, for the next hop's
	// DialMeta. The lifetime stays the server's (s.ctx), not traced's.
	ctx := s.ctx
	if sc := oteltrace.SpanContextFromContext(traced); sc.IsValid() {
		ctx = oteltrace.ContextWithSpanContext(ctx, sc)
	}
	ctx = observe.WithConnID(utils.WithClientAddr(ctx, nc.RemoteAddr().String()), id)
	ctx, cancel := context.WithCancelCause(ctx)
	c := &conn{
		srv:      s,
		cfg:      &s.cfg,
		nc:       nc,
		sconn:    sconn,
		auth:     res,
		id:       id,
		ctx:      ctx,
		cancel:   cancel,
		forwards: map[uint32]*remoteForward{},
		chanReqs: make(chan (<-chan *ssh.Request)),
	}
	c.log = s.cfg.Logger.WithFields(logrus.Fields{
		"conn_id":     c.id,
		"remote_addr": nc.RemoteAddr().String(),
		"login":       sconn.User(),
		"user":        res.id.User,
	})
	if sc := oteltrace.SpanContextFromContext(ctx); sc.IsValid() {
		c.log = c.log.WithField("trace_id", sc.TraceID().String())
	}
	c.touch()
	return c
}

// serve dispatches channels and requests until the connection ends, then
// waits for everything it started.
//
// One Info line per connection, at its end, carrying what the start line
// would (conn_id, addresses, login, user) plus how long it lasted and why
// it ended: a proxy logs every `ssh -J`, and at hundreds of setups a
// second a second line per connection, formatted and written, was a
// measurable part of the proxy's CPU per setup. The start is at Debug;
// the audit log has its own events either way.
func (c *conn) serve(chans <-chan ssh.NewChannel, reqs <-chan *ssh.Request) {
	start := c.cfg.Clock.Now()
	c.log.Debug("Connection established.")
	c.loop(chans, reqs)
	c.close("connection closed by client")
	c.wg.Wait()
	c.cleanup()
	c.log.WithFields(logrus.Fields{
		"reason":   context.Cause(c.ctx).Error(),
		"duration": c.cfg.Clock.Since(start).Round(time.Millisecond).String(),
	}).Info("Connection ended.")
}

// loop is the connection's one control goroutine: it accepts channels,
// answers global requests, sends keep-alives and enforces the idle timeout
// until the client's channel stream ends. One goroutine rather than one per
// duty because a proxy holds thousands of idle connections and each
// goroutine's stack (4-8 KiB) is paid per connection; none of these duties
// blocks for long (dispatch starts the channel's handler in its own
// goroutine, global requests are answered from memory, a keep-alive probe
// waits for its reply in a goroutine of its own while it is in flight).
//
// Keep-alive: a probe every KeepAliveInterval, one in flight at a time;
// KeepAliveCountMax intervals in a row without an answer close the
// connection. Idle timeout: the connection closes when no channel data
// moved for IdleTimeout. Both use timers re-armed after they fire rather
// than tickers: a ticker drops ticks when the loop is late, and re-arming
// makes "the loop handled the last tick" observable to fake-clock tests.
func (c *conn) loop(chans <-chan ssh.NewChannel, reqs <-chan *ssh.Request) {
	var keepAliveC, idleC <-chan time.Time
	var keepAlive, idle clockwork.Timer
	if c.cfg.KeepAliveInterval > 0 {
		keepAlive = c.cfg.Clock.NewTimer(c.cfg.KeepAliveInterval)
		defer keepAlive.Stop()
		keepAliveC = keepAlive.Chan()
	}
	if c.cfg.IdleTimeout > 0 {
		idle = c.cfg.Clock.NewTimer(c.idleWait())
		defer idle.Stop()
		idleC = idle.Chan()
	}
	replies := make(chan error, 1)
	inflight, missed := false, 0
	// The request streams of forwarded channels (discardRequests): their
	// requests are refused here rather than by a goroutine per channel.
	var chanReqs []<-chan *ssh.Request
	const (
		caseChans = iota
		caseReqs
		caseKeepAlive
		caseReplies
		caseIdle
		caseChanReqs
		caseFirstChanReqs
	)
	cases := make([]reflect.SelectCase, caseFirstChanReqs)
	for i := range cases {
		cases[i].Dir = reflect.SelectRecv
	}
	for {
		// reflect.Select because the set of channels grows and shrinks
		// with the connection's forwarded channels; the loop wakes for
		// control events only, so its cost does not matter.
		cases = cases[:caseFirstChanReqs]
		cases[caseChans].Chan = reflect.ValueOf(chans)
		cases[caseReqs].Chan = reflect.ValueOf(reqs)
		cases[caseKeepAlive].Chan = reflect.ValueOf(keepAliveC)
		cases[caseReplies].Chan = reflect.ValueOf(replies)
		cases[caseIdle].Chan = reflect.ValueOf(idleC)
		cases[caseChanReqs].Chan = reflect.ValueOf(c.chanReqs)
		for _, r := range chanReqs {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(r)})
		}
		chosen, v, ok := reflect.Select(cases)
		switch chosen {
		case caseChans:
			if !ok {
				return
			}
			c.dispatch(v.Interface().(ssh.NewChannel))
		case caseReqs:
			if !ok {
				reqs = nil // the channel stream ends next
				continue
			}
			dispatchRequest(c.srv.policy.global, c, c.log, v.Interface().(*ssh.Request))
		case caseKeepAlive:
			if inflight {
				missed++
				if missed >= c.cfg.KeepAliveCountMax {
					c.close(fmt.Sprintf("no answer to %d keep-alives", missed))
					keepAliveC = nil // chans closes with the connection
					continue
				}
			} else {
				inflight = true
				c.go_(func() {
					_, _, err := c.sconn.SendRequest(keepAliveRequest, true, nil)
					replies <- err
				})
			}
			keepAlive.Reset(c.cfg.KeepAliveInterval)
		case caseReplies:
			inflight = false
			if err, _ := v.Interface().(error); err != nil {
				c.close("keep-alive failed: " + err.Error())
				keepAliveC = nil
				continue
			}
			missed = 0
			c.keepAlivesAnswered.Add(1)
		case caseIdle:
			wait := c.idleWait()
			if wait <= 0 {
				c.close(fmt.Sprintf("idle timeout: no channel data for %v", c.cfg.IdleTimeout))
				idleC = nil
				continue
			}
			idle.Reset(wait)
		case caseChanReqs:
			chanReqs = append(chanReqs, v.Interface().(<-chan *ssh.Request))
		default:
			i := chosen - caseFirstChanReqs
			if !ok {
				// The channel closed.
				chanReqs = slices.Delete(chanReqs, i, i+1)
				continue
			}
			// What ssh.DiscardRequests does: no request on a forwarded
			// channel is understood.
			if req := v.Interface().(*ssh.Request); req.WantReply {
				_ = req.Reply(false, nil)
			}
		}
	}
}

// discardRequests refuses every request on a forwarded channel (none is
// defined for direct-tcpip or forwarded-tcpip) in the control loop, which
// saves the goroutine per channel that ssh.DiscardRequests would need:
// a proxy holds thousands of idle forwarded channels. The stream must be
// drained (x/crypto's connection stalls on a full one), so when the loop
// has ended it falls back to a goroutine until the stream closes.
func (c *conn) discardRequests(reqs <-chan *ssh.Request) {
	select {
	case c.chanReqs <- reqs:
	case <-c.ctx.Done():
		c.go_(func() { ssh.DiscardRequests(reqs) })
	}
}

// idleWait is how long until the connection has been idle for
// IdleTimeout; zero or less means it has been.
func (c *conn) idleWait() time.Duration {
	return c.cfg.IdleTimeout - c.cfg.Clock.Since(time.Unix(0, c.lastActive.Load()))
}

// go_ starts f as a goroutine owned by the connection.
func (c *conn) go_(f func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
}

// dispatch serves a new channel as the server's policy says (policy.go):
// a type it does not list is rejected as unknown. Every channel served
// passes the locks and the per-user channel cap first.
func (c *conn) dispatch(nch ssh.NewChannel) {
	handle := c.srv.policy.channelHandler(c, nch)
	if handle == nil {
		return
	}
	t := nch.ChannelType()
	if err := c.srv.checkLocks(c.auth.id); err != nil {
		c.log.WithField("reason", err.Error()).WithField("channel_type", t).Warn("Channel refused by a lock.")
		_ = nch.Reject(ssh.Prohibited, lockRefusal(err))
		return
	}
	release, err := c.acquireChannel()
	if err != nil {
		c.log.WithError(err).WithField("channel_type", t).Warn("Channel refused by a cap.")
		c.emitRefused(t, "", err.Error())
		_ = nch.Reject(ssh.ResourceShortage, trace.UserMessage(err))
		return
	}
	c.go_(func() {
		defer release()
		handle(c, nch)
	})
}

// close ends the connection: every channel and request stream ends with
// it, the listeners it owns close, and its loops stop. Idempotent.
func (c *conn) close(reason string) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	forwards := c.forwards
	c.forwards = map[uint32]*remoteForward{}
	agent := c.agent
	c.mu.Unlock()

	c.cancel(errors.New(reason))
	_ = c.sconn.Close()
	for _, f := range forwards {
		_ = f.ln.Close()
	}
	if agent != nil {
		_ = agent.ln.Close()
	}
}

// cleanup removes what outlives goroutines: the agent socket directory.
func (c *conn) cleanup() {
	c.mu.Lock()
	agent := c.agent
	c.mu.Unlock()
	if agent != nil {
		agent.remove(c.log)
	}
}

// touch records channel activity for the idle timer.
func (c *conn) touch() {
	c.lastActive.Store(c.cfg.Clock.Now().UnixNano())
}

// trackedChannel records data in both directions as activity.
type trackedChannel struct {
	ssh.Channel
	c *conn
	// counts, when set, adds up the bytes for the audit trail.
	counts *byteCounts
}

// byteCounts are a session's bytes from the client (in) and to it (out,
// stdout and stderr together).
type byteCounts struct{ in, out atomic.Int64 }

func (t trackedChannel) Read(p []byte) (int, error) {
	n, err := t.Channel.Read(p)
	if n > 0 {
		t.c.touch()
		if t.counts != nil {
			t.counts.in.Add(int64(n))
		}
	}
	return n, err
}

func (t trackedChannel) Write(p []byte) (int, error) {
	n, err := t.Channel.Write(p)
	if n > 0 {
		t.c.touch()
		if t.counts != nil {
			t.counts.out.Add(int64(n))
		}
	}
	return n, err
}

func (t trackedChannel) Stderr() io.ReadWriter {
	return trackedRW{t.Channel.Stderr(), t.c, t.counts}
}

type trackedRW struct {
	io.ReadWriter
	c      *conn
	counts *byteCounts
}

func (t trackedRW) Write(p []byte) (int, error) {
	n, err := t.ReadWriter.Write(p)
	if n > 0 {
		t.c.touch()
		if t.counts != nil {
			t.counts.out.Add(int64(n))
		}
	}
	return n, err
}

// recheckAccess repeats the node RBAC decision with the roles as they are
// now, so that a role tightened or deleted while a connection stays open
// applies to its next session. Proxy mode has no node to check.
func (c *conn) recheckAccess() error {
	if !c.srv.policy.checkNode {
		return nil
	}
	fresh := *c.auth.id
	if fresh.RemoteRoles != nil {
		// A root's user: the trust itself is re-checked (a trusted_cluster
		// removed or disabled cuts the next session), and the role_map
		// as it is now applies.
		tc, err := c.cfg.AccessPoint.GetTrustedCluster(c.ctx, fresh.Cluster)
		if err != nil && !trace.IsNotFound(err) {
			return trace.Wrap(err)
		}
		if err := fresh.MapTrusted(tc); err != nil {
			return trace.Wrap(err)
		}
	}
	if err := fresh.Load(c.ctx, c.cfg.AccessPoint); err != nil {
		return trace.Wrap(err)
	}
	node := c.cfg.GetNode()
	return trace.Wrap(fresh.CheckLogin(&node, fresh.Login))
}

// rejectReason maps an error to a channel-open failure.
// acquireChannel takes a channel slot of the connection's user.
func (c *conn) acquireChannel() (func(), error) {
	if c.cfg.Limiter == nil {
		return func() {}, nil
	}
	return c.cfg.Limiter.AcquireSession(c.auth.id.User)
}

func rejectReason(err error) ssh.RejectionReason {
	if trace.IsAccessDenied(err) || services.IsLocked(err) {
		return ssh.Prohibited
	}
	if trace.IsLimitExceeded(err) {
		return ssh.ResourceShortage
	}
	return ssh.ConnectionFailed
}

// authResultOf returns what authenticate stored for sconn.
func authResultOf(sconn *ssh.ServerConn) (*authResult, bool) {
	if sconn.Permissions == nil {
		return nil, false
	}
	res, ok := sconn.Permissions.ExtraData[authKey{}].(*authResult)
	return res, ok && res != nil
}
