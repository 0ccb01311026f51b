package srv

import (
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// handleLocalForward serves direct-tcpip on a node (ssh -L); the proxy's
// direct-tcpip (ssh -J) is handleProxyDirectTCPIP.
func (c *conn) handleLocalForward(nch ssh.NewChannel) {
	var p directTCPIPPayload
	if err := ssh.Unmarshal(nch.ExtraData(), &p); err != nil {
		_ = nch.Reject(ssh.ConnectionFailed, "malformed direct-tcpip request")
		return
	}
	target := net.JoinHostPort(p.Host, strconv.FormatUint(uint64(p.Port), 10))
	log := c.log.WithField("target", target)
	if !c.auth.permits.PortForwarding {
		reason := fmt.Sprintf("port forwarding is not allowed for user %q on this node", c.auth.id.User)
		log.WithField("reason", reason).Warn("direct-tcpip denied.")
		c.emitRefused("-L", target, reason)
		_ = nch.Reject(ssh.Prohibited, reason)
		return
	}
	release, err := c.acquireForward("-L/" + target)
	if err != nil {
		log.WithError(err).Warn("direct-tcpip refused by a cap.")
		c.emitRefused("-L", target, err.Error())
		_ = nch.Reject(ssh.ResourceShortage, trace.UserMessage(err))
		return
	}
	defer release()
	d := net.Dialer{Timeout: services.DefaultSSHDialTimeout}
	target2, err := d.DialContext(c.ctx, "tcp", target)
	if err != nil {
		log.WithError(err).Info("direct-tcpip dial failed.")
		_ = nch.Reject(ssh.ConnectionFailed, fmt.Sprintf("connecting to %s failed", target))
		return
	}
	c.spliceChannel(nch, target2, "direct-tcpip", target)
}

// spliceChannel accepts nch and splices it to nc until both directions end.
func (c *conn) spliceChannel(nch ssh.NewChannel, nc net.Conn, kind, target string) {
	ch, reqs, err := nch.Accept()
	if err != nil {
		_ = nc.Close()
		return
	}
	c.discardRequests(reqs)
	c.splice(trackedChannel{Channel: ch, c: c}, nc, kind, target)
}

// splice runs utils.Splice and logs the byte counts for the audit trail.
func (c *conn) splice(ch io.ReadWriteCloser, nc io.ReadWriteCloser, kind, target string) {
	in, out, err := utils.Splice(c.ctx, ch, nc)
	typ := events.PortForward
	if kind == "agent" {
		typ = events.AgentForward
	}
	c.emit(typ, events.Fields{events.FieldKind: kind, events.FieldTarget: target, events.FieldBytesIn: in, events.FieldBytesOut: out})
	entry := c.log.WithFields(logrus.Fields{"kind": kind, "target": target, "bytes_in": in, "bytes_out": out})
	if err != nil && c.ctx.Err() == nil {
		entry = entry.WithError(err)
	}
	entry.Debug("Forward ended.")
}

// remoteForward is one ssh -R listener, alive as long as its connection.
type remoteForward struct {
	ln net.Listener
	// addr is the address as the client sent it: forwarded-tcpip must
	// echo it verbatim, clients match their listeners by it.
	addr string
	port uint32
}

// bindHost keeps -R listeners on loopback, like OpenSSH's default
// GatewayPorts=no: a forwarded port must not open the node to the network
// because a user asked for "0.0.0.0".
func bindHost(addr string) string {
	if ip := net.ParseIP(addr); ip != nil && ip.IsLoopback() {
		return addr
	}
	if addr == "::" || addr == "::1" {
		return "::1"
	}
	return "127.0.0.1"
}

// privilegedPort is the first port only root may bind.
const privilegedPort = 1024

// denyTCPIPForward refuses an -R request, logged and audited.
func (c *conn) denyTCPIPForward(req *ssh.Request, m forwardRequest, reason string) {
	c.log.WithFields(logrus.Fields{"bind_addr": m.Addr, "bind_port": m.Port, "reason": reason}).Warn("tcpip-forward denied.")
	c.emitRefused("-R", net.JoinHostPort(m.Addr, strconv.FormatUint(uint64(m.Port), 10)), reason)
	reply(req, false)
}

// refuseTCPIPForwardOnProxy: the proxy listens for nobody.
func (c *conn) refuseTCPIPForwardOnProxy(req *ssh.Request) {
	var m forwardRequest
	if err := ssh.Unmarshal(req.Payload, &m); err != nil {
		reply(req, false)
		return
	}
	c.denyTCPIPForward(req, m, "remote port forwarding is not available on the proxy")
}

func (c *conn) handleTCPIPForward(req *ssh.Request) {
	var m forwardRequest
	if err := ssh.Unmarshal(req.Payload, &m); err != nil {
		reply(req, false)
		return
	}
	deny := func(reason string) { c.denyTCPIPForward(req, m, reason) }
	if !c.auth.permits.PortForwarding {
		deny(fmt.Sprintf("port forwarding is not allowed for user %q on this node", c.auth.id.User))
		return
	}
	if m.Port != 0 && m.Port < privilegedPort && c.auth.id.Login != "root" {
		deny(fmt.Sprintf("only root may forward privileged port %d", m.Port))
		return
	}
	if m.Port > 65535 {
		deny("port out of range")
		return
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(bindHost(m.Addr), strconv.FormatUint(uint64(m.Port), 10)))
	if err != nil {
		deny(trace.ConvertSystemError(err).Error())
		return
	}
	f := &remoteForward{ln: ln, addr: m.Addr, port: uint32(ln.Addr().(*net.TCPAddr).Port)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = ln.Close()
		reply(req, false)
		return
	}
	if old, ok := c.forwards[f.port]; ok {
		_ = old.ln.Close()
	}
	c.forwards[f.port] = f
	c.mu.Unlock()
	c.log.WithFields(logrus.Fields{"bind_addr": m.Addr, "bind_port": m.Port, "listen_addr": ln.Addr().String()}).Info("Remote port forward listening.")
	if req.WantReply {
		var payload []byte
		if m.Port == 0 {
			payload = ssh.Marshal(struct{ Port uint32 }{f.port})
		}
		_ = req.Reply(true, payload)
	}
	c.go_(func() { c.serveRemoteForward(f) })
}

func (c *conn) handleCancelTCPIPForward(req *ssh.Request) {
	var m forwardRequest
	if err := ssh.Unmarshal(req.Payload, &m); err != nil {
		reply(req, false)
		return
	}
	c.mu.Lock()
	f, ok := c.forwards[m.Port]
	if ok {
		delete(c.forwards, m.Port)
	}
	c.mu.Unlock()
	if ok {
		_ = f.ln.Close()
		c.log.WithField("bind_port", m.Port).Info("Remote port forward cancelled.")
	}
	reply(req, ok)
}

func (c *conn) serveRemoteForward(f *remoteForward) {
	for {
		nc, err := f.ln.Accept()
		if err != nil {
			return
		}
		release, err := c.acquireForward("-R/" + f.ln.Addr().String())
		if err != nil {
			c.log.WithError(err).Warn("Forwarded connection refused by a cap.")
			_ = nc.Close()
			continue
		}
		c.go_(func() {
			defer release()
			c.forwardRemoteConn(f, nc)
		})
	}
}

// forwardRemoteConn opens a forwarded-tcpip channel for one accepted
// connection and splices the two.
func (c *conn) forwardRemoteConn(f *remoteForward, nc net.Conn) {
	origin, _ := nc.RemoteAddr().(*net.TCPAddr)
	p := forwardedTCPPayload{Addr: f.addr, Port: f.port}
	if origin != nil {
		p.OriginAddr, p.OriginPort = origin.IP.String(), uint32(origin.Port)
	}
	ch, reqs, err := c.sconn.OpenChannel("forwarded-tcpip", ssh.Marshal(p))
	if err != nil {
		c.log.WithError(err).Debug("Client refused forwarded-tcpip channel.")
		_ = nc.Close()
		return
	}
	c.discardRequests(reqs)
	c.splice(trackedChannel{Channel: ch, c: c}, nc, "forwarded-tcpip", net.JoinHostPort(f.addr, strconv.FormatUint(uint64(f.port), 10)))
}

// acquireForward takes a slot of one forwarded port of this connection.
func (c *conn) acquireForward(what string) (func(), error) {
	if c.cfg.Limiter == nil {
		return func() {}, nil
	}
	return c.cfg.Limiter.AcquireForward(c.id + "/" + what)
}
