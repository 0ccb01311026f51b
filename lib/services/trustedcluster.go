package services

import (
	"net"
	"regexp"
	"slices"
	"strings"

	"github.com/gravitational/trace"
)

// KindTrustedCluster is the leaf side of a trust relation: the leaf names the
// root it trusts, the token the root issued, and how root roles map to its own.
const KindTrustedCluster = "trusted_cluster"

// TrustedCluster is written on a leaf cluster to make it a leaf of Metadata.Name
// (the root cluster's name). Only the leaf writes it: the root learns of the
// leaf from the token exchange, so a root operator never has to trust a
// leaf's word about which roles it grants.
type TrustedCluster struct {
	Kind     string             `json:"kind,omitempty"`
	Version  string             `json:"version,omitempty"`
	Metadata Metadata           `json:"metadata"`
	Spec     TrustedClusterSpec `json:"spec"`
}

// TrustedClusterSpec is the body of TrustedCluster.
type TrustedClusterSpec struct {
	// Enabled false keeps the resource but cuts the trust, so an operator
	// can suspend a root without losing the role map.
	Enabled bool `json:"enabled"`
	// ProxyAddr is the root's proxy web address (host:port) the leaf's
	// proxy exchanges CAs with and opens its tunnels to.
	ProxyAddr string `json:"proxy_addr"`
	// Token is the root's single-use trusted_cluster join token.
	Token string `json:"token"`
	// RoleMap maps the roles a root user holds to roles of this cluster.
	RoleMap RoleMap `json:"role_map"`
}

// RoleMap maps remote (root) role names to local (leaf) role names. It is a
// list, not a map, because order is how operators read it; every matching
// entry contributes (the union), so adding an entry can only grant more,
// never silently take something away from another entry.
type RoleMap []RoleMapping

// RoleMapping is one entry of a RoleMap. Remote is an exact role name or a
// glob where "*" matches any run of characters ("*" alone matches every
// role, "dev-*" every role starting with "dev-").
type RoleMapping struct {
	Remote string   `json:"remote"`
	Local  []string `json:"local"`
}

// CheckAndSetDefaults validates a trusted_cluster resource as written by an
// operator. Errors name the entry so a typo in a long role map is found
// without bisecting the file.
func (tc *TrustedCluster) CheckAndSetDefaults() error {
	if tc.Kind == "" {
		tc.Kind = KindTrustedCluster
	}
	if tc.Kind != KindTrustedCluster {
		return trace.BadParameter("kind %q is not %q", tc.Kind, KindTrustedCluster)
	}
	if tc.Version == "" {
		tc.Version = V1
	}
	if tc.Version != V1 {
		return trace.BadParameter("trusted_cluster %q: unsupported version %q, want %q", tc.Metadata.Name, tc.Version, V1)
	}
	if err := CheckClusterName(tc.Metadata.Name); err != nil {
		return trace.BadParameter("trusted_cluster metadata.name: %v", err)
	}
	if _, _, err := net.SplitHostPort(tc.Spec.ProxyAddr); err != nil {
		return trace.BadParameter("trusted_cluster %q: spec.proxy_addr %q is not host:port", tc.Metadata.Name, tc.Spec.ProxyAddr)
	}
	if tc.Spec.Token == "" {
		return trace.BadParameter("trusted_cluster %q: spec.token is empty", tc.Metadata.Name)
	}
	if err := tc.Spec.RoleMap.Check(); err != nil {
		return trace.BadParameter("trusted_cluster %q: %v", tc.Metadata.Name, err)
	}
	return nil
}

// Check validates every entry. An empty role map is refused: it would map
// every root user to nothing, which is a trust relation nobody can use and
// the most common way Teleport operators lock everyone out without an error.
func (m RoleMap) Check() error {
	if len(m) == 0 {
		return trace.BadParameter("spec.role_map is empty: map at least one remote role, e.g. [{remote: access, local: [access]}]")
	}
	for i, e := range m {
		if e.Remote == "" {
			return trace.BadParameter("role_map[%d]: remote is empty", i)
		}
		if strings.Trim(e.Remote, "*") != "" {
			if err := CheckRoleName(strings.ReplaceAll(e.Remote, "*", "x")); err != nil {
				return trace.BadParameter("role_map[%d]: remote: %v", i, err)
			}
		}
		if len(e.Local) == 0 {
			return trace.BadParameter("role_map[%d] (remote %q): local is empty", i, e.Remote)
		}
		for _, l := range e.Local {
			if err := CheckRoleName(l); err != nil {
				return trace.BadParameter("role_map[%d] (remote %q): local: %v", i, e.Remote, err)
			}
		}
	}
	return nil
}

// Map returns the local roles granted to a holder of the remote roles, sorted
// and without duplicates, and the remote roles no entry matched. The
// unmapped list is what an audit event names when access is denied, so an
// operator sees why a user got nothing; the user is told only "access
// denied" (never what the leaf's policy looks like).
func (m RoleMap) Map(remote []string) (local, unmapped []string) {
	for _, r := range remote {
		matched := false
		for _, e := range m {
			if globMatch(e.Remote, r) {
				matched = true
				local = append(local, e.Local...)
			}
		}
		if !matched {
			unmapped = append(unmapped, r)
		}
	}
	slices.Sort(local)
	return slices.Compact(local), unmapped
}

// globMatch matches s against a pattern where only "*" is special. Role
// names may contain "." which path.Match and regexp would treat specially,
// so the pattern is quoted piece by piece.
func globMatch(pattern, s string) bool {
	if !strings.Contains(pattern, "*") {
		return pattern == s
	}
	parts := strings.Split(pattern, "*")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(s)
}
