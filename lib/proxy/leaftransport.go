package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	oteltrace "go.opentelemetry.io/otel/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// LeafTransport is the leaf cluster's side of routing through a root
// (docs/leaf-clusters.md): a root proxy opens a transport channel on the
// leaf's tunnel and sends a proxyapi.LeafRequest naming the target and
// the user's certificate; this leaf's Router picks the node among those
// the user may reach here (the certificate checked and its roles mapped
// by Identify, the leaf's inventory and routing_strategy), answers, and
// splices. The root decides nothing about the leaf's nodes.
type LeafTransport struct {
	cfg LeafTransportConfig
}

// LeafTransportConfig configures a LeafTransport.
type LeafTransportConfig struct {
	// Router is this (leaf) cluster's Router. Required.
	Router *Router
	// Identify checks a root user's certificate and returns the identity
	// with the leaf roles it maps to (srv.IdentifyRootUser). Required.
	Identify func(ctx context.Context, cert *ssh.Certificate) (*authz.Identity, error)
	// Nodes lists this cluster's nodes for a LeafKindNodes request (the
	// leaf's NodeWatcher); nil refuses such requests as unavailable.
	Nodes authz.NodeLister
	// Deps: Audit receives access.denied; Tracer starts the leaf.serve
	// span, a child of the root proxy's dial.
	observe.Deps
	// OpenSSHCert asks this cluster's auth server for a root user's
	// certificate for OpenSSH node uuid (auth.Client.OpenSSHRootUserCert),
	// sent with a dial's reply: a root proxy's web terminal logs in with
	// it. Nil sends none (the root then refuses such a terminal).
	OpenSSHCert func(ctx context.Context, uuid string, rootCert []byte) ([]byte, error)
	// Locks, when set, ends a root user's connection to one of this
	// cluster's OpenSSH nodes when a lock here covers the node or the
	// user (*services.LockWatcher): a stock sshd knows nothing of locks,
	// so this proxy, the last Postern hop, ends it. Nil ends nothing.
	Locks SpliceLocks
	// RequestTimeout bounds reading the request, identifying and
	// dialing; zero means DefaultLeafRequestTimeout.
	RequestTimeout time.Duration
}

// SpliceLocks is the lock set a LeafTransport ends OpenSSH connections
// by (*services.LockWatcher).
type SpliceLocks interface {
	Check(targets ...services.LockTarget) error
	// Changes is closed at the next change of the set.
	Changes() <-chan struct{}
}

// DefaultLeafRequestTimeout covers a dial at ssh_dial_timeout's default
// and a tunnel find: the root proxy's own dial bound is what the user
// waits for.
const DefaultLeafRequestTimeout = 45 * time.Second

// NewLeafTransport returns a LeafTransport.
func NewLeafTransport(cfg LeafTransportConfig) (*LeafTransport, error) {
	if cfg.Router == nil {
		return nil, trace.BadParameter("leaf transport: missing Router")
	}
	if cfg.Identify == nil {
		return nil, trace.BadParameter("leaf transport: missing Identify")
	}
	cfg.Deps.SetDefaults(observe.ComponentLeaf)
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultLeafRequestTimeout
	}
	return &LeafTransport{cfg: cfg}, nil
}

