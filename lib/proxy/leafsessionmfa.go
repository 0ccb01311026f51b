package proxy

import (
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/services"
)

// Per-session MFA (role option require_session_mfa) for a root user's
// session to a leaf's node. The proof of a fresh factor is a per-session
// certificate, and only a cluster's own auth issues one, for its own
// users and nodes: the leaf cannot issue one to a root user, and the
// root's are bound to the root's nodes. So where the leaf's roles (the
// root user's mapped roles) require a fresh factor for a node, a root
// user's session to it is refused, with the reason, whatever the root's
// roles say: deny by default, never a session without the factor.

// leafSessionMFARefusal says why a root user's session to node of leaf
// cluster is refused, or nil if the leaf's roles do not require a fresh
// factor for it. It deliberately does not carry
// proxyapi.MsgSessionMFARequired: psh reads that as "ask for a code", and
// no code can get this session a certificate.
func leafSessionMFARefusal(id *authz.Identity, node *services.Node, cluster string) error {
	if id.CheckSessionMFA(node, cluster) == nil {
		return nil
	}
	return trace.AccessDenied("node %q of cluster %q requires a fresh second factor for each session (require_session_mfa), "+
		"and a per-session certificate cannot be issued to a user of another cluster: log in to cluster %q itself to reach it",
		node.Hostname, cluster, cluster)
}
