package auth

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
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
	// Deps: Clock is the time used to verify the server certificate.
	observe.Deps
	// Timeout bounds each call (watches excepted); zero means
	// DefaultClientTimeout.
	Timeout time.Duration
	// Dial opens the byte stream the mutual TLS runs over; nil means TCP
	// to Addr. A tunnel node dials through its tunnel (the proxy splices
	// it to the auth API: auth still sees the node's own client cert).
	// With Dial, the first address is the only server (the failover is
	// then the proxy's, see DialRelay).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DialTimeout bounds connecting to one auth server, TCP and TLS
	// handshake (failover.go); zero means Timeout with one address, and
	// the lesser of Timeout and 5s with several.
	DialTimeout time.Duration
}

// CheckAndSetDefaults validates the config.
func (c *ClientConfig) CheckAndSetDefaults() error {
	if c.Addr == "" {
		return trace.BadParameter("auth client: missing Addr")
	}
	if c.Identity == nil && c.TLS == nil {
		return trace.BadParameter("auth client: missing Identity or TLS config")
	}
	c.Deps.SetDefaults(observe.ComponentAuthClient)
	if c.Timeout <= 0 {
		c.Timeout = DefaultClientTimeout
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = c.Timeout
		if len(SplitAuthAddrs(c.Addr)) > 1 && c.DialTimeout > maxFailoverDialTimeout {
			c.DialTimeout = maxFailoverDialTimeout
		}
	}
	return nil
}

// Client calls the auth API. Its methods mirror the Store's and the
// Server's, so narrow interfaces (srv.AccessPoint, services.NodeEvents)
// are satisfied by a local Store and a remote Client alike.
type Client struct {
	cfg       ClientConfig
	servers   *authServers
	transport *http.Transport
	http      *http.Client
	// tlsCfg is the client's mutual TLS, for DialRelay's liveness check.
	tlsCfg *tls.Config
	// relay, when set, opens what DialRelay returns (an in-process
	// client's memory connection, inproc.go).
	relay func(ctx context.Context) (net.Conn, error)
	// watchSilence is how long a watch stream may stay silent before it
	// is given up (DefaultWatchSilence; tests shorten it).
	watchSilence time.Duration

	// closeCtx ends the fail-back probe (failover.go) on Close; wg waits
	// for it.
	closeCtx context.Context
	closeFn  context.CancelFunc
	wg       sync.WaitGroup
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
	transport := &http.Transport{
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     time.Minute,
		ForceAttemptHTTP2:   false,
	}
	if cfg.Dial != nil {
		addrs = addrs[:1]
		transport.DialContext = cfg.Dial
		transport.TLSClientConfig = tlsCfg
		transport.TLSHandshakeTimeout = cfg.Timeout
	} else {
		// The handshake is the dialer's, under its short deadline: that
		// is how a frozen server is told from a live one (failover.go).
		transport.DialTLSContext = (&tlsDialer{tls: tlsCfg, timeout: cfg.DialTimeout}).DialTLSContext
	}
	closeCtx, closeFn := context.WithCancel(context.Background())
	return &Client{
		cfg:       cfg,
		servers:   newAuthServers(addrs, cfg.Clock, cfg.Logger),
		transport: transport,
		http:      &http.Client{Transport: transport},
		tlsCfg:    tlsCfg,

		watchSilence: DefaultWatchSilence,
		closeCtx:     closeCtx,
		closeFn:      closeFn,
	}, nil
}

// Close releases idle connections and stops a fail-back probe. Watches
// are closed by their owners.
func (c *Client) Close() error {
	c.closeFn()
	c.wg.Wait()
	c.transport.CloseIdleConnections()
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

// CreateSSOAuthRequest starts an SSO login (proxy only): it answers the
// identity provider's authorization URL to send the browser to.
func (c *Client) CreateSSOAuthRequest(ctx context.Context, req authapi.SSOAuthRequest) (*authapi.SSOAuthResponse, error) {
	return call[authapi.SSOAuthResponse](ctx, c, http.MethodPost, "/v1/sso/requests", nil, req)
}

// ValidateSSOCallback finishes an SSO login with the identity provider's
// callback query (proxy only). It is sent once: its state is single use.
func (c *Client) ValidateSSOCallback(ctx context.Context, req authapi.SSOCallbackRequest) (*authapi.SSOCallbackResponse, error) {
	return call[authapi.SSOCallbackResponse](ctx, c, http.MethodPost, "/v1/sso/callback", nil, req)
}

// GetSSOConnectors lists the SSO connectors' names, types and display
// names (proxy only).
func (c *Client) GetSSOConnectors(ctx context.Context) ([]authapi.SSOConnectorInfo, error) {
	var out []authapi.SSOConnectorInfo
	return out, trace.Wrap(c.do(ctx, http.MethodGet, "/v1/sso/connectors", nil, nil, &out))
}

// UpsertOIDCConnector creates or replaces an oidc_connector (admin).
func (c *Client) UpsertOIDCConnector(ctx context.Context, conn *services.OIDCConnector) error {
	return trace.Wrap(c.do(ctx, http.MethodPut, "/v1/oidc_connectors", nil, conn, nil))
}

// GetOIDCConnectors lists the oidc_connectors, without inline secrets
// (admin).
func (c *Client) GetOIDCConnectors(ctx context.Context) ([]services.OIDCConnector, error) {
	var out []services.OIDCConnector
	return out, trace.Wrap(c.do(ctx, http.MethodGet, "/v1/oidc_connectors", nil, nil, &out))
}

// DeleteOIDCConnector removes an oidc_connector (admin).
func (c *Client) DeleteOIDCConnector(ctx context.Context, name string) error {
	return trace.Wrap(c.do(ctx, http.MethodDelete, "/v1/oidc_connectors/"+url.PathEscape(name), nil, nil, nil))
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