// Serve handles one transport channel (as a net.Conn) until it is done,
// and closes it. ctx ends the splice (the tunnel's or the process's end).
func (h *LeafTransport) Serve(ctx context.Context, nc net.Conn) {
	defer nc.Close()
	// The root proxy's trace and connection id ride the transport
	// channel that carries this request (reversetunnel.TransportRequest).
	ctx, span := h.cfg.Tracer.Start(observe.MetaOf(nc).Context(ctx), "leaf.serve", oteltrace.WithSpanKind(oteltrace.SpanKindServer))
	defer span.End()
	rctx, cancel := context.WithTimeout(ctx, h.cfg.RequestTimeout)
	defer cancel()
	_ = nc.SetReadDeadline(time.Now().Add(h.cfg.RequestTimeout))
	req, err := readLeafRequest(nc)
	if err != nil {
		h.reply(nc, proxyapi.LeafReply{Error: trace.UserMessage(err), Kind: proxyapi.LeafBadRequest})
		return
	}
	_ = nc.SetReadDeadline(time.Time{})
	log := h.cfg.Logger.WithFields(observe.LogFields(ctx)).WithFields(logrus.Fields{"target": req.Target, "source": req.Source, "kind": req.Kind})
	var target Target
	switch req.Kind {
	case "", proxyapi.LeafKindDial, proxyapi.LeafKindRoute:
		if target, err = ParseTarget(req.Target); err != nil {
			h.reply(nc, proxyapi.LeafReply{Error: trace.UserMessage(err), Kind: proxyapi.LeafBadRequest})
			return
		}
	case proxyapi.LeafKindNodes, proxyapi.LeafKindAccess:
	default:
		h.reply(nc, proxyapi.LeafReply{Error: "unknown leaf request kind " + strconv.Quote(req.Kind), Kind: proxyapi.LeafBadRequest})
		return
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(req.Cert))
	cert, ok := pub.(*ssh.Certificate)
	if err != nil || !ok {
		h.reply(nc, proxyapi.LeafReply{Error: "the request carries no user certificate", Kind: proxyapi.LeafBadRequest})
		return
	}
	id, err := h.cfg.Identify(rctx, cert)
	if err != nil {
		if !trace.IsAccessDenied(err) {
			log.WithError(err).Warn("Cannot check a root user's certificate.")
			h.reply(nc, proxyapi.LeafReply{Error: "the leaf cluster cannot check the user's access now", Kind: proxyapi.LeafUnavailable})
			return
		}
		// Told like an unknown cluster at the root: a user whose roles
		// reach nothing here learns nothing about this cluster.
		log.WithError(err).WithField("user", cert.KeyId).Warn("Access denied.")
		h.emitDenied(rctx, cert, req, err.Error())
		h.reply(nc, proxyapi.LeafReply{Error: "access denied", Kind: proxyapi.LeafDenied})
		return
	}
	log = log.WithField("user", id.User)
	switch req.Kind {
	case proxyapi.LeafKindAccess:
		h.reply(nc, proxyapi.LeafReply{})
		return
	case proxyapi.LeafKindNodes:
		if h.cfg.Nodes == nil {
			h.reply(nc, proxyapi.LeafReply{Error: "the leaf cluster does not list nodes", Kind: proxyapi.LeafUnavailable})
			return
		}
		entries, err := authz.ListNodes(rctx, h.cfg.Nodes, id, h.cfg.Router.ClusterName())
		if err != nil {
			log.WithError(err).Warn("Cannot list nodes for a root user.")
			h.reply(nc, proxyapi.LeafReply{Error: "the leaf cluster cannot list nodes now", Kind: proxyapi.LeafUnavailable})
			return
		}
		h.cfg.Router.NodeStatuses(entries)
		h.reply(nc, proxyapi.LeafReply{Nodes: entries})
		return
	}
	if req.Kind == proxyapi.LeafKindRoute {
		// As `pctl route` here would explain it, but among the nodes
		// the mapped roles may reach only: a node the user may not see
		// is neither a candidate nor named in an error.
		e := h.cfg.Router.ExplainFor(rctx, target, id.CanReach)
		text := e.String()
		if len(text) > proxyapi.MaxLeafExplanation {
			text = strings.ToValidUTF8(text[:proxyapi.MaxLeafExplanation], "") + "\n... (cut at " + strconv.Itoa(proxyapi.MaxLeafExplanation) + " bytes)\n"
		}
		log.WithField("route_failed", e.Failed()).Debug("Explained a route for a root user.")
		h.reply(nc, proxyapi.LeafReply{Explanation: text, RouteFailed: e.Failed()})
		return
	}
	conn, route, err := h.cfg.Router.DialHost(rctx, RouteRequest{Target: target, Access: id.CanReach, Source: req.Source})
	if err != nil {
		visible, denied := HideDenied(target, route, err)
		kind := proxyapi.LeafUnavailable
		switch {
		case denied:
			h.emitDenied(rctx, cert, req, err.Error())
			kind = proxyapi.LeafNotFound
		case trace.IsNotFound(err):
			kind = proxyapi.LeafNotFound
		case IsAmbiguousHost(err):
			kind = proxyapi.LeafAmbiguous
		}
		log.WithError(err).Info("Routing for a root user failed.")
		h.reply(nc, proxyapi.LeafReply{Error: trace.UserMessage(visible), Kind: kind})
		return
	}
	defer conn.Close()
	if err := leafSessionMFARefusal(id, &route.Node, h.cfg.Router.ClusterName()); err != nil {
		log.WithError(err).Info("Refused a root user's session without its fresh second factor.")
		h.emitDenied(rctx, cert, req, err.Error())
		h.reply(nc, proxyapi.LeafReply{Error: trace.UserMessage(err)})
		return
	}
	var reply proxyapi.LeafReply
	if route.Node.IsOpenSSH() {
		// Nothing on a stock sshd records; the root proxy, if it is the
		// session's SSH client (a web terminal), does, and is told the
		// node and whether this cluster's roles for the user require a
		// recording. An ssh -J session stays end to end.
		reply.OpenSSH = &proxyapi.LeafOpenSSHNode{UUID: route.Node.UUID, Hostname: route.Node.Hostname}
		if id.Checker != nil {
			if mode, role := id.Checker.RecordingPolicy(); mode == services.RecordingRequire {
				reply.OpenSSH.RecordingRequiredBy = role
			}
		}
		h.openSSHCert(rctx, log, route.Node, req.Cert, reply.OpenSSH)
	}
	if !h.reply(nc, reply) {
		return
	}
	log.WithField("node", route.Node.UUID).Debug("Routed a root user's connection.")
	if route.Node.IsOpenSSH() && h.cfg.Locks != nil {
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			h.endWhenLocked(log, nc, conn, id.User, route.Node.UUID, stop)
		}()
		defer func() { close(stop); <-done }()
	}
	_, _, _ = utils.Splice(ctx, nc, conn)
}

