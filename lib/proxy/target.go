package proxy

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// Target is what a user asked to reach: HOST[:PORT] in a cluster.
type Target struct {
	// Host is a node UUID, hostname or address host (IPv6 without
	// brackets), possibly written NAME.CLUSTER (routing rule 0).
	Host string
	// Port is empty or a decimal port; "", "0" and "22" mean any port
	// (routing rule 3).
	Port string
	// Cluster is the requested cluster; empty means the local one.
	Cluster string
}

// String renders HOST[:PORT] (IPv6 bracketed when a port follows), plus
// "@CLUSTER" when a cluster is set: the form logs and errors use.
func (t Target) String() string {
	s := t.Host
	if t.Port != "" {
		s = net.JoinHostPort(t.Host, t.Port)
	}
	if t.Cluster != "" {
		s += "@" + t.Cluster
	}
	return s
}

// SubsystemString renders the target as a proxy subsystem request, the
// inverse of ParseProxySubsystem.
func (t Target) SubsystemString() string {
	if t.Port == "" && t.Cluster == "" {
		return subsystemPrefix + t.Host
	}
	port := t.Port
	if port == "" {
		port = "0"
	}
	s := subsystemPrefix + net.JoinHostPort(t.Host, port)
	if t.Cluster != "" {
		s += "@" + t.Cluster
	}
	return s
}

// subsystemPrefix starts every proxy subsystem request.
const subsystemPrefix = "proxy:"

// maxQuotedRequest bounds how much of a malformed request is echoed back
// in the error: enough to see the mistake, not a 32 KiB SSH packet.
const maxQuotedRequest = 200

// ParseTarget parses a user's HOST[:PORT]: "host", "host:port",
// "[v6]:port", "[v6]" and a bare "v6" address are accepted. The cluster is
// left empty (the local one); callers with a --cluster flag set it.
func ParseTarget(hostport string) (Target, error) {
	t, err := parseHostPort(hostport, true)
	if err != nil {
		return Target{}, trace.BadParameter("invalid target %q: %v", quoteable(hostport), err)
	}
	return t, nil
}

// ParseProxySubsystem parses the SSH subsystem request a client sends to
// the proxy port (what `psh proxy ssh` and older OpenSSH ProxyCommand
// set-ups send): "proxy:HOST:PORT", "proxy:HOST:PORT@CLUSTER",
// "proxy:[IPV6]:PORT@CLUSTER" and "proxy:HOST" (any port). Anything else is
// a BadParameter whose message is what the channel's stderr shows.
func ParseProxySubsystem(s string) (Target, error) {
	t, ok := parseSubsystem(s)
	if !ok {
		return Target{}, trace.BadParameter("invalid proxy subsystem request %q: expected proxy:host:port[@cluster]", quoteable(s))
	}
	return t, nil
}

func parseSubsystem(s string) (Target, bool) {
	rest, ok := strings.CutPrefix(s, subsystemPrefix)
	if !ok || rest == "" {
		return Target{}, false
	}
	hostport, cluster, hasCluster := strings.Cut(rest, "@")
	if hasCluster && services.CheckClusterName(cluster) != nil {
		return Target{}, false
	}
	// A bare IPv6 host would be ambiguous with host:port here, so the
	// subsystem grammar only takes IPv6 in brackets, with a port.
	t, err := parseHostPort(hostport, false)
	if err != nil {
		return Target{}, false
	}
	if hasCluster && t.Port == "" {
		return Target{}, false
	}
	if strings.HasPrefix(hostport, "[") && t.Port == "" {
		return Target{}, false
	}
	t.Cluster = cluster
	return t, true
}

// parseHostPort splits HOST[:PORT]. allowBareV6 accepts "::1" (a user
// typing an address) as a host without a port.
func parseHostPort(s string, allowBareV6 bool) (Target, error) {
	if s == "" {
		return Target{}, trace.BadParameter("empty host")
	}
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return Target{}, trace.BadParameter("missing ']'")
		}
		host, rest := s[1:end], s[end+1:]
		if !isIPv6(host) {
			return Target{}, trace.BadParameter("%q in brackets is not an IPv6 address", host)
		}
		if rest == "" {
			return Target{Host: host}, nil
		}
		port, ok := strings.CutPrefix(rest, ":")
		if !ok {
			return Target{}, trace.BadParameter("unexpected %q after ']'", rest)
		}
		port, err := checkPort(port)
		if err != nil {
			return Target{}, trace.Wrap(err)
		}
		return Target{Host: host, Port: port}, nil
	}
	switch strings.Count(s, ":") {
	case 0:
		if err := checkHost(s); err != nil {
			return Target{}, trace.Wrap(err)
		}
		return Target{Host: s}, nil
	case 1:
		host, port, _ := strings.Cut(s, ":")
		if err := checkHost(host); err != nil {
			return Target{}, trace.Wrap(err)
		}
		port, err := checkPort(port)
		if err != nil {
			return Target{}, trace.Wrap(err)
		}
		return Target{Host: host, Port: port}, nil
	}
	if allowBareV6 && isIPv6(s) {
		return Target{Host: s}, nil
	}
	return Target{}, trace.BadParameter("too many colons (write IPv6 addresses as [addr]:port)")
}

func isIPv6(s string) bool {
	ip, err := netip.ParseAddr(s)
	return err == nil && ip.Is6()
}

// checkHost accepts what a node UUID, hostname or address host can be:
// printable, no spaces, and none of the characters the target grammars use
// as separators.
func checkHost(h string) error {
	if h == "" {
		return trace.BadParameter("empty host")
	}
	if len(h) > 253 {
		return trace.BadParameter("host is longer than 253 characters")
	}
	if !utf8.ValidString(h) {
		return trace.BadParameter("host is not valid UTF-8")
	}
	for _, r := range h {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) || strings.ContainsRune("/@[]:", r) {
			return trace.BadParameter("host contains %q", r)
		}
	}
	return nil
}

// checkPort accepts a decimal port 0..65535 (0 means any port) and returns
// it without leading zeros, so "022" routes like "22".
func checkPort(p string) (string, error) {
	if p == "" {
		return "", trace.BadParameter("empty port")
	}
	if len(p) > 5 || strings.TrimLeft(p, "0123456789") != "" {
		return "", trace.BadParameter("port %q is not a number", p)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n > 65535 {
		return "", trace.BadParameter("port %q is out of range", p)
	}
	return strconv.Itoa(n), nil
}

// quoteable shortens s for an error message.
func quoteable(s string) string {
	if len(s) <= maxQuotedRequest {
		return s
	}
	return s[:maxQuotedRequest] + "..."
}
