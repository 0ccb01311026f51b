package proxy

// Dialing: DialHost runs Route and opens the chosen node by the dialer
// order (a tunnel on this proxy, a peer proxy holding one, the registered
// address); router.go holds the decision itself.

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// RouteRequest is one DialHost call.
type RouteRequest struct {
	// Target is where the user wants to go.
	Target Target
	// Access is the caller's access filter, applied to the candidates
	// before routing decides (see AccessFilter). Every user-facing path
	// sets it; nil means the admin view.
	Access AccessFilter
	// Source is the client's address, passed to a tunnel node for its
	// audit log; empty when unknown.
	Source string
	// Authorize, when set, runs on the chosen node before anything is
	// dialed (the web terminal checks the exact login there). Its error
	// is returned as is and nothing is dialed.
	Authorize func(node services.Node) error
	// Cert is the user's certificate, which a route to a leaf cluster
	// presents there (the leaf decides from it); nil: leaf clusters are
	// not found. Local routes ignore it.
	Cert *ssh.Certificate
}

// DialHost routes req.Target and opens the chosen node: Route decides
// (the cluster once, then the node in the local cluster, or just which
// leaf), and the connection goes either to a local node (dialLocal) or
// through the leaf, whose own Router picks the node (dialLeaf). Nothing
// that does not answer as an SSH server is ever handed to a caller to
// splice. The returned Route is filled in whenever routing got that far,
// also on error, for logs and audit.
func (r *Router) DialHost(ctx context.Context, req RouteRequest) (net.Conn, Route, error) {
	rctx, span := r.cfg.Tracer.Start(ctx, "route")
	if span.IsRecording() {
		span.SetAttributes(attribute.String("postern.target", req.Target.String()))
	}
	route, netCfg, err := r.route(rctx, req.Target, req.Access)
	if span.IsRecording() && route.Node.UUID != "" {
		span.SetAttributes(attribute.String("postern.node_uuid", route.Node.UUID))
	}
	// A refused route (not found, denied, ambiguous) ends its span as an
	// error with the real reason: the trace is the operator's, whatever
	// the user is told.
	observe.End(span, err)
	if err != nil {
		// A leaf without a live tunnel reads "offline" only to a user it
		// accepted before; to everyone else, not found.
		if off := r.offlineLeafError(ctx, req.Target, req.Cert, err); off != nil {
			return nil, route, off
		}
		// Already classified (NotFound, *AmbiguousHostError, ...); not
		// wrapped again so a miss stays cheap.
		return nil, route, err
	}
	ctx, span = r.cfg.Tracer.Start(ctx, "dial")
	if route.Leaf {
		// The leaf checks everything (its RBAC, locks, the node's
		// banner); Authorize's login check happens at the leaf's node.
		span.SetAttributes(attrDialVia.String("leaf"))
		conn, openssh, err := r.dialLeaf(ctx, req, route)
		route.LeafOpenSSH = openssh
		observe.End(span, err)
		return conn, route, err
	}
	conn, err := r.dialLocal(ctx, req, route.Node, netCfg)
	observe.End(span, err)
	return conn, route, err
}

// attrDialVia says how a dial reached the node: tunnel, peer, direct
// (the registered address) or leaf.
const attrDialVia = attribute.Key("postern.dial_via")