// endWhenLocked closes both ends of a splice to OpenSSH node uuid for
// user when a lock covers either, checking at every change of the lock
// set until stop is closed.
func (h *LeafTransport) endWhenLocked(log logrus.FieldLogger, nc, conn net.Conn, user, uuid string, stop <-chan struct{}) {
	for {
		changed := h.cfg.Locks.Changes()
		if err := h.cfg.Locks.Check(services.LockTarget{Node: uuid}, services.LockTarget{User: user}); services.IsLocked(err) {
			log.WithField("reason", err.Error()).Warn("Ending a root user's connection to a locked OpenSSH node.")
			_ = conn.Close()
			_ = nc.Close()
			return
		}
		select {
		case <-changed:
		case <-stop:
			return
		}
	}
}

// openSSHCert gets the root user's certificate for OpenSSH node n into
// out (or why not into out.CertError: the root says it).
func (h *LeafTransport) openSSHCert(ctx context.Context, log logrus.FieldLogger, n services.Node, rootCert string, out *proxyapi.LeafOpenSSHNode) {
	if h.cfg.OpenSSHCert == nil {
		out.CertError = "the leaf cluster's proxy does not issue certificates for its OpenSSH nodes"
		return
	}
	cert, err := h.cfg.OpenSSHCert(ctx, n.UUID, []byte(rootCert))
	if err != nil {
		log.WithError(err).Warn("No certificate for a root user on an OpenSSH node.")
		out.CertError = trace.UserMessage(err)
		return
	}
	out.Cert = string(bytes.TrimSpace(cert))
}

// readLeafRequest reads one line byte by byte: nothing after the newline
// may be consumed (the root sends the SSH bytes only after the reply, but
// the splice must start exactly at them either way).
func readLeafRequest(r io.Reader) (*proxyapi.LeafRequest, error) {
	var line []byte
	b := make([]byte, 1)
	for {
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, trace.BadParameter("reading the leaf request: %v", err)
		}
		if b[0] == '\n' {
			break
		}
		line = append(line, b[0])
		if len(line) > proxyapi.MaxLeafRequest {
			return nil, trace.BadParameter("leaf request longer than %d bytes", proxyapi.MaxLeafRequest)
		}
	}
	var req proxyapi.LeafRequest
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, trace.BadParameter("malformed leaf request: %v", err)
	}
	return &req, nil
}

func (h *LeafTransport) reply(w io.Writer, r proxyapi.LeafReply) bool {
	b, err := json.Marshal(r)
	if err != nil {
		return false
	}
	_, err = w.Write(append(b, '\n'))
	return err == nil
}

func (h *LeafTransport) emitDenied(ctx context.Context, cert *ssh.Certificate, req *proxyapi.LeafRequest, reason string) {
	user := cert.KeyId
	if u := cert.Permissions.Extensions[services.CertExtensionUser]; u != "" {
		user = u
	}
	fields := events.Fields{events.FieldTarget: req.Target, events.FieldReason: reason, events.FieldKind: "leaf"}
	if req.Source != "" {
		fields[events.FieldRemoteAddr] = req.Source
	}
	if c := cert.Permissions.Extensions[services.CertExtensionCluster]; c != "" {
		fields[events.FieldUserCluster] = c
	}
	h.cfg.Audit.Emit(ctx, events.Event{Type: events.AccessDenied, User: user, Fields: fields})
}
