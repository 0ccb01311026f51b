package auth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"slices"
	"strings"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// Trust between clusters (docs/leaf-clusters.md), in one exchange.
//
// The root's admin makes a trusted_cluster token; it prints as
// SECRET@sha256:PIN, the pin being the root's TLS CA. The leaf's admin
// writes a trusted_cluster resource carrying it; the leaf's auth server
// then reaches the root's auth API through the root proxy's join relay (a
// raw byte pipe: the proxy sees ciphertext only), runs TLS to the root's
// join listener checked against the pin, exactly as a joining node does,
// and POSTs the secret with its own CA public keys. The root spends the
// token, stores the leaf's CAs and a remote_cluster record, and answers
// with its CA public keys, which the leaf stores.
//
// Why this is safe against a man in the middle at proxy_addr: the TLS is
// pinned end to end to the root's auth server, so without the root CA's
// private key nobody can read the secret or substitute either side's CAs.
// Why a leaf cannot take over the root or another leaf: the root refuses
// its own name, a name that already has a CA here (another leaf's, or
// this cluster's root's), and a token of any other type; the token is
// spent once. The relation is one way: the root stores the leaf's CAs
// but never accepts the leaf's users (lib/srv checks user certificates of
// other clusters only against an enabled trusted_cluster, which only a
// leaf has), and the leaf accepts the root's users only through its
// role_map.

// trustedClusterRegisterPath is the root's endpoint on its join listener.
const trustedClusterRegisterPath = "/v1/join/trusted_cluster"

// DialProxyFunc opens a raw byte stream to a cluster's auth API through
// that cluster's proxy web address (lib/web.DialJoinRelay): the leaf's
// auth server has no route to the root's auth port, only to its proxy.
type DialProxyFunc func(ctx context.Context, proxyWebAddr string) (net.Conn, error)

// RegisterLeafCluster is the root's side of the exchange. A malformed
// request is refused first, then the token is checked (without spending
// it), then the names: a colliding request never burns a token, and only
// a token holder learns which names are taken. ConsumeToken is the commit
// point.
func (s *Server) RegisterLeafCluster(ctx context.Context, req authapi.TrustedClusterRequest) (*authapi.TrustedClusterResponse, error) {
	if req.Token == "" {
		return nil, trace.BadParameter("missing trusted_cluster token")
	}
	if err := services.CheckClusterName(req.LeafName); err != nil {
		return nil, trace.BadParameter("leaf cluster name: %v", err)
	}
	if req.RootName != s.cfg.ClusterName {
		return nil, trace.BadParameter("the trusted_cluster names the root %q, but this cluster is %q: set metadata.name to %q", req.RootName, s.cfg.ClusterName, s.cfg.ClusterName)
	}
	if req.LeafName == s.cfg.ClusterName {
		return nil, trace.BadParameter("the leaf cluster is named %q, like this root cluster: a leaf needs a cluster name of its own", req.LeafName)
	}
	hostKeys, err := checkForeignCAKeys("host", req.HostCAKeys)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	userKeys, err := checkForeignCAKeys("user", req.UserCAKeys)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	// Only a token holder learns whether a name is taken here (and gets
	// the auth server to read more than the token).
	if _, err := s.store.CheckToken(ctx, req.Token, services.TokenTypeTrustedCluster); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := s.checkClusterNameFree(ctx, req.LeafName); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := s.checkNoNodeUnder(ctx, req.LeafName); err != nil {
		return nil, trace.Wrap(err)
	}
	if _, err := s.store.ConsumeToken(ctx, req.Token, services.TokenTypeTrustedCluster); err != nil {
		return nil, trace.Wrap(err)
	}
	// The CA writes are create-only: of two leaves racing for one name
	// with two tokens, one gets the name and the other an error.
	if err := s.storeForeignCAs(ctx, req.LeafName, hostKeys, userKeys); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := s.store.CreateRemoteCluster(ctx, services.RemoteCluster{Name: req.LeafName, Created: s.clock.Now().UTC()}); err != nil {
		s.deleteForeignCAs(ctx, req.LeafName)
		return nil, trace.Wrap(err)
	}
	s.log.WithFields(map[string]any{"leaf": req.LeafName, "remote_addr": req.RemoteAddr}).Info("Leaf cluster established trust.")
	return &authapi.TrustedClusterResponse{
		ClusterName: s.cfg.ClusterName,
		HostCAKeys:  s.HostCAKeys(),
		UserCAKeys:  s.UserCAKeys(),
	}, nil
}

