package client

import (
	"net"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// specialUseNames are suffixes that name hosts outside any Postern cluster:
// the special-use domain names (RFC 6761, RFC 6762's mDNS .local, RFC 8375's
// home.arpa, RFC 7686's onion) and the private-use names networks commonly
// resolve themselves. A `Host *.local` block appended to ~/.ssh/config
// would send every mDNS host through the proxy.
var specialUseNames = map[string]bool{
	"local": true, "localhost": true, "localdomain": true, "test": true, "invalid": true,
	"example": true, "onion": true, "arpa": true, "home.arpa": true, "internal": true,
	"lan": true, "home": true, "corp": true, "intranet": true, "private": true,
}

// ownSuffix reports whether `Host *.CLUSTER` would match only the
// cluster's own names: not a special-use name and not a public suffix (a
// TLD like .it or .dev, or a registry's suffix like co.uk or github.io),
// under which live hosts the user reaches without Postern.
func ownSuffix(cluster string) bool {
	c := strings.ToLower(strings.TrimSuffix(cluster, "."))
	if c == "" || specialUseNames[c] || net.ParseIP(c) != nil {
		return false
	}
	suffix, icann := publicsuffix.PublicSuffix("node." + c)
	// An unlisted single label comes back as its own suffix, not ICANN's:
	// the "*" default rule, i.e. a name no registry hands out.
	return suffix != c || (!icann && !strings.Contains(c, "."))
}

// proxyAlias is the name the OpenSSH config gives the proxy: its own host
// name when that names only it, else CLUSTER-proxy. A bare IP (the demo's
// 127.0.0.1) or localhost as a Host pattern would capture every `ssh
// 127.0.0.1`, for which the user expects their own machine's sshd.
func proxyAlias(host, cluster string) (alias string, own bool) {
	h := strings.ToLower(host)
	if net.ParseIP(strings.Trim(h, "[]")) != nil || specialUseNames[h] || strings.HasSuffix(h, ".localhost") {
		return cluster + "-proxy", false
	}
	return host, true
}
