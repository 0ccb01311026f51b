package auth

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// registerRoutes lists every endpoint with the roles allowed to call it.
// The table is the authorization policy of the API: read it as such. Each
// row names exactly the roles whose processes call the endpoint (callers:
// lib/service and lib/srv for nodes, lib/service, lib/web and lib/proxy
// for proxies, tool/pctl for admins); a role that does not need an
// endpoint does not get it. In particular a proxy acts for a user only by
// presenting that user's password and OTP (/v1/login/ssh): it cannot ask
// for a certificate for a name (/v1/certs/user is pctl's, admin only).
func (a *APIServer) registerRoutes() {
	const node, proxy, admin = RoleNode, RoleProxy, RoleAdmin

	// The only endpoint reachable without a client certificate.
	a.routes = append(a.routes, apiRoute{pattern: "POST /v1/join"})
	a.joinMux.HandleFunc("POST /v1/join", func(w http.ResponseWriter, r *http.Request) {
		a.respond(w, r, nil, a.join)
	})
	// A leaf cluster's auth server spending a trusted_cluster token (see
	// trustedclusters.go): the token is the credential, like a join's.
	a.routes = append(a.routes, apiRoute{pattern: "POST " + trustedClusterRegisterPath})
	a.joinMux.HandleFunc("POST "+trustedClusterRegisterPath, func(w http.ResponseWriter, r *http.Request) {
		a.respond(w, r, nil, a.trustedClusterRegister)
	})

	// Joins relayed by a proxy for hosts that reach only the proxy: the
	// client's address in the request is believed from a proxy only
	// (joinrelay.go).
	a.handleStream("GET /v1/join-relay", allow(proxy), a.joinRelay)
	// Who am I: any identity may check that it is accepted.
	a.handle("GET /v1/ping", allow(node, proxy, admin), a.ping)
	// Nodes: hosts (node and proxy processes) announce themselves (their
	// own record only, dated and verified by auth); an admin may write a
	// record as given (repairs, and the tests that plant inventory); proxies
	// route from the inventory (list and watch); pctl lists and deletes,
	// and `pctl route` runs the proxy's NodeWatcher on the watch.
	a.handle("PUT /v1/nodes", allow(node, proxy, admin), a.audited("PUT /v1/nodes", a.upsertNode))
	a.handle("GET /v1/nodes", allow(proxy, admin), a.getNodes)
	a.handle("DELETE /v1/nodes/{cluster}/{uuid}", allow(admin), a.deleteNode)
	a.handleStream("GET /v1/watch/nodes", allow(proxy, admin), a.watchNodes)
	// OpenSSH servers (opensshnodes.go): an admin registers one and has
	// auth sign its host certificate (pctl nodes add-openssh), or
	// reissues that certificate (rotate-openssh). Hosts never: a node or
	// proxy that could would get a host certificate for any name.
	a.handle("POST /v1/nodes/openssh", allow(admin), a.addOpenSSHNode)
	a.handle("POST /v1/nodes/openssh/{name}/rotate", allow(admin), a.rotateOpenSSHNode)
	// A root cluster's user on one of this (leaf) cluster's OpenSSH
	// nodes (opensshroot.go): the leaf's proxy asks for the root proxy's
	// web terminal; auth checks the root certificate and the role_map
	// itself, and signs only the logins the mapped roles allow there.
	a.handle("POST /v1/nodes/openssh/{uuid}/root-user-cert", allow(proxy), a.openSSHRootUserCert)
	// Where tunnels live: a proxy writes leases for the tunnels it holds
	// (for itself only: the proxy is the caller's certificate ID) and
	// every proxy watches them to dial a peer that holds one; `pctl
	// route` reads them to say which proxy a tunnel node is reached via.
	a.handle("POST /v1/tunnel_connections", allow(proxy), a.audited("POST /v1/tunnel_connections", a.upsertTunnelConnections))
	a.handle("POST /v1/tunnel_connections/delete", allow(proxy), a.audited("POST /v1/tunnel_connections/delete", a.deleteTunnelConnections))
	a.handle("GET /v1/tunnel_connections", allow(proxy, admin), a.getTunnelConnections)
	a.handleStream("GET /v1/watch/tunnel_connections", allow(proxy), a.watchTunnelConnections)
	// Proxies: each proxy heartbeats its own record (and removes it on a
	// clean shutdown); proxies read the list to announce it to tunnel
	// agents and to find their peers; pctl proxies ls lists them. Nodes
	// get the list from the tunnel server, never from auth.
	a.handle("PUT /v1/proxies", allow(proxy), a.audited("PUT /v1/proxies", a.upsertProxy))
	a.handle("DELETE /v1/proxies/self", allow(proxy), a.deleteProxy)
	a.handle("GET /v1/proxies", allow(proxy, admin), a.getProxies)
	// Public CA keys: nodes and proxies check user certificates with them,
	// pctl auth sign writes the host CA into the identity file.
	a.handle("GET /v1/authorities/{type}", allow(node, proxy, admin), a.getCAs)
	a.handle("GET /v1/authorities/{type}/{cluster}", allow(node, proxy, admin), a.getCA)
	// Roles: nodes and proxies read the roles a certificate names (RBAC
	// is evaluated live); listing and writing is administration.
	// Proxies and nodes load every role into their AccessCache (they
	// could already read any role by name).
	a.handle("GET /v1/roles", allow(node, proxy, admin), a.getRoles)
	a.handleStream("GET /v1/watch/access", allow(node, proxy), a.watchAccess)
	a.handle("GET /v1/roles/{name}", allow(node, proxy, admin), a.getRole)
	a.handle("PUT /v1/roles", allow(admin), a.upsertRole)
	a.handle("DELETE /v1/roles/{name}", allow(admin), a.deleteRole)
	// Networking (routing strategy): the proxy's router reads it.
	// Nodes read and watch it too: session_recording and record_input
	// live there, and a node serves them from a watcher (no read per
	// session).
	a.handle("GET /v1/networking", allow(node, proxy, admin), a.getNetworking)
	a.handleStream("GET /v1/watch/networking", allow(node, proxy), a.watchNetworking)
	a.handle("PUT /v1/networking", allow(admin), a.setNetworking)
	// Users and tokens: administration only.
	a.handle("GET /v1/users", allow(admin), a.getUsers)
	a.handle("POST /v1/users", allow(admin), a.createUser)
	a.handle("DELETE /v1/users/{name}", allow(admin), a.deleteUser)
	a.handle("PUT /v1/users/{name}", allow(admin), a.updateUser)
	a.handle("PUT /v1/users/{name}/password", allow(admin), a.resetPassword)
	a.handle("DELETE /v1/users/{name}/lockout", allow(admin), a.clearLockout)
	a.handle("DELETE /v1/users/{name}/mfa", allow(admin), a.resetMFA)
	// The cluster's auth_preference: pctl writes it; proxies read it
	// (the web login page's options).
	a.handle("GET /v1/auth_preference", allow(proxy, admin), a.getAuthPreference)
	a.handle("PUT /v1/auth_preference", allow(admin), a.setAuthPreference)
	a.handle("DELETE /v1/auth_preference", allow(admin), a.deleteAuthPreference)
	a.handle("GET /v1/tokens", allow(admin), a.getTokens)
	a.handle("POST /v1/tokens", allow(admin), a.createToken)
	a.handle("DELETE /v1/tokens/{name}", allow(admin), a.deleteToken)
	// Trust between clusters: on a leaf, pctl create/get/rm of
	// trusted_cluster, and its nodes and proxies read them (without
	// tokens) to accept the root's users; on a root, pctl clusters ls/rm.
	a.handle("PUT /v1/trustedclusters", allow(admin), a.upsertTrustedCluster)
	a.handle("GET /v1/trustedclusters", allow(node, proxy, admin), a.getTrustedClusters)
	a.handle("DELETE /v1/trustedclusters/{name}", allow(admin), a.deleteTrustedCluster)
	a.handle("GET /v1/remoteclusters", allow(proxy, admin), a.getRemoteClusters)
	a.handle("DELETE /v1/remoteclusters/{name}", allow(admin), a.deleteRemoteCluster)
	// Leaf tunnels: a leaf's proxy gets a certificate of role leaf for
	// its tunnels to roots; a root's proxy reports the leaves whose
	// tunnels it holds (status and last_connected).
	a.handle("POST /v1/certs/leaf", allow(proxy), a.generateLeafTunnelCert)
	a.handle("PUT /v1/remoteclusters/{name}/heartbeat", allow(proxy), a.touchRemoteCluster)
	// A certificate for a name, without a password: pctl auth sign only.
	a.handle("POST /v1/certs/user", allow(admin), a.generateUserCert)
	// Logins with the user's own credentials: the proxy's web API.
	a.handle("POST /v1/login", allow(proxy), a.authenticateUser)
	a.handle("POST /v1/login/ssh", allow(proxy), a.authenticateSSHUser)
	// The second-factor hint of the proxy's /webapi/ping (secondfactor.go).
	a.handle("GET /v1/second-factor", allow(proxy), a.getSecondFactor)
	// Passkeys (webauthn.go, webauthnlogin.go, mfa.go): the proxy carries
	// the browser's ceremonies. A login proves itself (the password,
	// then the assertion); everything else names a web session by its
	// two secrets, like /v1/websessions/*: a proxy can act only for a
	// browser that presented its session.
	a.handle("POST /v1/mfa/login/begin", allow(proxy), a.mfaLoginBegin)
	a.handle("POST /v1/mfa/login/finish", allow(proxy), a.mfaLoginFinish)
	a.handle("POST /v1/mfa/register/begin", allow(proxy), a.mfaRegisterBegin)
	a.handle("POST /v1/mfa/register/finish", allow(proxy), a.audited("POST /v1/mfa/register/finish", a.mfaRegisterFinish))
	a.handle("POST /v1/mfa/devices/list", allow(proxy), a.mfaListDevices)
	a.handle("POST /v1/mfa/devices/rename", allow(proxy), a.mfaRenameDevice)
	a.handle("POST /v1/mfa/devices/delete", allow(proxy), a.audited("POST /v1/mfa/devices/delete", a.mfaDeleteDevice))
	// Single sign-on (sso.go): the proxy starts a login at the identity
	// provider and hands auth the provider's callback; auth decides.
	// Connector info (name, type, display) is for the proxy's login page.
	a.handle("POST /v1/sso/requests", allow(proxy), a.createSSOAuthRequest)
	a.handle("POST /v1/sso/callback", allow(proxy), a.validateSSOCallback)
	a.handle("GET /v1/sso/connectors", allow(proxy), a.getSSOConnectors)
	// psh login --auth web (clilogin.go).
	a.handle("POST /v1/cli-logins", allow(proxy), a.createCLILogin)
	a.handle("POST /v1/cli-logins/finish", allow(proxy), a.finishCLILogin)
	a.handle("POST /v1/cli-logins/session", allow(proxy), a.createSessionMFALogin)
	// Per-session MFA (sessionmfa.go).
	a.handle("POST /v1/mfa/session/begin", allow(proxy), a.beginSessionMFA)
	a.handle("POST /v1/mfa/session/certs", allow(proxy), a.issueSessionCert)
	// SSO connectors: pctl create/get/rm (secrets never leave auth).
	a.handle("PUT /v1/oidc_connectors", allow(admin), a.upsertOIDCConnector)
	a.handle("GET /v1/oidc_connectors", allow(admin), a.getOIDCConnectors)
	a.handle("DELETE /v1/oidc_connectors/{name}", allow(admin), a.deleteOIDCConnector)
	// Web sessions: any proxy serves any browser (websessions.go says
	// why a proxy cannot mint a session or a certificate from these, nor
	// act on a session no browser presented to it: every call names the
	// session by its two secrets, and the watch carries only ends).
	a.handle("POST /v1/websessions/get", allow(proxy), a.audited("POST /v1/websessions/get", a.getWebSession))
	a.handle("POST /v1/websessions/touch", allow(proxy), a.audited("POST /v1/websessions/touch", a.touchWebSession))
	a.handle("POST /v1/websessions/delete", allow(proxy), a.audited("POST /v1/websessions/delete", a.deleteWebSession))
	a.handle("POST /v1/websessions/certs", allow(proxy), a.webSessionCerts)
	a.handleStream("GET /v1/watch/websessions/ended", allow(proxy), a.watchWebSessionEnds)
	// Retired: by key, and the watch of every session's key. Refused to
	// every role, so that a call is audited as api.denied.
	nobody := []string{}
	a.handle("GET /v1/websessions/{key}", nobody, a.refuseByKey)
	a.handle("POST /v1/websessions/{key}/touch", nobody, a.refuseByKey)
	a.handle("DELETE /v1/websessions/{key}", nobody, a.refuseByKey)
	a.handle("GET /v1/watch/websessions", nobody, a.refuseByKey)
	a.handle("GET /v1/events", allow(admin), a.searchEvents)
	// Locks: admins write them (pctl lock/unlock); every host enforces
	// them, so nodes and proxies load and watch them; pctl lists them.
	a.handle("PUT /v1/locks", allow(admin), a.upsertLock)
	a.handle("DELETE /v1/locks/{kind}/{name}", allow(admin), a.deleteLock)
	a.handle("GET /v1/locks", allow(node, proxy, admin), a.getLocks)
	a.handleStream("GET /v1/watch/locks", allow(node, proxy), a.watchLocks)
	// Audit events of the processes without a backend of their own (node-
	// and proxy-only hosts); admins and auth write events locally.
	a.handle("POST /v1/events", allow(node, proxy), a.shipEvents)
	// Session recordings: nodes upload the sessions they ran (their own
	// only: PutRecordingChunk checks the header's node against the
	// caller), proxies those of their web terminals to OpenSSH nodes (and
	// no other node's); pctl reads them, and the proxy for psh play and
	// the web player, which decide per user what may be seen (lib/web).
	a.handle("PUT /v1/recordings/{session}/chunks/{n}", allow(node, proxy), a.audited("PUT /v1/recordings", a.putRecordingChunk))
	a.handle("GET /v1/recordings/{session}/last", allow(node, proxy), a.lastRecordingChunk)
	a.handle("GET /v1/recordings", allow(proxy, admin), a.listRecordings)
	a.handleStream("GET /v1/recordings/{session}", allow(proxy, admin), a.streamRecording)
	// Access requests (accessrequestsapi.go).
	a.registerAccessRequestRoutes()
	// Backups (pctl backup): the whole backend, CA private keys included.
	a.handleStream("GET "+backupPath, allow(admin), a.streamBackup)
}