// checkClusterNameFree refuses a name this cluster already trusts in any
// way: its own, a leaf's, or the root it is a leaf of. A CA under the
// name counts too (whatever record is missing), since the CA is what
// would be taken over.
func (s *Server) checkClusterNameFree(ctx context.Context, name string) error {
	if name == s.cfg.ClusterName {
		return trace.BadParameter("cluster name %q is this cluster's own", name)
	}
	if _, err := s.store.GetRemoteCluster(ctx, name); err == nil {
		return trace.AlreadyExists("cluster %q is already a leaf of this cluster (pctl clusters rm %s removes it)", name, name)
	} else if !trace.IsNotFound(err) {
		return trace.Wrap(err)
	}
	if _, err := s.store.GetTrustedCluster(ctx, name); err == nil {
		return trace.AlreadyExists("cluster %q is a root this cluster trusts (trusted_cluster/%s)", name, name)
	} else if !trace.IsNotFound(err) {
		return trace.Wrap(err)
	}
	for _, t := range []services.CertAuthType{services.HostCA, services.UserCA} {
		if _, err := s.store.GetCertAuthority(ctx, name, t, false); err == nil {
			return trace.AlreadyExists("cluster %q already has a %s certificate authority here", name, t)
		} else if !trace.IsNotFound(err) {
			return trace.Wrap(err)
		}
	}
	return nil
}

// checkNoNodeUnder refuses to trust a cluster whose name one of this
// cluster's nodes already uses as a suffix (NAME.CLUSTER as its hostname
// or its address's host, both principals of its certificate): once
// trusted, rule 0 makes NAME.CLUSTER mean NAME in that cluster, and a
// node certified for the name by this cluster's CA would answer for it
// again the moment the trust went. Joins and heartbeats refuse such names
// from then on (knownClusters); this catches the ones that came first.
// The error names the node so the operator can rename it.
func (s *Server) checkNoNodeUnder(ctx context.Context, cluster string) error {
	nodes, err := s.store.GetNodes(ctx, s.cfg.ClusterName)
	if err != nil {
		return trace.Wrap(err)
	}
	suffix := "." + strings.ToLower(cluster)
	for _, n := range nodes {
		names := []string{n.Hostname}
		if host, _, err := net.SplitHostPort(n.Addr); err == nil {
			names = append(names, host)
		}
		for _, name := range names {
			if strings.HasSuffix(strings.ToLower(name), suffix) {
				return trace.AlreadyExists("node %q of cluster %q is called %q: NAME.%s would mean NAME in cluster %q once it is trusted; rename the node (--nodename) and remove its record (pctl nodes rm %s) before trusting %q",
					n.UUID, s.cfg.ClusterName, name, cluster, cluster, n.UUID, cluster)
			}
		}
	}
	return nil
}

// checkForeignCAKeys validates another cluster's CA public keys: plain
// keys (a certificate is no CA), at least one, and none of this
// cluster's own (a cluster claiming our keys is confused or hostile).
func checkForeignCAKeys(what string, keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, trace.BadParameter("no %s CA keys given", what)
	}
	out := make([]string, 0, len(keys))
	for i, k := range keys {
		pub, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(k))
		if err != nil || len(bytes.TrimSpace(rest)) > 0 {
			return nil, trace.BadParameter("%s CA key %d is not one authorized_keys line", what, i)
		}
		if _, ok := pub.(*ssh.Certificate); ok {
			return nil, trace.BadParameter("%s CA key %d is a certificate, not a CA key", what, i)
		}
		out = append(out, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))))
	}
	return out, nil
}

