package auth

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// DefaultClientTimeout bounds one API call (not a watch): long enough for a
// bcrypt login on a loaded auth server, short enough that a dead one is
// reported instead of hanging a heartbeat.
const DefaultClientTimeout = 30 * time.Second

// ClientConfig configures a Client.
type ClientConfig struct {
	// Addr is the auth API's host:port, or several separated by commas
	// (failover.go); required.
	Addr string
	// Identity is the caller's identity; either it or TLS is required.
	Identity *Identity
	// TLS is used instead of Identity's config when set. Its ServerName
	// defaults to AuthServerName.
	TLS *tls.Config
	// Clock is the time used to verify the server certificate; default
	// the real clock.
	Clock clockwork.Clock
	// Timeout bounds each call (watches excepted); zero means
	// DefaultClientTimeout.
	Timeout time.Duration
	// Dial opens the byte stream the mutual TLS runs over; nil means TCP
	// to Addr. A tunnel node dials through its tunnel (the proxy splices
	// it to the auth API: auth still sees the node's own client cert).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// CheckAndSetDefaults validates the config.
func (c *ClientConfig) CheckAndSetDefaults() error {
	if c.Addr == "" {
		return trace.BadParameter("auth client: missing Addr")
	}
	if c.Identity == nil && c.TLS == nil {
		return trace.BadParameter("auth client: missing Identity or TLS config")
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultClientTimeout
	}
	return nil
}

// Client calls the auth API. Its methods mirror the Store's and the
// Server's, so narrow interfaces (srv.AccessPoint, services.NodeEvents)
// are satisfied by a local Store and a remote Client alike.
type Client struct {
	cfg       ClientConfig
	base      string
	transport *http.Transport
	http      *http.Client
}

// The client serves the NodeWatcher of a proxy on another machine.
var _ services.NodeEvents = (*Client)(nil)

// NewClient makes a client; it does not dial until the first call.
func NewClient(cfg ClientConfig) (*Client, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	var tlsCfg *tls.Config
	if cfg.TLS != nil {
		tlsCfg = cfg.TLS.Clone()
	} else {
		tlsCfg = cfg.Identity.ClientTLSConfig()
	}
	if tlsCfg.ServerName == "" {
		tlsCfg.ServerName = AuthServerName
	}
	if tlsCfg.Time == nil {
		tlsCfg.Time = cfg.Clock.Now
	}
	addrs := SplitAuthAddrs(cfg.Addr)
	if len(addrs) == 0 {
		return nil, trace.BadParameter("auth client: missing Addr")
	}
	dial := cfg.Dial
	if dial == nil {
		dial = newFailoverDialer(addrs, cfg.Timeout).DialContext
	}
	transport := &http.Transport{
		DialContext:         dial,
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: cfg.Timeout,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     time.Minute,
		ForceAttemptHTTP2:   false,
	}
	return &Client{
		cfg: cfg,
		// The host only keys the connection pool: the dialer picks the
		// server (failover.go).
		base:      "https://" + addrs[0],
		transport: transport,
		http:      &http.Client{Transport: transport},
	}, nil
}

// Close releases idle connections. Watches are closed by their owners.
func (c *Client) Close() error {
	c.transport.CloseIdleConnections()
	return nil
}

// do sends one call: in (if not nil) as the JSON body, out (if not nil)
// decoded from the JSON answer, errors mapped back to trace kinds.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return trace.Wrap(err)
		}
		body = bytes.NewReader(data)
	}
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return trace.Wrap(err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return trace.ConnectionProblem(err, "auth server at %s: %v", c.cfg.Addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return authapi.ReadErrorResponse(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, authapi.MaxErrorBody))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return trace.ConnectionProblem(err, "auth server at %s: bad response: %v", c.cfg.Addr, err)
	}
	return nil
}

// Ping returns the cluster name; it is also the cheapest way to check that
// the identity is accepted.
func (c *Client) Ping(ctx context.Context) (string, error) {
	resp, err := c.PingDetails(ctx)
	if err != nil {
		return "", trace.Wrap(err)
	}
	return resp.ClusterName, nil
}