// maxEventsPerSearch bounds one answer: enough for an operator's screen
// and a script's page, small enough that a careless query cannot make the
// auth server marshal a month of history.
const maxEventsPerSearch = 10000

// searchEvents answers GET /v1/events?since=RFC3339&type=T&limit=N.
func (a *APIServer) searchEvents(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	if a.auth.cfg.AuditLog == nil {
		return nil, trace.NotImplemented("the audit log is not searchable on this auth server")
	}
	q := r.URL.Query()
	var since time.Time
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return nil, trace.BadParameter("since %q: want an RFC 3339 time", v)
		}
		since = t
	}
	limit := 1000
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > maxEventsPerSearch {
			return nil, trace.BadParameter("limit %q: want 1 to %d", v, maxEventsPerSearch)
		}
		limit = n
	}
	found, err := a.auth.cfg.AuditLog.Search(ctx, since, q.Get("type"), limit)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if found == nil {
		found = []events.Event{}
	}
	return found, nil
}

func (a *APIServer) join(ctx context.Context, _ *peer, r *http.Request) (out any, err error) {
	var req authapi.RegisterRequest
	defer func() { a.emitJoin(ctx, r, &req, out, err) }()
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := a.auth.joinLimiter.check("", r.RemoteAddr); err != nil {
		return nil, trace.Wrap(err)
	}
	req.RemoteAddr = r.RemoteAddr
	resp, err := a.auth.RegisterUsingToken(ctx, req)
	if err != nil {
		if trace.IsAccessDenied(err) {
			a.auth.joinLimiter.failure("", r.RemoteAddr)
		}
		return nil, trace.Wrap(err)
	}
	return resp, nil
}