// storeForeignCAs writes another cluster's two CAs (public keys only),
// create-only; on failure nothing of it is left.
func (s *Server) storeForeignCAs(ctx context.Context, cluster string, hostKeys, userKeys []string) error {
	if err := s.store.CreateCertAuthority(ctx, services.CertAuthority{Type: services.HostCA, ClusterName: cluster, SSHPublicKeys: hostKeys}); err != nil {
		return trace.Wrap(err)
	}
	if err := s.store.CreateCertAuthority(ctx, services.CertAuthority{Type: services.UserCA, ClusterName: cluster, SSHPublicKeys: userKeys}); err != nil {
		_ = s.store.DeleteCertAuthority(ctx, cluster, services.HostCA)
		return trace.Wrap(err)
	}
	return nil
}

// deleteForeignCAs removes another cluster's CAs; never this cluster's.
func (s *Server) deleteForeignCAs(ctx context.Context, cluster string) {
	if cluster == s.cfg.ClusterName {
		return
	}
	for _, t := range []services.CertAuthType{services.HostCA, services.UserCA} {
		if err := s.store.DeleteCertAuthority(ctx, cluster, t); err != nil && !trace.IsNotFound(err) {
			s.log.WithError(err).WithFields(map[string]any{"cluster": cluster, "ca_type": t}).Warn("Cannot delete another cluster's CA.")
		}
	}
}

// GetRemoteClusters lists this cluster's leaves with their status now.
func (s *Server) GetRemoteClusters(ctx context.Context) ([]services.RemoteCluster, error) {
	rcs, err := s.store.GetRemoteClusters(ctx)
	now := s.clock.Now()
	for i := range rcs {
		rcs[i].StatusNow = rcs[i].Status(now)
	}
	return rcs, trace.Wrap(err)
}

// DeleteRemoteCluster removes a leaf and its CAs: its proxy's tunnels and
// its host certificates stop being trusted here.
func (s *Server) DeleteRemoteCluster(ctx context.Context, name string) error {
	if _, err := s.store.GetRemoteCluster(ctx, name); err != nil {
		return trace.Wrap(err)
	}
	s.deleteForeignCAs(ctx, name)
	if err := s.store.DeleteRemoteCluster(ctx, name); err != nil && !trace.IsNotFound(err) {
		return trace.Wrap(err)
	}
	s.cfg.Audit.Emit(ctx, events.Event{Type: events.LeafRemove, Fields: events.Fields{events.FieldRemoteCluster: name}})
	s.log.WithField("leaf", name).Info("Removed leaf cluster.")
	return nil
}

// UpsertTrustedCluster is the leaf's side: `pctl create -f` of a
// trusted_cluster. A new one runs the exchange with the root; an existing
// one (trust already established) only has its spec replaced, without
// contacting the root again: its token is spent, and the role map and
// enabled flag are the leaf's own business. Re-establishing trust (a new
// root CA, a new token) is `pctl rm trusted_cluster/NAME` and a create.
func (s *Server) UpsertTrustedCluster(ctx context.Context, tc *services.TrustedCluster) (*services.TrustedCluster, error) {
	if tc == nil {
		return nil, trace.BadParameter("missing trusted_cluster")
	}
	if err := tc.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	name := tc.Metadata.Name
	if name == s.cfg.ClusterName {
		return nil, trace.BadParameter("trusted_cluster %q: that is this cluster's own name; metadata.name is the root cluster's name", name)
	}
	if _, err := s.store.GetTrustedCluster(ctx, name); err == nil {
		if err := s.store.UpsertTrustedCluster(ctx, tc); err != nil {
			return nil, trace.Wrap(err)
		}
		s.log.WithField("root", name).Info("Updated trusted_cluster.")
		return tc, nil
	} else if !trace.IsNotFound(err) {
		return nil, trace.Wrap(err)
	}
	if err := s.checkClusterNameFree(ctx, name); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := s.checkNoNodeUnder(ctx, name); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := s.exchangeWithRoot(ctx, tc)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if resp.ClusterName != name {
		// The root checked RootName before spending the token, so only a
		// broken root gets here.
		return nil, trace.AccessDenied("the root at %s answered as cluster %q, not %q", tc.Spec.ProxyAddr, resp.ClusterName, name)
	}
	hostKeys, err := checkForeignCAKeys("root host", resp.HostCAKeys)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	userKeys, err := checkForeignCAKeys("root user", resp.UserCAKeys)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := s.storeForeignCAs(ctx, name, hostKeys, userKeys); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := s.store.UpsertTrustedCluster(ctx, tc); err != nil {
		s.deleteForeignCAs(ctx, name)
		return nil, trace.Wrap(err)
	}
	s.cfg.Audit.Emit(ctx, events.Event{Type: events.TrustAdd, Fields: events.Fields{
		events.FieldRemoteCluster: name, events.FieldAddr: tc.Spec.ProxyAddr,
	}})
	s.log.WithFields(map[string]any{"root": name, "proxy_addr": tc.Spec.ProxyAddr}).Info("Established trust in a root cluster.")
	return tc, nil
}

