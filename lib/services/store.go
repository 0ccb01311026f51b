package services

import (
	"context"
	"encoding/json"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/backend"
)

// Key prefixes of the resources in the backend. Values are the JSON of the
// structs in types.go.
const (
	nodesPrefix       = "nodes"
	usersPrefix       = "users"
	rolesPrefix       = "roles"
	authoritiesPrefix = "authorities"
	networkingPrefix  = "networking"
	tokensPrefix      = "tokens"
	proxiesPrefix     = "proxies"
)

// tokenGCGrace is how long an expired token stays in the backend before the
// backend's TTL removes it. During that window a join with it is refused
// with "join token expired" instead of the vaguer "not found", which is the
// message an operator who pasted yesterday's join command needs.
const tokenGCGrace = time.Hour

// Store is the typed view of the backend that auth, proxies and nodes use.
// It holds no state of its own: every call is a backend read or write, so
// any number of Stores over one backend agree.
type Store struct {
	b backend.Backend
}

// NewStore returns a Store over b.
func NewStore(b backend.Backend) *Store {
	return &Store{b: b}
}

// Backend returns the underlying backend (for watchers).
func (s *Store) Backend() backend.Backend { return s.b }

// NodeKey is the backend key of a node: /nodes/CLUSTER/UUID.
func NodeKey(cluster, uuid string) string { return backend.Key(nodesPrefix, cluster, uuid) }

// NodesPrefix is the prefix of every node key (all clusters).
func NodesPrefix() string { return backend.Prefix(nodesPrefix) }

// ParseNodeKey is the inverse of NodeKey.
func ParseNodeKey(key string) (cluster, uuid string, ok bool) {
	rest, ok := strings.CutPrefix(key, NodesPrefix())
	if !ok {
		return "", "", false
	}
	cluster, uuid, ok = strings.Cut(rest, backend.Separator)
	if !ok || cluster == "" || uuid == "" || strings.Contains(uuid, backend.Separator) {
		return "", "", false
	}
	return cluster, uuid, true
}

func (s *Store) put(ctx context.Context, key string, v any, expires time.Time) error {
	data, err := json.Marshal(v)
	if err != nil {
		return trace.Wrap(err)
	}
	_, err = s.b.Put(ctx, backend.Item{Key: key, Value: data, Expires: expires})
	return trace.Wrap(err)
}

func (s *Store) create(ctx context.Context, key string, v any, expires time.Time) error {
	data, err := json.Marshal(v)
	if err != nil {
		return trace.Wrap(err)
	}
	_, err = s.b.Create(ctx, backend.Item{Key: key, Value: data, Expires: expires})
	return trace.Wrap(err)
}

// get reads key into v; a missing key is NotFound with notFoundMsg.
func (s *Store) get(ctx context.Context, key string, v any, notFoundMsg string) error {
	item, err := s.b.Get(ctx, key)
	if err != nil {
		if trace.IsNotFound(err) {
			return trace.NotFound("%s", notFoundMsg)
		}
		return trace.Wrap(err)
	}
	if err := json.Unmarshal(item.Value, v); err != nil {
		return trace.BadParameter("corrupt record at %q: %v", key, err)
	}
	return nil
}

func getAll[T any](ctx context.Context, s *Store, prefix string) ([]T, error) {
	return getAllSkipping[T](ctx, s, prefix, false)
}