// PingDetails returns the cluster name and the caller's identity as the
// server sees it.
func (c *Client) PingDetails(ctx context.Context) (*authapi.PingResponse, error) {
	return call[authapi.PingResponse](ctx, c, http.MethodGet, "/v1/ping", nil, nil)
}

// UpsertNode announces a node (a heartbeat).
func (c *Client) UpsertNode(ctx context.Context, node services.Node) error {
	return trace.Wrap(c.do(ctx, http.MethodPut, "/v1/nodes", nil, node, nil))
}

// GetNodes lists nodes of cluster ("" = all).
func (c *Client) GetNodes(ctx context.Context, cluster string) ([]services.Node, error) {
	var q url.Values
	if cluster != "" {
		q = url.Values{"cluster": {cluster}}
	}
	var nodes []services.Node
	return nodes, trace.Wrap(c.do(ctx, http.MethodGet, "/v1/nodes", q, nil, &nodes))
}

// UpsertProxy announces this proxy (a heartbeat); auth dates it.
func (c *Client) UpsertProxy(ctx context.Context, p services.Proxy) error {
	return trace.Wrap(c.do(ctx, http.MethodPut, "/v1/proxies", nil, p, nil))
}

// DeleteProxy removes this proxy's own record (a clean shutdown).
func (c *Client) DeleteProxy(ctx context.Context) error {
	return trace.Wrap(c.do(ctx, http.MethodDelete, "/v1/proxies/self", nil, nil, nil))
}

// GetProxies lists the cluster's live proxies, sorted by UUID.
func (c *Client) GetProxies(ctx context.Context) ([]services.Proxy, error) {
	var out []services.Proxy
	return out, trace.Wrap(c.do(ctx, http.MethodGet, "/v1/proxies", nil, nil, &out))
}

// DeleteNode removes a node record.
func (c *Client) DeleteNode(ctx context.Context, cluster, uuid string) error {
	return trace.Wrap(c.do(ctx, http.MethodDelete, "/v1/nodes/"+url.PathEscape(cluster)+"/"+url.PathEscape(uuid), nil, nil, nil))
}

// GetCertAuthority returns a CA's public part. withSecrets must be false:
// private keys never leave the auth server.
func (c *Client) GetCertAuthority(ctx context.Context, clusterName string, t services.CertAuthType, withSecrets bool) (*services.CertAuthority, error) {
	if withSecrets {
		return nil, trace.BadParameter("CA private keys are never served over the auth API")
	}
	return call[services.CertAuthority](ctx, c, http.MethodGet, "/v1/authorities/"+url.PathEscape(string(t))+"/"+url.PathEscape(clusterName), nil, nil)
}

// GetCertAuthorities returns the public parts of every CA of type t.
func (c *Client) GetCertAuthorities(ctx context.Context, t services.CertAuthType, withSecrets bool) ([]services.CertAuthority, error) {
	if withSecrets {
		return nil, trace.BadParameter("CA private keys are never served over the auth API")
	}
	var cas []services.CertAuthority
	return cas, trace.Wrap(c.do(ctx, http.MethodGet, "/v1/authorities/"+url.PathEscape(string(t)), nil, nil, &cas))
}

// GetRole returns a role.
func (c *Client) GetRole(ctx context.Context, name string) (*services.Role, error) {
	return call[services.Role](ctx, c, http.MethodGet, "/v1/roles/"+url.PathEscape(name), nil, nil)
}

// GetRoles lists roles.
func (c *Client) GetRoles(ctx context.Context) ([]*services.Role, error) {
	var roles []*services.Role
	return roles, trace.Wrap(c.do(ctx, http.MethodGet, "/v1/roles", nil, nil, &roles))
}

// UpsertRole creates or replaces a role.
func (c *Client) UpsertRole(ctx context.Context, role *services.Role) error {
	return trace.Wrap(c.do(ctx, http.MethodPut, "/v1/roles", nil, role, nil))
}

// DeleteRole removes a role.
func (c *Client) DeleteRole(ctx context.Context, name string) error {
	return trace.Wrap(c.do(ctx, http.MethodDelete, "/v1/roles/"+url.PathEscape(name), nil, nil, nil))
}