// GetTrustedClusters lists the roots this cluster trusts.
func (s *Server) GetTrustedClusters(ctx context.Context) ([]services.TrustedCluster, error) {
	tcs, err := s.store.GetTrustedClusters(ctx)
	return tcs, trace.Wrap(err)
}

// DeleteTrustedCluster withdraws trust in a root: the record and the
// root's CAs go, so the root's users and host certificates stop being
// accepted here.
func (s *Server) DeleteTrustedCluster(ctx context.Context, name string) error {
	if _, err := s.store.GetTrustedCluster(ctx, name); err != nil {
		return trace.Wrap(err)
	}
	// The record first: lib/srv accepts a root's users only while an
	// enabled trusted_cluster names the root, so its deletion alone cuts
	// them off; the CAs follow.
	if err := s.store.DeleteTrustedCluster(ctx, name); err != nil && !trace.IsNotFound(err) {
		return trace.Wrap(err)
	}
	s.deleteForeignCAs(ctx, name)
	s.cfg.Audit.Emit(ctx, events.Event{Type: events.TrustRemove, Fields: events.Fields{events.FieldRemoteCluster: name}})
	s.log.WithField("root", name).Info("Removed trusted_cluster.")
	return nil
}

// exchangeWithRoot runs the leaf's request to the root over the root
// proxy's join relay, TLS pinned to the root's CA.
func (s *Server) exchangeWithRoot(ctx context.Context, tc *services.TrustedCluster) (*authapi.TrustedClusterResponse, error) {
	if s.cfg.DialProxy == nil {
		return nil, trace.NotImplemented("this auth server cannot reach other clusters' proxies")
	}
	secret, pin, err := services.ParseTrustedClusterToken(tc.Spec.Token)
	if err != nil {
		return nil, trace.BadParameter("trusted_cluster %q: spec.token: %v", tc.Metadata.Name, err)
	}
	body, err := json.Marshal(authapi.TrustedClusterRequest{
		Token:      secret,
		RootName:   tc.Metadata.Name,
		LeafName:   s.cfg.ClusterName,
		HostCAKeys: s.HostCAKeys(),
		UserCAKeys: s.UserCAKeys(),
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultClientTimeout)
	defer cancel()
	addr := tc.Spec.ProxyAddr
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return s.cfg.DialProxy(ctx, addr)
		},
		TLSClientConfig:   joinTLSConfig(pin, s.clock),
		DisableKeepAlives: true,
	}
	defer transport.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+trustedClusterRegisterPath, bytes.NewReader(body))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		var pinErr *pinMismatchError
		if errors.As(err, &pinErr) {
			return nil, trace.AccessDenied("root cluster at %s: %s (is the token from this root?)", addr, pinErr.Error())
		}
		return nil, trace.ConnectionProblem(err, "reaching the root cluster's auth server through its proxy at %s: %v", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// The root's own message, with its kind: it names what was wrong.
		return nil, authapi.ReadErrorResponse(resp)
	}
	var out authapi.TrustedClusterResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, trace.ConnectionProblem(err, "root cluster at %s: bad answer: %v", addr, err)
	}
	return &out, nil
}

