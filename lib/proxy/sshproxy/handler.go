// Package sshproxy is the proxy mode of the SSH server: it plugs the shared
// proxy.Router into lib/srv's ProxyHandler seam, so that the `proxy:`
// subsystem and `direct-tcpip` (ssh -J) route exactly like every other path.
//
// RBAC happens here, before the routing decision: the proxy cannot see
// which login the user will present to the node (that is inside the
// encrypted inner SSH connection), so only nodes the user may reach with
// any of the logins their certificate carries take part in routing. The
// node itself then checks the actual login. A user who may not reach a node
// gets the same "not found" answer as for a node that does not exist, and
// an ambiguous-host answer never lists such a node, so the proxy never
// confirms what a user is not allowed to see.
package sshproxy

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"strings"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/utils"
)

// Config configures the handler.
type Config struct {
	// Router decides and dials; required.
	Router *proxy.Router
	// Nodes serves the `nodes` subsystem (psh ls); nil means that
	// subsystem is refused.
	Nodes NodeLister
	// Recordings serves the `recordings` and `recording:ID` subsystems
	// (psh recordings ls, psh play); nil means they are refused.
	Recordings RecordingSource
	// Locks, when set, ends open hops to an OpenSSH node once a lock
	// covers the node (openssh.go); a Postern node does that itself.
	Locks srv.LockChecker
	// Requests serves the `access-request:` subsystem (psh request);
	// nil means it is refused.
	Requests AccessRequests
	// Deps: Audit receives route.ambiguous and access.denied; Logger
	// (component proxy:ssh). Zero fields get observe's defaults.
	observe.Deps
	// SessionCerts issues per-session certificates (sessionmfa.go); nil
	// means the session-mfa-cert subsystem is refused (nodes that need
	// one then cannot be reached with psh ssh).
	SessionCerts SessionCertIssuer
}

// CheckAndSetDefaults validates the config.
func (c *Config) CheckAndSetDefaults() error {
	if c.Router == nil {
		return trace.BadParameter("sshproxy: missing Router")
	}
	c.Deps.SetDefaults(observe.ComponentProxySSH)
	return nil
}

// Handler implements srv.ProxyHandler.
type Handler struct {
	cfg Config
}

var _ srv.ProxyHandler = (*Handler)(nil)

// New builds a handler.
func New(cfg Config) (*Handler, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	return &Handler{cfg: cfg}, nil
}

// Subsystem serves `proxysites`, `nodes[@CLUSTER]`, `recordings`, `access-request:{JSON}`,
// `recording:ID`, `recording-chunks:ID`, `route:HOST[:PORT][@CLUSTER]` and
// `proxy:HOST[:PORT][@CLUSTER]`.
func (h *Handler) Subsystem(ctx context.Context, id *authz.Identity, name string) (srv.SubsystemFunc, error) {
	if name == proxyapi.SubsystemSites {
		// Only the clusters this user may reach (each leaf is asked).
		sites := h.cfg.Router.Sites(ctx, id.Cert)
		return func(ctx context.Context, ch ssh.Channel) error {
			data, err := json.Marshal(sites)
			if err != nil {
				return trace.Wrap(err)
			}
			_, err = ch.Write(data)
			return trace.Wrap(err)
		}, nil
	}
	if name == proxyapi.SubsystemNodes {
		return h.nodesSubsystem(id)
	}
	if cluster, ok := strings.CutPrefix(name, proxyapi.SubsystemNodesForCluster); ok {
		if cluster == h.cfg.Router.ClusterName() {
			return h.nodesSubsystem(id)
		}
		return h.leafNodesSubsystem(ctx, id, cluster)
	}
	if strings.HasPrefix(name, proxyapi.SubsystemAccessRequestPrefix) {
		return h.accessRequestSubsystem(ctx, id, name)
	}
	if name == proxyapi.SubsystemSessionMFACert {
		return h.sessionMFACertSubsystem(id)
	}
	if strings.HasPrefix(name, proxyapi.SubsystemRoutePrefix) {
		return h.routeSubsystem(ctx, id, name)
	}
	if name == proxyapi.SubsystemRecordings {
		return h.recordingsSubsystem(ctx, id)
	}
	if strings.HasPrefix(name, proxyapi.SubsystemRecordingPrefix) {
		return h.playSubsystem(ctx, id, name)
	}
	if strings.HasPrefix(name, proxyapi.SubsystemRecordingChunksPrefix) {
		return h.chunksSubsystem(ctx, id, name)
	}
	target, err := proxy.ParseProxySubsystem(name)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	conn, err := h.dial(ctx, id, target, "subsystem")
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return func(ctx context.Context, ch ssh.Channel) error {
		_, _, err := utils.Splice(ctx, ch, conn)
		if ctx.Err() != nil {
			// The client hung up: the normal end of a tunnel, not a
			// failure to report on a channel nobody reads any more.
			return nil
		}
		return trace.Wrap(err)
	}, nil
}

