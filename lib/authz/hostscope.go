package authz

import (
	"net"
	"strings"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"golang.org/x/crypto/ssh"
)

// HostAuthority is a host CA key and the host names it may vouch for: what
// one known_hosts line `@cert-authority PATTERNS KEY` says. A root's own
// host CA vouches for every name ("*"); a leaf's only for "*.LEAF", so a
// leaf's administrator, who holds that CA, cannot impersonate a root host
// (or another leaf's) to psh or to the web terminal.
type HostAuthority struct {
	// Key is the CA's public key.
	Key ssh.PublicKey
	// Patterns are OpenSSH host patterns ("*" and "?" wildcards, "!" to
	// negate, compared case-insensitively as OpenSSH's match_hostname
	// does). Empty vouches for nothing.
	Patterns []string
}

// HostAuthorityPatterns are the known_hosts patterns of cluster's host CA
// as seen from local: "*" for the local cluster, "*.CLUSTER" for a leaf.
func HostAuthorityPatterns(cluster, local string) []string {
	if cluster == "" || strings.EqualFold(cluster, local) {
		return []string{"*"}
	}
	return []string{"*." + cluster}
}

// ClusterHostName is the name a host of cluster is checked under, from
// local: the host itself in the local cluster, HOST.CLUSTER in a leaf
// (unless already written so). Nodes carry `hostname.CLUSTER` and
// `uuid.CLUSTER` among their host certificate's principals, and only the
// suffixed name is vouched for by the leaf's CA.
func ClusterHostName(host, cluster, local string) string {
	if cluster == "" || strings.EqualFold(cluster, local) || HasClusterSuffix(host, cluster) {
		return host
	}
	return host + "." + cluster
}

// HasClusterSuffix reports whether host is written NAME.CLUSTER.
func HasClusterSuffix(host, cluster string) bool {
	return cluster != "" && len(host) > len(cluster)+1 && strings.EqualFold(host[len(host)-len(cluster)-1:], "."+cluster)
}

// VouchesFor reports whether a may vouch for host: one positive pattern
// matches and no negated one does.
func (a HostAuthority) VouchesFor(host string) bool {
	host = strings.ToLower(host)
	ok := false
	for _, p := range a.Patterns {
		neg := strings.HasPrefix(p, "!")
		if !matchPattern(strings.ToLower(strings.TrimPrefix(p, "!")), host) {
			continue
		}
		if neg {
			return false
		}
		ok = true
	}
	return ok
}

// matchPattern is OpenSSH's match_pattern: "*" matches any run of
// characters, "?" any one.
func matchPattern(p, s string) bool {
	for len(p) > 0 {
		switch p[0] {
		case '*':
			for len(p) > 0 && p[0] == '*' {
				p = p[1:]
			}
			if p == "" {
				return true
			}
			for i := 0; i <= len(s); i++ {
				if matchPattern(p, s[i:]) {
					return true
				}
			}
			return false
		case '?':
			if s == "" {
				return false
			}
		default:
			if s == "" || s[0] != p[0] {
				return false
			}
		}
		p, s = p[1:], s[1:]
	}
	return s == ""
}

// ScopedHostKeyCallback is HostKeyCallback over authorities that each
// vouch only for the names their patterns match: the host dialed (the
// handshake's address without its port) picks the CAs that may sign its
// certificate.
func ScopedHostKeyCallback(auths []HostAuthority, clock clockwork.Clock) ssh.HostKeyCallback {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return func(addr string, _ net.Addr, key ssh.PublicKey) error {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		return CheckScopedHostCert(auths, host, key, clock)
	}
}

// CheckScopedHostCert is CheckHostCert with only the authorities that
// vouch for host. A certificate signed by a CA that exists but may not
// vouch for host is refused saying so.
func CheckScopedHostCert(auths []HostAuthority, host string, key ssh.PublicKey, clock clockwork.Clock) error {
	var cas []ssh.PublicKey
	for _, a := range auths {
		if a.VouchesFor(host) {
			cas = append(cas, a.Key)
		}
	}
	err := CheckHostCert(cas, host, key, clock)
	if err == nil {
		return nil
	}
	if cert, ok := key.(*ssh.Certificate); ok && cert.CertType == ssh.HostCert && !IsAuthority(cas, cert.SignatureKey) {
		for _, a := range auths {
			if IsAuthority([]ssh.PublicKey{a.Key}, cert.SignatureKey) {
				return trace.AccessDenied("the host certificate (key id %q) is signed by a host CA trusted only for %s, not for %q", cert.KeyId, strings.Join(a.Patterns, ","), host)
			}
		}
	}
	return trace.Wrap(err)
}