// getAllSkipping reads every record under prefix. With skipBad, an
// unreadable record is logged and left out instead of failing the whole
// read.
func getAllSkipping[T any](ctx context.Context, s *Store, prefix string, skipBad bool) ([]T, error) {
	items, err := s.b.GetRange(ctx, prefix, 0)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	out := make([]T, 0, len(items))
	for _, item := range items {
		var v T
		if err := json.Unmarshal(item.Value, &v); err != nil {
			if skipBad {
				logrus.WithField("component", "services").WithField("key", item.Key).WithError(err).Warn("Skipping unreadable record.")
				continue
			}
			return nil, trace.BadParameter("corrupt record at %q: %v", item.Key, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func (s *Store) delete(ctx context.Context, key, notFoundMsg string) error {
	err := s.b.Delete(ctx, key)
	if trace.IsNotFound(err) {
		return trace.NotFound("%s", notFoundMsg)
	}
	return trace.Wrap(err)
}

// UpsertNode writes a heartbeat. The backend item expires with the node, so
// a node that stops heartbeating disappears from every reader without
// anyone deleting it.
func (s *Store) UpsertNode(ctx context.Context, n Node) error {
	if err := n.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	return s.put(ctx, NodeKey(n.Cluster, n.UUID), n, n.Expires)
}

// GetNode returns one node.
func (s *Store) GetNode(ctx context.Context, cluster, uuid string) (*Node, error) {
	if cluster == "" || uuid == "" || strings.Contains(cluster+uuid, backend.Separator) {
		return nil, trace.NotFound("node %q not found in cluster %q", uuid, cluster)
	}
	var n Node
	if err := s.get(ctx, NodeKey(cluster, uuid), &n, "node "+quote(uuid)+" not found in cluster "+quote(cluster)); err != nil {
		return nil, err
	}
	return &n, nil
}

// GetNodes returns the nodes of cluster, or of every cluster when cluster
// is "". Unreadable node records are logged and skipped: nodes are written
// by machines, and one bad heartbeat must not hide the whole inventory from
// the NodeWatcher's load or from `pctl nodes ls`.
func (s *Store) GetNodes(ctx context.Context, cluster string) ([]Node, error) {
	prefix := NodesPrefix()
	if cluster != "" {
		prefix = backend.Prefix(nodesPrefix, cluster)
	}
	return getAllSkipping[Node](ctx, s, prefix, true)
}

// DeleteNode removes a node record (`pctl nodes rm`).
func (s *Store) DeleteNode(ctx context.Context, cluster, uuid string) error {
	if cluster == "" || uuid == "" || strings.Contains(cluster+uuid, backend.Separator) {
		return trace.NotFound("node %q not found in cluster %q", uuid, cluster)
	}
	return s.delete(ctx, NodeKey(cluster, uuid), "node "+quote(uuid)+" not found in cluster "+quote(cluster))
}

// ProxyKey is the backend key of a proxy: /proxies/CLUSTER/UUID.
func ProxyKey(cluster, uuid string) string { return backend.Key(proxiesPrefix, cluster, uuid) }

// UpsertProxy writes a proxy's heartbeat; the backend item expires with
// the record, so a proxy that stops heartbeating leaves the list by itself.
func (s *Store) UpsertProxy(ctx context.Context, p Proxy) error {
	if err := p.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	return s.put(ctx, ProxyKey(p.Cluster, p.UUID), p, p.Expires)
}

// GetProxies returns the live proxies of cluster ("" = every cluster),
// sorted by UUID. Unreadable records are logged and skipped, as for
// nodes: one bad heartbeat must not hide every proxy from the agents.
func (s *Store) GetProxies(ctx context.Context, cluster string) ([]Proxy, error) {
	prefix := backend.Prefix(proxiesPrefix)
	if cluster != "" {
		if strings.Contains(cluster, backend.Separator) {
			return nil, trace.BadParameter("cluster %q contains %q", cluster, backend.Separator)
		}
		prefix = backend.Prefix(proxiesPrefix, cluster)
	}
	out, err := getAllSkipping[Proxy](ctx, s, prefix, true)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UUID < out[j].UUID })
	return out, nil
}

// DeleteProxy removes a proxy's record: a proxy that shuts down cleanly
// leaves the list at once instead of at its TTL.
func (s *Store) DeleteProxy(ctx context.Context, cluster, uuid string) error {
	if cluster == "" || uuid == "" || strings.Contains(cluster+uuid, backend.Separator) {
		return trace.NotFound("proxy %q not found in cluster %q", uuid, cluster)
	}
	return s.delete(ctx, ProxyKey(cluster, uuid), "proxy "+quote(uuid)+" not found in cluster "+quote(cluster))
}

// CreateUser adds a user; AlreadyExists if the name is taken.
func (s *Store) CreateUser(ctx context.Context, u User) error {
	if err := u.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	err := s.create(ctx, backend.Key(usersPrefix, u.Name), u, time.Time{})
	if trace.IsAlreadyExists(err) {
		return trace.AlreadyExists("user %q already exists", u.Name)
	}
	return trace.Wrap(err)
}

// UpsertUser creates or replaces a user.
func (s *Store) UpsertUser(ctx context.Context, u User) error {
	if err := u.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	return s.put(ctx, backend.Key(usersPrefix, u.Name), u, time.Time{})
}

// GetUser returns a user, password hash and TOTP secret included: callers
// that hand users to clients must strip them.
func (s *Store) GetUser(ctx context.Context, name string) (*User, error) {
	if CheckUserName(name) != nil {
		return nil, trace.NotFound("user %q not found", name)
	}
	var u User
	if err := s.get(ctx, backend.Key(usersPrefix, name), &u, "user "+quote(name)+" not found"); err != nil {
		return nil, err
	}
	return &u, nil
}

// GetUsers returns every user, sorted by name.
func (s *Store) GetUsers(ctx context.Context) ([]User, error) {
	return getAll[User](ctx, s, backend.Prefix(usersPrefix))
}

// DeleteUser removes a user.
func (s *Store) DeleteUser(ctx context.Context, name string) error {
	if CheckUserName(name) != nil {
		return trace.NotFound("user %q not found", name)
	}
	return s.delete(ctx, backend.Key(usersPrefix, name), "user "+quote(name)+" not found")
}

// UpsertRole validates and writes a role.
func (s *Store) UpsertRole(ctx context.Context, r *Role) error {
	if r == nil {
		return trace.BadParameter("missing role")
	}
	if err := r.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	return s.put(ctx, backend.Key(rolesPrefix, r.Metadata.Name), r, time.Time{})
}

// GetRole returns a role.
func (s *Store) GetRole(ctx context.Context, name string) (*Role, error) {
	if CheckRoleName(name) != nil {
		return nil, trace.NotFound("role %q not found", name)
	}
	var r Role
	if err := s.get(ctx, backend.Key(rolesPrefix, name), &r, "role "+quote(name)+" not found"); err != nil {
		return nil, err
	}
	return &r, nil
}

// GetRoles returns every role, sorted by name.
func (s *Store) GetRoles(ctx context.Context) ([]*Role, error) {
	roles, err := getAll[Role](ctx, s, backend.Prefix(rolesPrefix))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	out := make([]*Role, len(roles))
	for i := range roles {
		out[i] = &roles[i]
	}
	return out, nil
}

// DeleteRole removes a role.
func (s *Store) DeleteRole(ctx context.Context, name string) error {
	if CheckRoleName(name) != nil {
		return trace.NotFound("role %q not found", name)
	}
	return s.delete(ctx, backend.Key(rolesPrefix, name), "role "+quote(name)+" not found")
}

func caKey(t CertAuthType, cluster string) string {
	return backend.Key(authoritiesPrefix, string(t), cluster)
}

// CreateCertAuthority writes a CA once; AlreadyExists if the cluster has
// one of that type already (CAs are never silently replaced: that would
// invalidate every certificate in the fleet).
func (s *Store) CreateCertAuthority(ctx context.Context, ca CertAuthority) error {
	if err := ca.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	err := s.create(ctx, caKey(ca.Type, ca.ClusterName), ca, time.Time{})
	if trace.IsAlreadyExists(err) {
		return trace.AlreadyExists("%s certificate authority of cluster %q already exists", ca.Type, ca.ClusterName)
	}
	return trace.Wrap(err)
}

// GetCertAuthority returns a CA; private keys only when withSecrets.
func (s *Store) GetCertAuthority(ctx context.Context, clusterName string, t CertAuthType, withSecrets bool) (*CertAuthority, error) {
	if CheckClusterName(clusterName) != nil || (t != UserCA && t != HostCA) {
		return nil, trace.NotFound("%s certificate authority of cluster %q not found", t, clusterName)
	}
	var ca CertAuthority
	if err := s.get(ctx, caKey(t, clusterName), &ca, string(t)+" certificate authority of cluster "+quote(clusterName)+" not found"); err != nil {
		return nil, err
	}
	if !withSecrets {
		ca.StripSecrets()
	}
	return &ca, nil
}

// GetCertAuthorities returns the CAs of type t of every cluster.
func (s *Store) GetCertAuthorities(ctx context.Context, t CertAuthType, withSecrets bool) ([]CertAuthority, error) {
	if t != UserCA && t != HostCA {
		return nil, trace.BadParameter("unknown certificate authority type %q", t)
	}
	cas, err := getAll[CertAuthority](ctx, s, backend.Prefix(authoritiesPrefix, string(t)))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if !withSecrets {
		for i := range cas {
			cas[i].StripSecrets()
		}
	}
	return cas, nil
}

// StripSecrets removes the private keys, in place.
func (c *CertAuthority) StripSecrets() {
	c.SSHPrivateKeys = nil
	c.TLSKey = nil
}

func networkingKey() string { return backend.Key(networkingPrefix, NetworkingConfigName) }

// GetClusterNetworkingConfig returns the networking config, or the defaults
// when none was ever set.
func (s *Store) GetClusterNetworkingConfig(ctx context.Context) (*ClusterNetworkingConfig, error) {
	// The router reads this on every connection: go to the backend
	// directly so the common "never set" case costs no extra error.
	item, err := s.b.Get(ctx, networkingKey())
	if trace.IsNotFound(err) {
		return DefaultClusterNetworkingConfig(), nil
	}
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var c ClusterNetworkingConfig
	if err := json.Unmarshal(item.Value, &c); err != nil {
		return nil, trace.BadParameter("corrupt record at %q: %v", item.Key, err)
	}
	if err := c.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	return &c, nil
}

// SetClusterNetworkingConfig validates and writes the networking config.
func (s *Store) SetClusterNetworkingConfig(ctx context.Context, c *ClusterNetworkingConfig) error {
	if c == nil {
		return trace.BadParameter("missing cluster networking config")
	}
	if err := c.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	return s.put(ctx, networkingKey(), c, time.Time{})
}

func tokenKey(name string) string { return backend.Key(tokensPrefix, name) }

// CreateToken writes a new join token; AlreadyExists if the name is taken.
func (s *Store) CreateToken(ctx context.Context, t Token) error {
	if err := t.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	err := s.create(ctx, tokenKey(t.Name), t, t.Expires.Add(tokenGCGrace))
	if trace.IsAlreadyExists(err) {
		return trace.AlreadyExists("token already exists")
	}
	return trace.Wrap(err)
}

// GetToken returns a token (expired or not).
func (s *Store) GetToken(ctx context.Context, name string) (*Token, error) {
	if checkKeyComponent("token", name) != nil {
		return nil, trace.NotFound("token not found")
	}
	var t Token
	if err := s.get(ctx, tokenKey(name), &t, "token not found"); err != nil {
		return nil, err
	}
	return &t, nil
}

// GetTokens returns every token still in the backend.
func (s *Store) GetTokens(ctx context.Context) ([]Token, error) {
	return getAll[Token](ctx, s, backend.Prefix(tokensPrefix))
}

// DeleteToken removes a token.
func (s *Store) DeleteToken(ctx context.Context, name string) error {
	if checkKeyComponent("token", name) != nil {
		return trace.NotFound("token not found")
	}
	return s.delete(ctx, tokenKey(name), "token not found")
}

// Messages of ConsumeToken. They are all a joiner learns: a wrong or spent
// token gives the same answer, so the error is no oracle for guessing.
const (
	msgTokenNotFound = "join token not found or already used"
	msgTokenExpired  = "join token expired"
)

// ConsumeToken spends a join token for a joiner of type wantType and
// returns it. A single-use token is deleted, and the Delete is the commit
// point: the backend lets exactly one Delete of a key succeed, so among
// concurrent joiners with the same token exactly one wins and the others get
// "not found or already used".
func (s *Store) ConsumeToken(ctx context.Context, name string, wantType string) (*Token, error) {
	t, err := s.CheckToken(ctx, name, wantType)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if t.MultiUse {
		return t, nil
	}
	if err := s.b.Delete(ctx, tokenKey(name)); err != nil {
		if trace.IsNotFound(err) {
			return nil, trace.AccessDenied(msgTokenNotFound)
		}
		return nil, trace.Wrap(err)
	}
	return t, nil
}

// CheckToken is ConsumeToken without the spending: it answers what
// ConsumeToken would (with the same messages) and changes nothing. The
// join checks the token this way before any work an unauthenticated
// caller should not be able to trigger (reading the inventory), and
// spends it only at the end.
func (s *Store) CheckToken(ctx context.Context, name string, wantType string) (*Token, error) {
	if err := CheckTokenType(wantType); err != nil {
		return nil, trace.Wrap(err)
	}
	if checkKeyComponent("token", name) != nil {
		return nil, trace.AccessDenied(msgTokenNotFound)
	}
	item, err := s.b.Get(ctx, tokenKey(name))
	if trace.IsNotFound(err) {
		return nil, trace.AccessDenied(msgTokenNotFound)
	}
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var t Token
	if err := json.Unmarshal(item.Value, &t); err != nil {
		return nil, trace.BadParameter("corrupt record at %q: %v", item.Key, err)
	}
	if !s.b.Clock().Now().Before(t.Expires) {
		return nil, trace.AccessDenied(msgTokenExpired)
	}
	if t.Type != wantType {
		return nil, trace.AccessDenied("join token cannot be used to join as %s", wantType)
	}
	return &t, nil
}

func quote(s string) string { return strconv.Quote(s) }