// DialDirectTCPIP routes an `ssh -J` hop.
func (h *Handler) DialDirectTCPIP(ctx context.Context, id *authz.Identity, req srv.DirectTCPIPRequest) (net.Conn, error) {
	target := proxy.Target{Host: req.Host, Port: strconv.FormatUint(uint64(req.Port), 10)}
	return h.dial(ctx, id, target, "direct-tcpip")
}

// dial routes target among the nodes the user may reach and dials the
// chosen one.
func (h *Handler) dial(ctx context.Context, id *authz.Identity, target proxy.Target, via string) (net.Conn, error) {
	log := h.cfg.Logger.WithFields(observe.AddLogFields(ctx, logrus.Fields{"user": id.User, "target": target.String(), "via": via}))
	conn, route, err := h.cfg.Router.DialHost(ctx, proxy.RouteRequest{
		Target: target,
		// RBAC first, then routing (rule 5, docs/reference.md Routing): a node
		// the user may not reach takes no part in the decision.
		Access: id.CanReach,
		// A leaf decides from the certificate itself.
		Cert: id.Cert,
	})
	if err != nil {
		h.auditRoute(ctx, id, target, via, route, err)
		var ld *proxy.LeafDeniedError
		if errors.As(err, &ld) {
			// Told "cluster not found", like an unknown cluster; the
			// leaf's audit log names the unmapped roles.
			log.WithError(err).WithField("reason", ld.Reason).Warn("Access denied by a leaf cluster.")
			return nil, trace.Wrap(err)
		}
		// A node RBAC keeps from the user looks like one that does not
		// exist; the audit log says which.
		visible, denied := proxy.HideDenied(target, route, err)
		if denied {
			log.WithError(err).WithField("hidden", route.Hidden).Warn("Access denied.")
			return nil, trace.Wrap(visible)
		}
		log.WithError(err).Info("Routing failed.")
		return nil, trace.Wrap(err)
	}
	if route.Leaf && route.LeafOpenSSH != nil {
		// A leaf's OpenSSH node trusts the leaf's user CA only, and
		// would enforce a root certificate's logins, not the role_map's
		// (lib/auth/opensshroot.go): the user's own certificate cannot
		// log in there, and it must not. Only the web terminal, which
		// holds the session's key, logs in with the leaf's certificate.
		conn.Close()
		host := route.Target.Host + "." + route.Cluster
		err := trace.AccessDenied("node %q is an OpenSSH server of leaf cluster %q, which accepts that cluster's certificates only: open it in the web terminal of this proxy, or log in to cluster %q's own proxy", host, route.Cluster, route.Cluster)
		h.emit(ctx, events.AccessDenied, id, target, via, events.Fields{
			events.FieldReason: err.Error(), events.FieldRemoteCluster: route.Cluster, events.FieldServerID: route.LeafOpenSSH.UUID,
		})
		log.WithField("cluster", route.Cluster).Info("Refused a hop to a leaf cluster's OpenSSH node.")
		return nil, err
	}
	if err := h.checkRouteSessionMFA(ctx, id, route, target, via); err != nil {
		conn.Close()
		return nil, trace.Wrap(err)
	}
	if route.Leaf {
		// The root's record of the hop; the leaf audits the session.
		h.auditRoute(ctx, id, target, via, route, nil)
		log.WithFields(logrus.Fields{"cluster": route.Cluster, "reason": route.Reason}).Debug("Routed to a leaf cluster.")
		return conn, nil
	}
	log.WithFields(logrus.Fields{"node": route.Node.UUID, "addr": route.Node.Addr, "reason": route.Reason}).Debug("Routed.")
	if route.Node.IsOpenSSH() {
		return h.auditOpenSSH(ctx, id, target, via, route.Node, conn), nil
	}
	return conn, nil
}

// auditRoute records a routing decision as every front door does
// (proxy.RouteEvent).
func (h *Handler) auditRoute(ctx context.Context, id *authz.Identity, target proxy.Target, via string, route proxy.Route, err error) {
	ev, ok := proxy.RouteEvent(proxy.RouteAudit{Method: auditMethod, Kind: via, User: id.User, Login: id.Login, Logins: id.Logins()}, target, route, err)
	if ok {
		h.cfg.Audit.Emit(ctx, ev)
	}
}

// auditMethod is the SSH port's door in the audit log (the web
// terminal's is "web").
const auditMethod = "ssh"

// emit records an audit event about a routing decision.
func (h *Handler) emit(ctx context.Context, typ string, id *authz.Identity, target proxy.Target, via string, fields events.Fields) {
	fields[events.FieldTarget] = target.String()
	fields[events.FieldLogin] = id.Login
	fields[events.FieldKind] = via
	h.cfg.Audit.Emit(ctx, events.Event{Type: typ, User: id.User, Fields: fields})
}
