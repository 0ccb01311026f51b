package srv

import (
	"bytes"
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