// dialLocal opens node, chosen in this cluster: first the checks every
// local node gets (Authorize, then locks), then the way this node is
// reached. Dialer order (reverse tunnels, several proxies): a tunnel on
// this proxy, then a peer proxy holding one, then the registered address,
// never for a tunnel-only node.
func (r *Router) dialLocal(ctx context.Context, req RouteRequest, node services.Node, netCfg *services.ClusterNetworkingConfig) (net.Conn, error) {
	if req.Authorize != nil {
		if err := req.Authorize(node); err != nil {
			return nil, trace.Wrap(err)
		}
	}
	// After RBAC: only a user who may reach the node learns it is locked.
	if r.cfg.Locks != nil {
		if err := r.cfg.Locks.Check(services.LockTarget{Node: node.UUID}); err != nil {
			return nil, trace.Wrap(err)
		}
	}
	timeout := netCfg.Spec.SSHDialTimeout.Value()
	if node.IsOpenSSH() {
		// A stock sshd opens no tunnel: its registered address is the one
		// way to it, and the proxy's health checker says whether anything
		// answers there.
		if r.cfg.Health != nil && !r.cfg.Health.Online(node.UUID) {
			r.metrics.dialFailures.Inc()
			return nil, openSSHOffline(node)
		}
		return r.dialDirect(ctx, node, timeout)
	}
	if node.Tunnel || r.hasLocalTunnel(node.UUID) || len(r.peerHolders(node.UUID)) > 0 {
		conn, err := r.dialTunnel(ctx, req, node, netCfg)
		switch {
		case err == nil:
			checked, err := checkBanner(ctx, conn, timeout)
			if err != nil {
				conn.Close()
				r.metrics.dialFailures.Inc()
				return nil, trace.ConnectionProblem(err, "node %q did not answer as an SSH server over its tunnel", node.Hostname)
			}
			return checked, nil
		case node.Tunnel || node.Addr == "":
			return nil, err
		}
		// A node with an address whose tunnel could not be used: the
		// address is the last resort.
		r.cfg.Logger.WithError(err).WithField("node", node.UUID).Debug("Tunnel dial failed; dialing the registered address.")
	}
	return r.dialDirect(ctx, node, timeout)
}

// dialDirect is dialAddr in a span of its own.
func (r *Router) dialDirect(ctx context.Context, node services.Node, timeout time.Duration) (net.Conn, error) {
	ctx, span := r.cfg.Tracer.Start(ctx, "dial.direct", oteltrace.WithSpanKind(oteltrace.SpanKindClient))
	conn, err := r.dialAddr(ctx, node, timeout)
	observe.End(span, err)
	return conn, err
}

// dialAddr dials node's registered address, bounded by timeout
// (ssh_dial_timeout), then waits (as long again at most) for the node's
// SSH identification string.
func (r *Router) dialAddr(ctx context.Context, node services.Node, timeout time.Duration) (net.Conn, error) {
	// Rule 6: the only address ever dialed is a registered node's Addr.
	// The timeout is real time on purpose: it bounds a kernel connect(),
	// which a fake clock cannot speed up, and a net.Dialer reads the
	// context deadline as wall-clock time.
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := r.cfg.Dialer.DialContext(dctx, "tcp", node.Addr)
	if err != nil {
		r.metrics.dialFailures.Inc()
		if ctx.Err() != nil {
			return nil, trace.ConnectionProblem(err, "dialing node %q (%s) canceled: %v", node.Hostname, node.Addr, context.Cause(ctx))
		}
		if errors.Is(dctx.Err(), context.DeadlineExceeded) {
			return nil, trace.ConnectionProblem(err, "dialing node %q (%s) timed out after %v", node.Hostname, node.Addr, timeout)
		}
		return nil, trace.ConnectionProblem(err, "failed to dial node %q (%s): %v", node.Hostname, node.Addr, err)
	}
	checked, err := checkBanner(ctx, conn, timeout)
	if err != nil {
		conn.Close()
		r.metrics.dialFailures.Inc()
		r.cfg.Logger.WithFields(observe.AddLogFields(ctx, logrus.Fields{"node": node.UUID, "addr": node.Addr})).WithError(err).Warn("Node did not answer as an SSH server; not relaying.")
		if ctx.Err() != nil {
			return nil, trace.ConnectionProblem(err, "dialing node %q (%s) canceled: %v", node.Hostname, node.Addr, context.Cause(ctx))
		}
		return nil, trace.ConnectionProblem(err, "node %q (%s) did not answer as an SSH server", node.Hostname, node.Addr)
	}
	return checked, nil
}

// openSSHOffline is the documented answer for an OpenSSH node whose
// server failed its health check.
func openSSHOffline(node services.Node) error {
	return trace.ConnectionProblem(nil, "node %q is offline: its SSH server does not answer", node.Hostname)
}

