package srv

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/services"
)

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

// loginRefusal is what a user whose roles do not allow login is told.
// Unlike the audit reason it names neither the node's labels nor a role.
// It may be sent before the client has proven it holds the certificate's
// key (x/crypto runs the callback on the key query), so it says only what
// the certificate itself says: its logins, which are the user's roles'.
// `psh ls` lists the logins allowed per node to whoever is logged in.
func loginRefusal(cert *ssh.Certificate, login string) string {
	if !slices.Contains(cert.ValidPrincipals, login) {
		return fmt.Sprintf("postern: login %q is not allowed by your roles (your logins: %s)", login, strings.Join(cert.ValidPrincipals, ", "))
	}
	return fmt.Sprintf("postern: login %q is not allowed by your roles on this node (see `psh ls`)", login)
}

// onlyPrincipalWrong reports whether cert is valid, signed by checker's
// authority, for any of its own principals: the login asked for was the
// only fault. x/crypto checks the principal first and stops there, so
// the rest is checked again with a principal the certificate has.
func onlyPrincipalWrong(checker *ssh.CertChecker, cert *ssh.Certificate, login string) bool {
	if len(cert.ValidPrincipals) == 0 || slices.Contains(cert.ValidPrincipals, login) {
		return false
	}
	return checker.CheckCert(cert.ValidPrincipals[0], cert) == nil
}
