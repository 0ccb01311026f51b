package authz

import (
	"encoding/json"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/services"
)

// CheckSessionMFA decides whether id's certificate may open a session to
// node of cluster: a per-session certificate only to the node (and
// cluster) it names; a normal one only where no role that reaches the
// node requires a fresh factor. A pure decision over the certificate and
// the roles, shared with the web terminal.
func (id *Identity) CheckSessionMFA(node *services.Node, cluster string) error {
	if raw, ok := id.Cert.Permissions.Extensions[services.CertExtensionSessionMFA]; ok {
		var t services.SessionMFATarget
		if err := json.Unmarshal([]byte(raw), &t); err != nil {
			return trace.AccessDenied("malformed per-session certificate")
		}
		if t.Node != node.UUID || t.Cluster != cluster {
			return trace.AccessDenied("this per-session certificate was issued for another node: get a new one for %q (psh ssh asks for it)", node.Hostname)
		}
		return nil
	}
	if id.Checker != nil && id.Checker.SessionMFARequired(node) {
		return trace.AccessDenied("%s: connect with psh ssh, or ssh with the config of psh config, which ask for it (a bare ssh -J cannot)", proxyapi.MsgSessionMFARequired)
	}
	return nil
}