// Results of a tunnel dial, the postern_tunnel_routing_duration_seconds
// label.
const (
	resultFound    = "found"
	resultTimeout  = "timeout"
	resultCanceled = "canceled"
)

func (r *Router) hasLocalTunnel(uuid string) bool {
	return r.cfg.Tunnels != nil && r.cfg.Tunnels.HasTunnel(uuid)
}

func (r *Router) peerHolders(uuid string) []string {
	if r.cfg.Peers == nil {
		return nil
	}
	return r.cfg.Peers.PeerHolders(uuid)
}

// dialTunnel dials node over a tunnel: one on this proxy first, else
// through a peer proxy that holds one, waiting up to tunnel_find_timeout
// (on the Router's clock) for either to appear: a node reconnecting after
// a proxy restart, here or elsewhere, must not fail the sessions opened
// meanwhile. The wait blocks on the tunnel registry's and the tunnel
// locator's channels, not a poll. A node with an address does not wait:
// its address is the next choice.
func (r *Router) dialTunnel(ctx context.Context, req RouteRequest, node services.Node, netCfg *services.ClusterNetworkingConfig) (net.Conn, error) {
	timeout := netCfg.Spec.TunnelFindTimeout.Value()
	// The documented sentence, whether or not peers were asked ("this proxy"
	// is where the user's connection is); what a peer answered follows.
	offline := func(last error) error {
		if last != nil {
			return trace.ConnectionProblem(last, "node %q is offline: no tunnel reached this proxy within %v (peers: %v)", req.Target.Host, timeout, trace.UserMessage(last))
		}
		return trace.ConnectionProblem(nil, "node %q is offline: no tunnel reached this proxy within %v", req.Target.Host, timeout)
	}
	if r.cfg.Tunnels == nil && r.cfg.Peers == nil {
		return nil, offline(nil)
	}
	start := r.cfg.Clock.Now()
	record := func(result string) {
		r.metrics.tunnelRouting.WithLabelValues(result).Observe(r.cfg.Clock.Since(start).Seconds())
	}
	deadline := r.cfg.Clock.NewTimer(timeout)
	defer deadline.Stop()
	dst := req.Target.Host
	if req.Target.Port != "" {
		dst = net.JoinHostPort(req.Target.Host, req.Target.Port)
	}
	src := req.Source
	if src == "" {
		src = utils.ClientAddr(ctx)
	}
	var last error
	for {
		var registered, located <-chan struct{}
		if r.cfg.Tunnels != nil {
			registered = r.cfg.Tunnels.TunnelRegistered(node.UUID)
		}
		if r.cfg.Peers != nil {
			located = r.cfg.Peers.PeerLocated(node.UUID)
		}
		if r.hasLocalTunnel(node.UUID) {
			tctx, span := r.cfg.Tracer.Start(ctx, "dial.tunnel", oteltrace.WithSpanKind(oteltrace.SpanKindClient))
			conn, err := r.cfg.Tunnels.DialTunnel(tctx, node.UUID, src, dst)
			observe.End(span, err)
			if err == nil {
				record(resultFound)
				return conn, nil
			}
			if !trace.IsNotFound(err) {
				if ctx.Err() != nil || len(r.peerHolders(node.UUID)) == 0 {
					r.metrics.dialFailures.Inc()
					record(resultCanceled)
					return nil, trace.Wrap(err)
				}
				// The tunnel here failed under the dial (it is dying: its
				// node moving to another proxy, this one restarting) while
				// peers hold another: one of them serves the session.
				r.cfg.Logger.WithError(err).WithField("node", node.UUID).Debug("The tunnel here failed; dialing through a peer.")
				last = err
			}
			// The tunnel went away in between: look at peers, then wait.
		}
		if holders := r.peerHolders(node.UUID); len(holders) > 0 {
			conn, peer, err := r.dialPeers(ctx, holders, node.UUID, src, dst)
			if err == nil {
				record(resultFound)
				r.cfg.Logger.WithFields(logrus.Fields{"node": node.UUID, "peer": peer}).Debug("Dialed through a peer proxy.")
				return conn, nil
			}
			last = err
			if ctx.Err() != nil {
				record(resultCanceled)
				return nil, trace.ConnectionProblem(context.Cause(ctx), "dialing node %q canceled: %v", req.Target.Host, context.Cause(ctx))
			}
			// Stale leases or unreachable peers: wait for the next
			// lease or a tunnel here, within the same deadline.
		}
		if !node.Tunnel {
			return nil, offline(last)
		}
		select {
		case <-registered:
		case <-located:
		case <-deadline.Chan():
			record(resultTimeout)
			r.metrics.tunnelTimeouts.Inc()
			r.cfg.Logger.WithFields(observe.AddLogFields(ctx, logrus.Fields{"node": node.UUID, "timeout": timeout.String()})).Warn("No tunnel from the node reached this proxy or a peer in time.")
			return nil, offline(last)
		case <-ctx.Done():
			record(resultCanceled)
			return nil, trace.ConnectionProblem(context.Cause(ctx), "dialing node %q canceled while waiting for its tunnel: %v", req.Target.Host, context.Cause(ctx))
		}
	}
}