// GetClusterNetworkingConfig returns the networking config.
func (c *Client) GetClusterNetworkingConfig(ctx context.Context) (*services.ClusterNetworkingConfig, error) {
	return call[services.ClusterNetworkingConfig](ctx, c, http.MethodGet, "/v1/networking", nil, nil)
}

// SetClusterNetworkingConfig replaces the networking config.
func (c *Client) SetClusterNetworkingConfig(ctx context.Context, cfg *services.ClusterNetworkingConfig) error {
	return trace.Wrap(c.do(ctx, http.MethodPut, "/v1/networking", nil, cfg, nil))
}

// CreateUser adds a user; see Server.CreateUser.
func (c *Client) CreateUser(ctx context.Context, name string, password []byte, logins []string, roles []string, withOTP bool) (string, error) {
	var resp authapi.CreateUserResponse
	err := c.do(ctx, http.MethodPost, "/v1/users", nil, authapi.CreateUserRequest{
		Name: name, Password: string(password), Logins: logins, Roles: roles, OTP: withOTP,
	}, &resp)
	return resp.TOTPURL, trace.Wrap(err)
}

// DeleteUser removes a user.
func (c *Client) DeleteUser(ctx context.Context, name string) error {
	return trace.Wrap(c.do(ctx, http.MethodDelete, "/v1/users/"+url.PathEscape(name), nil, nil, nil))
}

// UpdateUser replaces a user's roles and/or logins (nil: unchanged); see
// Server.UpdateUser.
func (c *Client) UpdateUser(ctx context.Context, name string, roles, logins []string) (*services.User, error) {
	return call[services.User](ctx, c, http.MethodPut, "/v1/users/"+url.PathEscape(name), nil, authapi.UpdateUserRequest{Roles: roles, Logins: logins})
}

// ResetPassword sets a user's password and ends their web sessions; it
// returns how many ended. See Server.ResetPassword.
func (c *Client) ResetPassword(ctx context.Context, name string, password []byte) (int, error) {
	var resp authapi.ResetPasswordResponse
	err := c.do(ctx, http.MethodPut, "/v1/users/"+url.PathEscape(name)+"/password", nil, authapi.ResetPasswordRequest{Password: string(password)}, &resp)
	return resp.WebSessionsEnded, trace.Wrap(err)
}

// GetUsers lists users (without password hashes or TOTP secrets).
func (c *Client) GetUsers(ctx context.Context) ([]services.User, error) {
	var users []services.User
	return users, trace.Wrap(c.do(ctx, http.MethodGet, "/v1/users", nil, nil, &users))
}

// ClearLockout clears the failed-login counts and lockouts of user (and of
// addr's address, for every user, when addr is not empty); see
// Server.ClearLockout.
func (c *Client) ClearLockout(ctx context.Context, name, addr string) (bool, error) {
	var q url.Values
	if addr != "" {
		q = url.Values{"addr": {addr}}
	}
	resp, err := call[authapi.ClearLockoutResponse](ctx, c, http.MethodDelete, "/v1/users/"+url.PathEscape(name)+"/lockout", q, nil)
	if err != nil {
		return false, trace.Wrap(err)
	}
	return resp.Cleared, nil
}

// CreateToken makes a join token; see Server.CreateToken.
func (c *Client) CreateToken(ctx context.Context, tokenType string, ttl time.Duration) (*services.Token, error) {
	return call[services.Token](ctx, c, http.MethodPost, "/v1/tokens", nil, authapi.CreateTokenRequest{Type: tokenType, TTL: services.Duration(ttl)})
}

// GetTokens lists join tokens.
func (c *Client) GetTokens(ctx context.Context) ([]services.Token, error) {
	var tokens []services.Token
	return tokens, trace.Wrap(c.do(ctx, http.MethodGet, "/v1/tokens", nil, nil, &tokens))
}

// DeleteToken revokes a join token.
func (c *Client) DeleteToken(ctx context.Context, name string) error {
	return trace.Wrap(c.do(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(name), nil, nil, nil))
}

