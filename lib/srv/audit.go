package srv

import (
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// emit records an audit event of this connection: who (the Postern user),
// as which login, from where, on which server, tied together by conn_id
// and, for sessions, session_id.
func (c *conn) emit(typ string, fields events.Fields) {
	if fields == nil {
		fields = events.Fields{}
	}
	fields[events.FieldConnID] = c.id
	fields[events.FieldLogin] = c.auth.id.Login
	fields[events.FieldRemoteAddr] = c.nc.RemoteAddr().String()
	if c.auth.id.RemoteRoles != nil {
		// A root cluster's user: which cluster vouched for them, and the
		// roles they came with (the event's cluster is this one's).
		fields[events.FieldUserCluster] = c.auth.id.Cluster
		fields[events.FieldRemoteRoles] = c.auth.id.RemoteRoles
		fields[events.FieldRoles] = c.auth.id.Roles
	}
	if c.auth.node.UUID != "" {
		fields[events.FieldServerID] = c.auth.node.UUID
		fields[events.FieldServerHostname] = c.auth.node.Hostname
	}
	c.cfg.Audit.Emit(c.ctx, events.Event{Type: typ, User: c.auth.id.User, Fields: fields})
}

// emitDenied records a refused authentication. The certificate is not
// trusted at this point, so the user it names is recorded as a claim.
func (s *Server) emitDenied(meta ssh.ConnMetadata, cert *ssh.Certificate, reason string) {
	user := cert.KeyId
	if u := cert.Permissions.Extensions[services.CertExtensionUser]; u != "" {
		user = u
	}
	fields := events.Fields{
		events.FieldLogin:      meta.User(),
		events.FieldRemoteAddr: meta.RemoteAddr().String(),
		events.FieldReason:     reason,
	}
	if c := cert.Permissions.Extensions[services.CertExtensionCluster]; c != "" && c != s.cfg.ClusterName {
		// Claimed, like the user: the certificate may not have checked out.
		fields[events.FieldUserCluster] = c
	}
	if s.policy.checkNode {
		node := s.cfg.GetNode()
		fields[events.FieldServerID] = node.UUID
		fields[events.FieldServerHostname] = node.Hostname
	}
	s.cfg.Audit.Emit(s.ctx, events.Event{Type: events.AccessDenied, User: user, Fields: fields})
}

// emitRefused records a request refused on an authenticated connection:
// a -L, -R or -A forward, or a session refused because the user's access
// changed while the connection stayed open. kind says which ("-L", "-R",
// "-A", "session"), target what was asked for.
func (c *conn) emitRefused(kind, target, reason string) {
	fields := events.Fields{events.FieldKind: kind, events.FieldReason: reason}
	if target != "" {
		fields[events.FieldTarget] = target
	}
	c.emit(events.AccessDenied, fields)
}

// unavailableReason is the audit reason of a connection refused because
// what authentication needs (the user CA, the roles) could not be read:
// the refusal is the auth server's or the backend's, not the user's.
func unavailableReason(err error) string {
	return "auth server or backend unavailable: " + err.Error()
}

// emitCapRefused records an authenticated connection refused by the
// per-user connection cap.
func (s *Server) emitCapRefused(sconn *ssh.ServerConn, res *authResult, err error) {
	fields := events.Fields{
		events.FieldLogin:      res.id.Login,
		events.FieldRemoteAddr: sconn.RemoteAddr().String(),
		events.FieldReason:     err.Error(),
		events.FieldKind:       "connection",
	}
	if res.node.UUID != "" {
		fields[events.FieldServerID] = res.node.UUID
		fields[events.FieldServerHostname] = res.node.Hostname
	}
	s.cfg.Audit.Emit(s.ctx, events.Event{Type: events.AccessDenied, User: res.id.User, Fields: fields})
}