// dialPeers dials node through every candidate peer at once (at most
// maxPeerCandidates): the first to connect wins, the others are canceled
// and any that connected anyway are closed. It returns once every attempt
// has ended, so nothing it started outlives it.
func (r *Router) dialPeers(ctx context.Context, holders []string, node, source, dst string) (net.Conn, string, error) {
	if len(holders) > maxPeerCandidates {
		holders = holders[:maxPeerCandidates]
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		conn net.Conn
		peer string
		err  error
	}
	results := make(chan result, len(holders))
	for _, h := range holders {
		go func() {
			pctx, span := r.cfg.Tracer.Start(ctx, "dial.peer", oteltrace.WithSpanKind(oteltrace.SpanKindClient),
				oteltrace.WithAttributes(attribute.String("postern.peer", h)))
			conn, err := r.cfg.Peers.DialPeer(pctx, h, node, source, dst)
			observe.End(span, err)
			results <- result{conn, h, err}
		}()
	}
	var won result
	var errs []error
	for range holders {
		res := <-results
		switch {
		case res.err != nil:
			errs = append(errs, res.err)
		case won.conn == nil:
			won = res
			cancel()
		default:
			res.conn.Close()
		}
	}
	if won.conn != nil {
		return won.conn, won.peer, nil
	}
	r.metrics.dialFailures.Inc()
	return nil, "", trace.NewAggregate(errs...)
}

// Via says how DialHost would reach node now: over a tunnel on this
// proxy, through a peer proxy that holds one, by waiting for one, or at
// its registered address.
func (r *Router) Via(node services.Node) string {
	if node.IsOpenSSH() {
		if r.cfg.Health != nil && !r.cfg.Health.Online(node.UUID) {
			return "registered address " + node.Addr + " (an OpenSSH server; offline: its SSH server does not answer)"
		}
		return "registered address " + node.Addr + " (an OpenSSH server)"
	}
	holders := r.peerHolders(node.UUID)
	switch {
	case r.hasLocalTunnel(node.UUID):
		return "tunnel on this proxy"
	case len(holders) > 0 && node.Tunnel && r.cfg.Tunnels == nil:
		// pctl route: no tunnels of its own, every holder is a peer.
		return "its reverse tunnel (a tunnel-only node: never dialed directly), via peer " + strings.Join(holders, ", ")
	case len(holders) > 0:
		return "via peer " + strings.Join(holders, ", ") + " (its tunnel is on that proxy)"
	case node.Tunnel && r.cfg.Peers != nil:
		return "tunnel (none on this proxy or a peer now: a dial waits tunnel_find_timeout for one)"
	case node.Tunnel && r.cfg.Tunnels != nil:
		return "tunnel (none on this proxy now: a dial waits tunnel_find_timeout for one)"
	case node.Tunnel:
		return "its reverse tunnel (a tunnel-only node: never dialed directly)"
	}
	return "registered address " + node.Addr
}
