package authz

import (
	"bytes"
	"net"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"golang.org/x/crypto/ssh"
)

// HostKeyCallback accepts a server only with a host certificate signed by
// one of cas, valid now on clock (nil: the real clock), whose principals
// name the host that was dialed (the address given to the SSH handshake,
// without its port). A plain host key is refused: nothing in Postern
// trusts a host on first use. psh, the web terminal, the tests' clients
// and the proxy's own node dials all check nodes with it.
func HostKeyCallback(cas []ssh.PublicKey, clock clockwork.Clock) ssh.HostKeyCallback {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return func(addr string, _ net.Addr, key ssh.PublicKey) error {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		return CheckHostCert(cas, host, key, clock)
	}
}

// CheckHostCert checks that key is a host certificate signed by one of
// cas, valid now on clock, naming principal.
func CheckHostCert(cas []ssh.PublicKey, principal string, key ssh.PublicKey, clock clockwork.Clock) error {
	cert, ok := key.(*ssh.Certificate)
	if !ok {
		return trace.AccessDenied("the server presented a plain %s key, not a host certificate", key.Type())
	}
	if cert.CertType != ssh.HostCert {
		return trace.AccessDenied("the server presented a user certificate, not a host certificate")
	}
	if !IsAuthority(cas, cert.SignatureKey) {
		return trace.AccessDenied("the host certificate (key id %q) is not signed by a trusted host CA", cert.KeyId)
	}
	// CheckCert verifies the CA's signature, the validity window on clock
	// and that principal is among the certificate's principals.
	checker := ssh.CertChecker{Clock: clock.Now}
	if err := checker.CheckCert(principal, cert); err != nil {
		return trace.AccessDenied("host certificate for %q: %v", principal, err)
	}
	return nil
}

// IsAuthority reports whether key is one of cas.
func IsAuthority(cas []ssh.PublicKey, key ssh.PublicKey) bool {
	want := key.Marshal()
	for _, ca := range cas {
		if bytes.Equal(ca.Marshal(), want) {
			return true
		}
	}
	return false
}