// trustedClusterRegister serves the root's join-listener endpoint: rate
// limited per source address like joins, and audited either way.
func (a *APIServer) trustedClusterRegister(ctx context.Context, _ *peer, r *http.Request) (out any, err error) {
	var req authapi.TrustedClusterRequest
	defer func() {
		fields := events.Fields{
			events.FieldRemoteAddr:    r.RemoteAddr,
			events.FieldRemoteCluster: req.LeafName,
		}
		typ := events.LeafAdd
		if err != nil {
			typ = events.LeafAddFailed
			fields[events.FieldReason] = trace.UserMessage(err)
		}
		a.auth.cfg.Audit.Emit(ctx, events.Event{Type: typ, Fields: fields})
	}()
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := a.auth.joinLimiter.check("", r.RemoteAddr); err != nil {
		return nil, trace.Wrap(err)
	}
	req.RemoteAddr = r.RemoteAddr
	resp, err := a.auth.RegisterLeafCluster(ctx, req)
	if err != nil {
		if trace.IsAccessDenied(err) {
			a.auth.joinLimiter.failure("", r.RemoteAddr)
		}
		return nil, trace.Wrap(err)
	}
	return resp, nil
}

func (a *APIServer) upsertTrustedCluster(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var tc services.TrustedCluster
	if err := readJSON(r, &tc); err != nil {
		return nil, trace.Wrap(err)
	}
	out, err := a.auth.UpsertTrustedCluster(ctx, &tc)
	return out, trace.Wrap(err)
}

// getTrustedClusters lists trusted clusters; only an admin sees the
// (spent) tokens, so that pctl get round-trips into pctl create.
func (a *APIServer) getTrustedClusters(ctx context.Context, p *peer, _ *http.Request) (any, error) {
	tcs, err := a.auth.GetTrustedClusters(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if p.Role != RoleAdmin {
		for i := range tcs {
			tcs[i].Spec.Token = ""
		}
	}
	return nonNil(tcs), nil
}

func (a *APIServer) deleteTrustedCluster(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	return nil, trace.Wrap(a.auth.DeleteTrustedCluster(ctx, r.PathValue("name")))
}

func (a *APIServer) getRemoteClusters(ctx context.Context, _ *peer, _ *http.Request) (any, error) {
	rcs, err := a.auth.GetRemoteClusters(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return nonNil(rcs), nil
}

func (a *APIServer) deleteRemoteCluster(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	return nil, trace.Wrap(a.auth.DeleteRemoteCluster(ctx, r.PathValue("name")))
}

// nonNil makes an empty list encode as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return slices.Clip(s)
}

// hostSigners is what a login hands psh to check host certificates with:
// this cluster's host CA first, then the stored host CA of every leaf
// (sorted by name), one entry per cluster. psh scopes a leaf's keys to
// `*.LEAF` names, so a leaf's CA never vouches for a root host. Only
// leaves (a `remote_cluster` record) count: a leaf's copy of its root's
// host CA is not listed to the leaf's own users, whose certificates the
// root never accepts. A leaf whose CA is missing (being removed right now)
// is skipped rather than failing the login.
func (s *Server) hostSigners(ctx context.Context) ([]authapi.HostSigner, error) {
	out := []authapi.HostSigner{{ClusterName: s.cfg.ClusterName, CheckingKeys: s.HostCAKeys()}}
	rcs, err := s.store.GetRemoteClusters(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	slices.SortFunc(rcs, func(a, b services.RemoteCluster) int { return strings.Compare(a.Name, b.Name) })
	for _, rc := range rcs {
		if rc.Name == s.cfg.ClusterName {
			continue
		}
		ca, err := s.store.GetCertAuthority(ctx, rc.Name, services.HostCA, false)
		if trace.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, trace.Wrap(err)
		}
		out = append(out, authapi.HostSigner{ClusterName: rc.Name, CheckingKeys: slices.Clone(ca.SSHPublicKeys)})
	}
	return out, nil
}
