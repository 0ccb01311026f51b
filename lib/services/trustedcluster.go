package services

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
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
	// Token is what the root's `pctl tokens add --type trusted_cluster`
	// printed: the single-use secret and the pin of the root's TLS CA,
	// SECRET@sha256:HEX (see ParseTrustedClusterToken). The pin is what
	// authenticates the root to the leaf: without it, whoever answered at
	// proxy_addr could hand the leaf CAs of its own choosing.
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
	if _, _, err := ParseTrustedClusterToken(tc.Spec.Token); err != nil {
		return trace.BadParameter("trusted_cluster %q: spec.token: %v", tc.Metadata.Name, err)
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

// caPinPrefix starts a CA pin ("sha256:" and the hex SHA-256 of the TLS
// CA's SubjectPublicKeyInfo, as `--ca-pin` takes it).
const caPinPrefix = "sha256:"

// TrustedClusterToken is the token a root prints for a leaf: the secret
// and the root's CA pin, in one string so that an operator copies one
// value and cannot forget the pin (a leaf without it would have to trust
// whatever answers at proxy_addr, which is how a man in the middle
// substitutes CAs).
func TrustedClusterToken(secret, caPin string) string { return secret + "@" + caPin }

// ParseTrustedClusterToken splits SECRET@sha256:HEX.
func ParseTrustedClusterToken(tok string) (secret, caPin string, err error) {
	secret, caPin, ok := strings.Cut(tok, "@")
	if !ok || secret == "" {
		return "", "", trace.BadParameter("want the whole token printed by `pctl tokens add --type trusted_cluster` on the root (SECRET@sha256:HEX): the CA pin after the @ is what authenticates the root")
	}
	if err := checkKeyComponent("token", secret); err != nil {
		return "", "", trace.BadParameter("the secret before the @ is malformed: %v", err)
	}
	hexPart, ok := strings.CutPrefix(caPin, caPinPrefix)
	if b, err := hex.DecodeString(hexPart); !ok || err != nil || len(b) != sha256.Size {
		return "", "", trace.BadParameter("the CA pin %q after the @ is malformed: want %s followed by 64 hex digits", caPin, caPinPrefix)
	}
	return secret, strings.ToLower(caPin), nil
}

// KindRemoteCluster is the root side of a trust relation: a leaf that
// spent a trusted_cluster token here.
const KindRemoteCluster = "remote_cluster"

// RemoteCluster is a leaf cluster as its root records it. The root writes
// it (never the leaf): it comes into being when the leaf spends a token,
// together with the leaf's CAs, and `pctl clusters rm` removes both.
type RemoteCluster struct {
	// Name is the leaf's cluster name (the OU of its certificates, the
	// CLUSTER of HOST.CLUSTER).
	Name string `json:"name"`
	// Created is when the leaf established trust (the root's clock).
	Created time.Time `json:"created"`
	// LastConnected is when a proxy of this (root) cluster last reported
	// a live tunnel from the leaf (the root auth server's clock); zero
	// when none ever came.
	LastConnected time.Time `json:"last_connected,omitempty"`
	// StatusNow is Status at the auth server's clock, in the views the
	// auth API returns (pctl clusters ls); derived, never stored.
	StatusNow string `json:"status,omitempty"`
}

// Remote cluster statuses (proxysites, pctl clusters ls).
const (
	RemoteClusterOnline  = "online"
	RemoteClusterOffline = "offline"
)

// RemoteClusterOfflineAfter is how long after the last report of a live
// tunnel a leaf counts as offline: three of the proxies' 5s reports, so
// that one late report does not flap the status.
const RemoteClusterOfflineAfter = 15 * time.Second

// Status is online while a tunnel was reported within
// RemoteClusterOfflineAfter of now.
func (rc *RemoteCluster) Status(now time.Time) string {
	if !rc.LastConnected.IsZero() && now.Sub(rc.LastConnected) < RemoteClusterOfflineAfter {
		return RemoteClusterOnline
	}
	return RemoteClusterOffline
}

// CheckAndSetDefaults validates a remote cluster record.
func (rc *RemoteCluster) CheckAndSetDefaults() error {
	if err := CheckClusterName(rc.Name); err != nil {
		return trace.BadParameter("remote_cluster name: %v", err)
	}
	return nil
}

const (
	trustedClustersPrefix = "trusted_clusters"
	remoteClustersPrefix  = "remote_clusters"
)

// TrustedClustersPrefix is the prefix of every trusted_cluster key.
func TrustedClustersPrefix() string { return backend.Prefix(trustedClustersPrefix) }

// IsTrustedClusterKey reports whether key is a trusted_cluster's.
func IsTrustedClusterKey(key string) bool { return strings.HasPrefix(key, TrustedClustersPrefix()) }

// UpsertTrustedCluster writes a leaf's trust in a root.
func (s *Store) UpsertTrustedCluster(ctx context.Context, tc *TrustedCluster) error {
	if tc == nil {
		return trace.BadParameter("missing trusted_cluster")
	}
	if err := tc.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	return s.put(ctx, backend.Key(trustedClustersPrefix, tc.Metadata.Name), tc, time.Time{})
}

// GetTrustedCluster returns one trusted_cluster by the root's name.
func (s *Store) GetTrustedCluster(ctx context.Context, name string) (*TrustedCluster, error) {
	msg := "trusted_cluster " + quote(name) + " not found"
	if CheckClusterName(name) != nil {
		return nil, trace.NotFound("%s", msg)
	}
	var tc TrustedCluster
	if err := s.get(ctx, backend.Key(trustedClustersPrefix, name), &tc, msg); err != nil {
		return nil, err
	}
	return &tc, nil
}

// GetTrustedClusters returns every trusted_cluster, by name.
func (s *Store) GetTrustedClusters(ctx context.Context) ([]TrustedCluster, error) {
	return getAll[TrustedCluster](ctx, s, backend.Prefix(trustedClustersPrefix))
}

// DeleteTrustedCluster removes a trusted_cluster record (not the CAs: the
// auth server removes those, see auth.Server.DeleteTrustedCluster).
func (s *Store) DeleteTrustedCluster(ctx context.Context, name string) error {
	msg := "trusted_cluster " + quote(name) + " not found"
	if CheckClusterName(name) != nil {
		return trace.NotFound("%s", msg)
	}
	return s.delete(ctx, backend.Key(trustedClustersPrefix, name), msg)
}

// CreateRemoteCluster records a new leaf; AlreadyExists when one of that
// name is there (a second leaf may not take a first one's name).
func (s *Store) CreateRemoteCluster(ctx context.Context, rc RemoteCluster) error {
	if err := rc.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	err := s.create(ctx, backend.Key(remoteClustersPrefix, rc.Name), rc, time.Time{})
	if trace.IsAlreadyExists(err) {
		return trace.AlreadyExists("cluster %q is already a leaf of this cluster", rc.Name)
	}
	return trace.Wrap(err)
}

// GetRemoteCluster returns one leaf.
func (s *Store) GetRemoteCluster(ctx context.Context, name string) (*RemoteCluster, error) {
	msg := "remote cluster " + quote(name) + " not found"
	if CheckClusterName(name) != nil {
		return nil, trace.NotFound("%s", msg)
	}
	var rc RemoteCluster
	if err := s.get(ctx, backend.Key(remoteClustersPrefix, name), &rc, msg); err != nil {
		return nil, err
	}
	return &rc, nil
}

// GetRemoteClusters returns every leaf, by name.
func (s *Store) GetRemoteClusters(ctx context.Context) ([]RemoteCluster, error) {
	return getAll[RemoteCluster](ctx, s, backend.Prefix(remoteClustersPrefix))
}

// TouchRemoteCluster sets a leaf's LastConnected to now. It never
// creates the record: a report racing `pctl clusters rm` must not bring a
// removed leaf back (the write is a compare-and-swap on the record read).
func (s *Store) TouchRemoteCluster(ctx context.Context, name string, now time.Time) error {
	msg := "remote cluster " + quote(name) + " not found"
	if CheckClusterName(name) != nil {
		return trace.NotFound("%s", msg)
	}
	key := backend.Key(remoteClustersPrefix, name)
	item, err := s.b.Get(ctx, key)
	if trace.IsNotFound(err) {
		return trace.NotFound("%s", msg)
	}
	if err != nil {
		return trace.Wrap(err)
	}
	var rc RemoteCluster
	if err := json.Unmarshal(item.Value, &rc); err != nil {
		return trace.BadParameter("corrupt record at %q: %v", key, err)
	}
	rc.LastConnected = now.UTC()
	data, err := json.Marshal(rc)
	if err != nil {
		return trace.Wrap(err)
	}
	_, err = s.b.CompareAndSwap(ctx, *item, backend.Item{Key: key, Value: data})
	if trace.IsCompareFailed(err) {
		// Another report or a removal won: either is fine to keep.
		return nil
	}
	return trace.Wrap(err)
}

// DeleteRemoteCluster removes a leaf's record.
func (s *Store) DeleteRemoteCluster(ctx context.Context, name string) error {
	msg := "remote cluster " + quote(name) + " not found"
	if CheckClusterName(name) != nil {
		return trace.NotFound("%s", msg)
	}
	return s.delete(ctx, backend.Key(remoteClustersPrefix, name), msg)
}