func (a *APIServer) ping(_ context.Context, p *peer, _ *http.Request) (any, error) {
	return authapi.PingResponse{ClusterName: a.auth.cfg.ClusterName, ID: p.ID, Role: p.Role}, nil
}

// upsertNode records a heartbeat. A node or proxy goes through
// AnnounceNode: it may only write its own record (UUID = certificate CN)
// in its own cluster, the server sets the times, and the address must
// answer with the caller's host certificate. Admins (and the auth
// identity) write what they send.
func (a *APIServer) upsertNode(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var node services.Node
	if err := readJSON(r, &node); err != nil {
		return nil, trace.Wrap(err)
	}
	if p.Role == RoleNode || p.Role == RoleProxy {
		err := a.auth.AnnounceNode(ctx, p.ID, p.Role, r.RemoteAddr, node)
		if trace.IsBadParameter(err) {
			// A name or labels a join would refuse (NAME.CLUSTER, another
			// node's UUID, control characters): a host that joined
			// honestly and renames itself into one is as much an attack
			// as a join with it, and is audited like a refused join.
			// AccessDenied answers are audited by the route's wrapper.
			a.emitAPIDenied(ctx, p, r, "PUT /v1/nodes", err, events.Fields{
				events.FieldHostname: node.Hostname,
			})
		}
		return nil, trace.Wrap(err)
	}
	if node.Cluster == "" {
		node.Cluster = a.auth.cfg.ClusterName
	}
	return nil, trace.Wrap(a.auth.store.UpsertNode(ctx, node))
}