// UpsertTrustedCluster makes this (leaf) cluster trust a root, or updates
// an established trusted_cluster's spec.
func (c *Client) UpsertTrustedCluster(ctx context.Context, tc *services.TrustedCluster) (*services.TrustedCluster, error) {
	return call[services.TrustedCluster](ctx, c, http.MethodPut, "/v1/trustedclusters", nil, tc)
}

// GetTrustedClusters lists the roots this cluster trusts.
func (c *Client) GetTrustedClusters(ctx context.Context) ([]services.TrustedCluster, error) {
	var out []services.TrustedCluster
	return out, trace.Wrap(c.do(ctx, http.MethodGet, "/v1/trustedclusters", nil, nil, &out))
}

// GetTrustedCluster returns one root this cluster trusts (NotFound when
// none of that name). Nodes and proxies get it without its token.
func (c *Client) GetTrustedCluster(ctx context.Context, name string) (*services.TrustedCluster, error) {
	tcs, err := c.GetTrustedClusters(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	for i := range tcs {
		if tcs[i].Metadata.Name == name {
			return &tcs[i], nil
		}
	}
	return nil, trace.NotFound("trusted_cluster %q not found", name)
}

// DeleteTrustedCluster withdraws trust in a root.
func (c *Client) DeleteTrustedCluster(ctx context.Context, name string) error {
	return trace.Wrap(c.do(ctx, http.MethodDelete, "/v1/trustedclusters/"+url.PathEscape(name), nil, nil, nil))
}

// GetRemoteClusters lists this (root) cluster's leaves.
func (c *Client) GetRemoteClusters(ctx context.Context) ([]services.RemoteCluster, error) {
	var out []services.RemoteCluster
	return out, trace.Wrap(c.do(ctx, http.MethodGet, "/v1/remoteclusters", nil, nil, &out))
}

// DeleteRemoteCluster removes a leaf and its CAs.
func (c *Client) DeleteRemoteCluster(ctx context.Context, name string) error {
	return trace.Wrap(c.do(ctx, http.MethodDelete, "/v1/remoteclusters/"+url.PathEscape(name), nil, nil, nil))
}

// GenerateUserCert signs a user certificate without a password: admin only
// (pctl auth sign); a proxy logs users in with AuthenticateSSHUser.
func (c *Client) GenerateUserCert(ctx context.Context, req authapi.UserCertRequest) ([]byte, error) {
	var resp authapi.CertResponse
	return resp.Cert, trace.Wrap(c.do(ctx, http.MethodPost, "/v1/certs/user", nil, req, &resp))
}

// AuthenticateUser checks a user's password and OTP (proxy only).
func (c *Client) AuthenticateUser(ctx context.Context, req authapi.AuthRequest) (*services.User, error) {
	return call[services.User](ctx, c, http.MethodPost, "/v1/login", nil, req)
}

// AuthenticateSSHUser logs a user in and certifies their key (proxy only).
func (c *Client) AuthenticateSSHUser(ctx context.Context, req authapi.SSHLoginRequest) (*authapi.SSHLoginResponse, error) {
	return call[authapi.SSHLoginResponse](ctx, c, http.MethodPost, "/v1/login/ssh", nil, req)
}

// call is do for calls that return one object: nil on error.
func call[T any](ctx context.Context, c *Client, method, path string, query url.Values, in any) (*T, error) {
	var out T
	if err := c.do(ctx, method, path, query, in, &out); err != nil {
		return nil, trace.Wrap(err)
	}
	return &out, nil
}

// SearchEvents reads the audit log: events since (zero: the whole
// retention), of eventType ("" for all), at most limit (0: the server's
// default), oldest first.
func (c *Client) SearchEvents(ctx context.Context, since time.Time, eventType string, limit int) ([]events.Event, error) {
	q := url.Values{}
	if !since.IsZero() {
		q.Set("since", since.UTC().Format(time.RFC3339Nano))
	}
	if eventType != "" {
		q.Set("type", eventType)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out []events.Event
	return out, trace.Wrap(c.do(ctx, http.MethodGet, "/v1/events", q, nil, &out))
}
