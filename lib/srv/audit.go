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
	if s.cfg.Proxy == nil {
		node := s.cfg.GetNode()
		fields[events.FieldServerID] = node.UUID
		fields[events.FieldServerHostname] = node.Hostname
	}
	s.cfg.Audit.Emit(s.ctx, events.Event{Type: events.AccessDenied, User: user, Fields: fields})
}