func (a *APIServer) getNodes(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	nodes, err := a.auth.store.GetNodes(ctx, r.URL.Query().Get("cluster"))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if nodes == nil {
		nodes = []services.Node{}
	}
	return nodes, nil
}

func (a *APIServer) upsertProxy(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var rec services.Proxy
	if err := readJSON(r, &rec); err != nil {
		return nil, trace.Wrap(err)
	}
	return nil, trace.Wrap(a.auth.AnnounceProxy(ctx, p.ID, rec))
}

func (a *APIServer) deleteProxy(ctx context.Context, p *peer, _ *http.Request) (any, error) {
	return nil, trace.Wrap(a.auth.RemoveProxy(ctx, p.ID))
}

func (a *APIServer) getProxies(ctx context.Context, _ *peer, _ *http.Request) (any, error) {
	out, err := a.auth.store.GetProxies(ctx, a.auth.cfg.ClusterName)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if out == nil {
		out = []services.Proxy{}
	}
	return out, nil
}

func (a *APIServer) deleteNode(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	return nil, trace.Wrap(a.auth.store.DeleteNode(ctx, r.PathValue("cluster"), r.PathValue("uuid")))
}

func (a *APIServer) getCA(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	ca, err := a.auth.store.GetCertAuthority(ctx, r.PathValue("cluster"), services.CertAuthType(r.PathValue("type")), false)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	// Defence in depth: never let a secret out, whatever the store did.
	return publicCA(ca), nil
}

