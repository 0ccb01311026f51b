package web

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/proxy"
)

// The web terminal's audit events carry method "web" and kind "terminal",
// so that one query tells them from the SSH port's.
const (
	auditMethod = "web"
	auditKind   = "terminal"
)

// emitTerminalAuthFailed records a terminal socket whose first message did
// not authenticate (no, wrong or expired token, no cookie). Nobody is
// known yet: the record names the address.
func (s *Server) emitTerminalAuthFailed(r *http.Request, err error) {
	s.cfg.WebSessions.Audit.Emit(s.web.ctx, events.Event{Type: events.AccessDenied, Fields: events.Fields{
		events.FieldMethod:     auditMethod,
		events.FieldKind:       auditKind,
		events.FieldRemoteAddr: r.RemoteAddr,
		events.FieldReason:     trace.UserMessage(err),
	}})
}

// auditRoute records a terminal refused by RBAC (access.denied, with the
// node that was refused: the user is told "not found", the audit log
// says why) or by an ambiguous target (route.ambiguous with every
// candidate: the audit log is for admins, who see all nodes). Other
// routing errors are not audited.
func (t *termSocket) auditRoute(ctx context.Context, p *TerminalParams, route proxy.Route, err error) {
	fields := events.Fields{
		events.FieldMethod:     auditMethod,
		events.FieldKind:       auditKind,
		events.FieldTarget:     p.Host,
		events.FieldLogin:      p.Login,
		events.FieldRemoteAddr: t.remoteAddr,
	}
	typ := events.AccessDenied
	var ld *proxy.LeafDeniedError
	switch {
	case err == nil && route.Leaf:
		// The root's record of a terminal routed to a leaf.
		typ = events.RouteLeaf
		fields[events.FieldRemoteCluster] = route.Cluster
	case errors.As(err, &ld):
		fields[events.FieldReason] = "leaf cluster " + strconv.Quote(ld.Cluster) + " refused the user (" + ld.Reason + ")"
		fields[events.FieldRemoteCluster] = ld.Cluster
	case err == nil:
		return
	case trace.IsAccessDenied(err):
		fields[events.FieldReason] = err.Error()
		if route.Node.UUID != "" {
			fields[events.FieldServerID] = route.Node.UUID
			fields[events.FieldServerHostname] = route.Node.Hostname
		}
	case trace.IsNotFound(err) && len(route.Hidden) > 0:
		// The user is told "not found"; the audit log says that nodes
		// matched but the user's roles may not reach them.
		fields[events.FieldReason] = "the user's roles may not reach the matching nodes"
		fields[events.FieldCandidates] = route.Hidden
		if len(route.Hidden) == 1 {
			fields[events.FieldServerID] = route.Hidden[0]
		}
	case proxy.IsAmbiguousHost(err):
		typ = events.RouteAmbiguous
		uuids := make([]string, 0, len(route.Candidates))
		for _, n := range route.Candidates {
			uuids = append(uuids, n.UUID)
		}
		fields[events.FieldCandidates] = uuids
	default:
		return
	}
	t.srv.cfg.WebSessions.Audit.Emit(ctx, events.Event{Type: typ, User: t.live.user, Fields: fields})
}

// emitResumeRefused records a refused resume: a token of another user or
// web session, or one that is unknown, used or whose terminal ended.
func (s *Server) emitResumeRefused(r *http.Request, live *liveSession, err error) {
	s.cfg.WebSessions.Audit.Emit(s.web.ctx, events.Event{Type: events.AccessDenied, User: live.user, Fields: events.Fields{
		events.FieldMethod:     auditMethod,
		events.FieldKind:       auditKind,
		events.FieldRemoteAddr: r.RemoteAddr,
		events.FieldReason:     trace.UserMessage(err),
	}})
}

// emitEnd records the end of a web terminal with its reason (the node
// records its own session.end; this one says why the proxy ended it:
// grace expiry, logout, the browser, the shell's exit).
func (t *term) emitEnd(end *sessionEnd) {
	t.mu.Lock()
	out, in := t.hist.end(), t.input
	t.mu.Unlock()
	fields := events.Fields{
		events.FieldMethod:     auditMethod,
		events.FieldKind:       auditKind,
		events.FieldSessionID:  t.id,
		events.FieldTarget:     t.params.Host,
		events.FieldLogin:      t.params.Login,
		events.FieldRemoteAddr: t.remoteAddr,
		events.FieldReason:     end.reason,
		events.FieldBytesOut:   out,
		events.FieldBytesIn:    in,
	}
	if end.code >= 0 {
		fields[events.FieldExitCode] = end.code
	}
	t.closeRecording(end, fields)
	// Not the terminal's context (it has ended), nor the server's alone
	// (a shutdown ends it too, and those ends are recorded as well).
	t.srv.cfg.WebSessions.Audit.Emit(context.WithoutCancel(t.srv.web.ctx), events.Event{Type: events.SessionEnd, User: t.live.user, Fields: fields})
}
