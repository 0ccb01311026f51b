package srv

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/services"
)

// Identity is who a connection authenticated as, read from the user
// certificate. The proxy-mode handlers receive it to make their own
// decisions (RBAC against the target node) with Checker.
type Identity struct {
	// Login is the OS login the client asked for (the SSH user name).
	Login string
	// User is the Postern user (certificate extension, else KeyId).
	User string
	// Roles are the role names granted at issue time.
	Roles []string
	// Traits are the user's traits at issue time.
	Traits map[string][]string
	// Cluster is the issuing cluster.
	Cluster string
	// Cert is the certificate itself.
	Cert *ssh.Certificate
	// Checker answers RBAC questions with the roles as they were when the
	// connection authenticated (fetched live from the AccessPoint).
	Checker *services.AccessChecker
}

// Permits are what a connection may do beyond a session, decided once at
// authentication: the certificate must permit it (permit-* extensions,
// as OpenSSH honours them) and a role reaching this node must allow it.
type Permits struct {
	PTY             bool
	PortForwarding  bool
	AgentForwarding bool
}

// Certificate extensions OpenSSH defines (PROTOCOL.certkeys).
const (
	extPermitPTY             = "permit-pty"
	extPermitPortForwarding  = "permit-port-forwarding"
	extPermitAgentForwarding = "permit-agent-forwarding"
)

// identityFromCert reads Postern's extensions. A certificate from the
// right CA but without readable roles grants nothing, so it is refused
// rather than treated as "no roles".
func identityFromCert(cert *ssh.Certificate, login string) (*Identity, error) {
	ext := cert.Permissions.Extensions
	id := &Identity{Login: login, Cert: cert, User: ext[services.CertExtensionUser], Cluster: ext[services.CertExtensionCluster]}
	if id.User == "" {
		id.User = cert.KeyId
	}
	if id.User == "" {
		return nil, trace.AccessDenied("certificate names no Postern user")
	}
	rolesJSON, ok := ext[services.CertExtensionRoles]
	if !ok {
		return nil, trace.AccessDenied("certificate of user %q carries no roles extension", id.User)
	}
	if err := strictUnmarshal(rolesJSON, &id.Roles); err != nil {
		return nil, trace.AccessDenied("certificate of user %q: malformed roles extension: %v", id.User, err)
	}
	if traitsJSON, ok := ext[services.CertExtensionTraits]; ok && traitsJSON != "" {
		if err := strictUnmarshal(traitsJSON, &id.Traits); err != nil {
			return nil, trace.AccessDenied("certificate of user %q: malformed traits extension: %v", id.User, err)
		}
	}
	return id, nil
}

func strictUnmarshal(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return trace.BadParameter("trailing data")
	}
	return nil
}

// checkCertificate makes the checks x/crypto's CertChecker does not: the
// certificate's cluster extension, when present, must be ours (a CA key
// shared by mistake between clusters must not mix their users).
func checkCertificate(id *Identity, clusterName string) error {
	if id.Cluster != "" && id.Cluster != clusterName {
		return trace.AccessDenied("certificate of user %q was issued by cluster %q, not %q", id.User, id.Cluster, clusterName)
	}
	return nil
}

// isUserAuthority reports whether key is one of the CA's keys.
func isUserAuthority(ca *services.CertAuthority, key ssh.PublicKey) bool {
	if ca == nil {
		return false
	}
	want := key.Marshal()
	for _, s := range ca.SSHPublicKeys {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(s))
		if err != nil {
			continue
		}
		if bytes.Equal(pub.Marshal(), want) {
			return true
		}
	}
	return false
}

// NewAccessChecker fetches the identity's roles live and builds a checker.
// A role deleted since the certificate was issued simply grants nothing
// (deny by default); any other lookup failure fails closed.
func NewAccessChecker(ctx context.Context, ap AccessPoint, roleNames []string, traits map[string][]string) (*services.AccessChecker, error) {
	roles := make([]*services.Role, 0, len(roleNames))
	for _, name := range roleNames {
		r, err := ap.GetRole(ctx, name)
		if trace.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, trace.Wrap(err, "fetching role %q", name)
		}
		roles = append(roles, r)
	}
	return services.NewAccessChecker(roles, traits), nil
}

// authorizeNode is the node-mode RBAC decision for one connection.
func authorizeNode(checker *services.AccessChecker, node *services.Node, login string) error {
	return checker.CheckAccessToNode(node, login)
}

// permitsFor combines the certificate's permit-* extensions with the
// roles: both must allow.
func permitsFor(certExt map[string]string, checker *services.AccessChecker, node *services.Node) Permits {
	_, pty := certExt[extPermitPTY]
	_, pf := certExt[extPermitPortForwarding]
	_, af := certExt[extPermitAgentForwarding]
	return Permits{
		PTY:             pty,
		PortForwarding:  pf && checker.CanPortForward(node),
		AgentForwarding: af && checker.CanForwardAgent(node),
	}
}

// envAllowed is the allow-list for `env` requests: locale, terminal type
// and time zone, as OpenSSH's default AcceptEnv plus what terminals set.
// Anything else could change how the login's shell or the dynamic loader
// behaves (LD_PRELOAD, BASH_ENV, PATH), so it is ignored.
func envAllowed(name string) bool {
	switch name {
	case "LANG", "TERM", "COLORTERM", "TZ", "LANGUAGE":
		return true
	}
	return strings.HasPrefix(name, "LC_") && len(name) > 3
}

// certValidityReason turns x/crypto's terse errors into the reason logged.
func certValidityReason(err error, cert *ssh.Certificate, now time.Time) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "expired"):
		return "certificate expired at " + time.Unix(int64(cert.ValidBefore), 0).UTC().Format(time.RFC3339) +
			" (now " + now.UTC().Format(time.RFC3339) + ")"
	case strings.Contains(msg, "not yet valid"):
		return "certificate not valid before " + time.Unix(int64(cert.ValidAfter), 0).UTC().Format(time.RFC3339)
	}
	return strings.TrimPrefix(msg, "ssh: ")
}