func (a *APIServer) getCAs(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	cas, err := a.auth.store.GetCertAuthorities(ctx, services.CertAuthType(r.PathValue("type")), false)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	out := make([]services.CertAuthority, 0, len(cas))
	for i := range cas {
		out = append(out, *publicCA(&cas[i]))
	}
	return out, nil
}

func (a *APIServer) getRoles(ctx context.Context, _ *peer, _ *http.Request) (any, error) {
	roles, err := a.auth.store.GetRoles(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if roles == nil {
		roles = []*services.Role{}
	}
	return roles, nil
}

func (a *APIServer) getRole(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	role, err := a.auth.store.GetRole(ctx, r.PathValue("name"))
	return role, trace.Wrap(err)
}

func (a *APIServer) upsertRole(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var role services.Role
	if err := readJSON(r, &role); err != nil {
		return nil, trace.Wrap(err)
	}
	return nil, trace.Wrap(a.auth.store.UpsertRole(ctx, &role))
}

func (a *APIServer) deleteRole(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	return nil, trace.Wrap(a.auth.DeleteRole(ctx, r.PathValue("name")))
}

func (a *APIServer) getNetworking(ctx context.Context, _ *peer, _ *http.Request) (any, error) {
	cfg, err := a.auth.store.GetClusterNetworkingConfig(ctx)
	return cfg, trace.Wrap(err)
}

func (a *APIServer) setNetworking(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var cfg services.ClusterNetworkingConfig
	if err := readJSON(r, &cfg); err != nil {
		return nil, trace.Wrap(err)
	}
	return nil, trace.Wrap(a.auth.store.SetClusterNetworkingConfig(ctx, &cfg))
}

func (a *APIServer) getUsers(ctx context.Context, _ *peer, _ *http.Request) (any, error) {
	users, err := a.auth.ListUsers(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if users == nil {
		users = []services.User{}
	}
	return users, nil
}

func (a *APIServer) createUser(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.CreateUserRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	url, err := a.auth.CreateUser(ctx, req.Name, []byte(req.Password), req.Logins, req.Roles, req.OTP)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return authapi.CreateUserResponse{TOTPURL: url}, nil
}

func (a *APIServer) deleteUser(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	return nil, trace.Wrap(a.auth.DeleteUser(ctx, r.PathValue("name")))
}

func (a *APIServer) updateUser(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var req authapi.UpdateUserRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	user, err := a.auth.UpdateUser(ctx, r.PathValue("name"), req.Roles, req.Logins)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	a.log.WithFields(map[string]any{"user": user.Name, "by": p.ID}).Info("User updated over the API.")
	return user, nil
}

func (a *APIServer) resetPassword(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var req authapi.ResetPasswordRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	ended, err := a.auth.ResetPassword(ctx, r.PathValue("name"), []byte(req.Password))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	a.log.WithFields(map[string]any{"user": r.PathValue("name"), "by": p.ID}).Info("Password reset over the API.")
	return authapi.ResetPasswordResponse{WebSessionsEnded: ended}, nil
}

// clearLockout clears the failed-login counts and lockouts of a user (and,
// with ?addr=, of that source address for every user).
func (a *APIServer) clearLockout(ctx context.Context, p *peer, r *http.Request) (any, error) {
	addr := r.URL.Query().Get("addr")
	cleared, err := a.auth.ClearLockout(ctx, r.PathValue("name"), addr)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	a.log.WithFields(map[string]any{"user": r.PathValue("name"), "addr": addr, "by": p.ID}).Info("Login lockout cleared over the API.")
	return authapi.ClearLockoutResponse{Cleared: cleared}, nil
}

func (a *APIServer) getTokens(ctx context.Context, _ *peer, _ *http.Request) (any, error) {
	tokens, err := a.auth.store.GetTokens(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if tokens == nil {
		tokens = []services.Token{}
	}
	return tokens, nil
}

func (a *APIServer) createToken(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.CreateTokenRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	tok, err := a.auth.CreateToken(ctx, req.Type, req.TTL.Value())
	return tok, trace.Wrap(err)
}

func (a *APIServer) deleteToken(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	return nil, trace.Wrap(a.auth.store.DeleteToken(ctx, r.PathValue("name")))
}

func (a *APIServer) generateUserCert(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var req authapi.UserCertRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	cert, err := a.auth.GenerateUserCert(ctx, req)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	a.log.WithFields(map[string]any{"user": req.User, "by": p.ID, "ttl": time.Duration(req.TTL).String()}).Info("Signed user certificate over the API.")
	return authapi.CertResponse{Cert: cert}, nil
}

func (a *APIServer) authenticateUser(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.AuthRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	user, err := a.auth.AuthenticateUser(ctx, req)
	return user, trace.Wrap(err)
}

func (a *APIServer) authenticateSSHUser(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.SSHLoginRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.AuthenticateSSHUser(ctx, req)
	return resp, trace.Wrap(err)
}

func (a *APIServer) createSSOAuthRequest(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.SSOAuthRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.CreateSSOAuthRequest(ctx, req)
	return resp, trace.Wrap(err)
}

func (a *APIServer) validateSSOCallback(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.SSOCallbackRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.ValidateSSOCallback(ctx, req)
	return resp, trace.Wrap(err)
}

func (a *APIServer) getSSOConnectors(ctx context.Context, _ *peer, _ *http.Request) (any, error) {
	cs, err := a.auth.GetSSOConnectors(ctx)
	return nonNil(cs), trace.Wrap(err)
}

func (a *APIServer) upsertOIDCConnector(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var c services.OIDCConnector
	if err := readJSON(r, &c); err != nil {
		return nil, trace.Wrap(err)
	}
	return nil, trace.Wrap(a.auth.UpsertOIDCConnector(ctx, &c))
}

// getOIDCConnectors answers the connectors without their inline secrets,
// even to an admin: the secret is the auth server's alone.
func (a *APIServer) getOIDCConnectors(ctx context.Context, _ *peer, _ *http.Request) (any, error) {
	cs, err := a.auth.GetOIDCConnectors(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return nonNil(cs), nil
}

func (a *APIServer) deleteOIDCConnector(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	return nil, trace.Wrap(a.auth.DeleteOIDCConnector(ctx, r.PathValue("name")))
}
