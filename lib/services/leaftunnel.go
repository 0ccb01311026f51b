package services

import "strings"

// leafTunnelPrefix marks a tunnel_connection lease (and a peered dial)
// that names a leaf cluster's tunnel instead of a node's. Host UUIDs are
// minted by auth and cluster names may not contain ':', so the marker
// cannot collide with a node's UUID, and a node cannot register a tunnel
// under it (its UUID is its certificate's KeyId, which auth assigned).
const leafTunnelPrefix = "leaf:"

// LeafTunnelID is the tunnel ID under which a root proxy leases (and a
// peer is asked to dial) the tunnel from leaf cluster name. Lower case:
// OpenSSH lower-cases `HOST.LEAF`, so lookups arrive lower-cased.
func LeafTunnelID(name string) string { return leafTunnelPrefix + strings.ToLower(name) }

// LeafOfTunnelID returns the (lower-cased) leaf cluster a tunnel ID names,
// and false for a node's tunnel ID.
func LeafOfTunnelID(id string) (string, bool) {
	name, ok := strings.CutPrefix(id, leafTunnelPrefix)
	return name, ok && name != ""
}
