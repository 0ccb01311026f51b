package srv

import (
	"context"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
)

// IdentifyRootUser is what a leaf's proxy knows of a user whose root
// proxy asks it to route a connection (over the leaf's tunnel to the
// root): the certificate the user authenticated with at the root, checked
// exactly as this cluster's SSH servers check it (userCAFor: only a root
// this cluster trusts, enabled, and that root's user CA; the validity
// window on clock), its roles mapped through the role_map and loaded. The
// login is not checked: the proxy cannot see which one the user will
// present to the node inside the encrypted connection (the node checks
// it), so routing uses every login the certificate names, as the proxy
// port does. A certificate of this cluster itself is refused: only roots
// send these requests. Errors are AccessDenied with the reason (for the
// audit log) or, when the access point fails, its error.
func IdentifyRootUser(ctx context.Context, ap AccessPoint, clusterName string, clock clockwork.Clock, cert *ssh.Certificate) (*authz.Identity, error) {
	if cert == nil || cert.CertType != ssh.UserCert {
		return nil, trace.AccessDenied("not a user certificate")
	}
	ca, trusted, reason, err := userCAFor(ctx, ap, clusterName, cert)
	switch {
	case reason != "":
		return nil, trace.AccessDenied("%s", reason)
	case err != nil:
		return nil, trace.Wrap(err)
	case trusted == nil:
		return nil, trace.AccessDenied("certificate of user %q was issued by this cluster, not by a root", cert.KeyId)
	}
	if len(cert.ValidPrincipals) == 0 {
		return nil, trace.AccessDenied("certificate of user %q names no login", cert.KeyId)
	}
	checker := ssh.CertChecker{
		IsUserAuthority: func(k ssh.PublicKey) bool { return isUserAuthority(ca, k) },
		Clock:           clock.Now,
	}
	if !checker.IsUserAuthority(cert.SignatureKey) {
		return nil, trace.AccessDenied("certificate is not signed by the user CA of cluster %q", ca.ClusterName)
	}
	if err := checker.CheckCert(cert.ValidPrincipals[0], cert); err != nil {
		return nil, trace.AccessDenied("%s", certValidityReason(err, cert, clock.Now()))
	}
	id, err := authz.FromCertificate(cert, "")
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := id.MapTrusted(trusted); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := id.Load(ctx, ap); err != nil {
		return nil, trace.Wrap(err)
	}
	return id, nil
}
