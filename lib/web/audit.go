package web

import (
	"context"
	"net/http"

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

// auditRoute records a terminal's routing decision as every front door
// does (proxy.RouteEvent: access.denied with the node that was refused,
// while the user is told "not found"; route.ambiguous with every
// candidate; route.leaf).
func (t *termSocket) auditRoute(ctx context.Context, target proxy.Target, p *TerminalParams, route proxy.Route, err error) {
	ev, ok := proxy.RouteEvent(proxy.RouteAudit{
		Method: auditMethod, Kind: auditKind, User: t.live.user, Login: p.Login, RemoteAddr: t.remoteAddr,
	}, target, route, err)
	if ok {
		t.srv.cfg.WebSessions.Audit.Emit(ctx, ev)
	}
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
