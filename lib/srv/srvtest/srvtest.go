// Package srvtest builds what a test of an SSH server needs without an auth
// server: ed25519 user and host CAs, user certificates carrying Postern's
// extensions, host certificates, and an in-memory AccessPoint (roles and
// CAs in maps). It signs with x/crypto/ssh directly, exactly as lib/auth
// does, so a server that accepts these certificates accepts the real ones.
package srvtest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/services"
)

// CA is an ed25519 certificate authority.
type CA struct {
	Signer ssh.Signer
}

// NewCA makes a fresh CA.
func NewCA(t testing.TB) *CA {
	t.Helper()
	return &CA{Signer: NewSigner(t)}
}

// NewSigner makes a fresh ed25519 key.
func NewSigner(t testing.TB) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	s, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	return s
}

// AuthorizedKey is the CA's public key in authorized_keys format, as
// services.CertAuthority stores it.
func (c *CA) AuthorizedKey() string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(c.Signer.PublicKey())))
}

// CertAuthority returns the CA as a services resource (public part only).
func (c *CA) CertAuthority(cluster string, t services.CertAuthType) *services.CertAuthority {
	return &services.CertAuthority{Type: t, ClusterName: cluster, SSHPublicKeys: []string{c.AuthorizedKey()}}
}

// UserCert describes a user certificate. Zero values get the defaults a
// real `psh login` would produce: valid from a minute ago for an hour,
// the permit-* extensions, roles ["access"].
type UserCert struct {
	User    string
	Logins  []string
	Roles   []string
	Traits  map[string][]string
	Cluster string
	// Now is the issue time (default time.Now()); ValidAfter = Now-1m.
	Now time.Time
	// TTL is the validity (default 1h).
	TTL time.Duration
	// Extensions replace the default permit-* extensions when non-nil;
	// the Postern extensions are always added.
	Extensions map[string]string
	// CriticalOptions are copied as is.
	CriticalOptions map[string]string
}

// DefaultPermits are the permit-* extensions auth puts in user certs.
func DefaultPermits() map[string]string {
	return map[string]string{
		"permit-pty":              "",
		"permit-port-forwarding":  "",
		"permit-agent-forwarding": "",
	}
}

// SignUser certifies pub as described by u.
func (c *CA) SignUser(t testing.TB, pub ssh.PublicKey, u UserCert) *ssh.Certificate {
	t.Helper()
	now := u.Now
	if now.IsZero() {
		now = time.Now()
	}
	ttl := u.TTL
	if ttl == 0 {
		ttl = time.Hour
	}
	roles := u.Roles
	if roles == nil {
		roles = []string{"access"}
	}
	traits := u.Traits
	if traits == nil {
		traits = map[string][]string{services.TraitLogins: u.Logins}
	}
	rolesJSON, err := json.Marshal(roles)
	require.NoError(t, err)
	traitsJSON, err := json.Marshal(traits)
	require.NoError(t, err)
	ext := u.Extensions
	if ext == nil {
		ext = DefaultPermits()
	}
	exts := map[string]string{}
	for k, v := range ext {
		exts[k] = v
	}
	exts[services.CertExtensionUser] = u.User
	exts[services.CertExtensionRoles] = string(rolesJSON)
	exts[services.CertExtensionTraits] = string(traitsJSON)
	exts[services.CertExtensionCluster] = u.Cluster
	cert := &ssh.Certificate{
		Key:             pub,
		Serial:          uint64(now.UnixNano()),
		CertType:        ssh.UserCert,
		KeyId:           u.User,
		ValidPrincipals: u.Logins,
		ValidAfter:      uint64(now.Add(-time.Minute).Unix()),
		ValidBefore:     uint64(now.Add(ttl).Unix()),
		Permissions: ssh.Permissions{
			CriticalOptions: u.CriticalOptions,
			Extensions:      exts,
		},
	}
	require.NoError(t, cert.SignCert(rand.Reader, c.Signer))
	return cert
}

// UserSigner makes a fresh key, certifies it and returns the signer an
// ssh.ClientConfig uses (ssh.PublicKeys(signer)).
func (c *CA) UserSigner(t testing.TB, u UserCert) ssh.Signer {
	t.Helper()
	key := NewSigner(t)
	cert := c.SignUser(t, key.PublicKey(), u)
	s, err := ssh.NewCertSigner(cert, key)
	require.NoError(t, err)
	return s
}

// HostSigner makes a host key certified for principals (uuid, hostname,
// their .CLUSTER forms, IPs), as auth's GenerateHostCert does.
func (c *CA) HostSigner(t testing.TB, uuid string, principals ...string) ssh.Signer {
	t.Helper()
	key := NewSigner(t)
	cert := &ssh.Certificate{
		Key:             key.PublicKey(),
		Serial:          1,
		CertType:        ssh.HostCert,
		KeyId:           uuid,
		ValidPrincipals: append([]string{uuid}, principals...),
		ValidAfter:      0,
		ValidBefore:     ssh.CertTimeInfinity,
	}
	require.NoError(t, cert.SignCert(rand.Reader, c.Signer))
	s, err := ssh.NewCertSigner(cert, key)
	require.NoError(t, err)
	return s
}

// HostKeyCallback accepts host certificates signed by this CA, with the
// check psh and the web terminal make (authz.HostKeyCallback).
func (c *CA) HostKeyCallback() ssh.HostKeyCallback {
	return authz.HostKeyCallback([]ssh.PublicKey{c.Signer.PublicKey()}, nil)
}

// AccessPoint is an in-memory lib/srv.AccessPoint: roles and CAs in maps.
// Safe for concurrent use; tests change roles while connections are live.
// Like services.AccessCache it announces changes of the CAs and trusted
// clusters (TrustChanges), so servers sweep their root users' connections.
type AccessPoint struct {
	mu      sync.Mutex // guards roles, cas, trusted and changed
	roles   map[string]*services.Role
	cas     map[string]*services.CertAuthority // key: type/cluster
	trusted map[string]*services.TrustedCluster
	// changed is closed and replaced at every change of cas or trusted.
	changed chan struct{}
}

// TrustChanges is closed at the next change of the CAs or trusted
// clusters.
func (a *AccessPoint) TrustChanges() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.changed
}

// notifyLocked announces a change; mu must be held.
func (a *AccessPoint) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// NewAccessPoint returns an empty AccessPoint.
func NewAccessPoint() *AccessPoint {
	return &AccessPoint{roles: map[string]*services.Role{}, cas: map[string]*services.CertAuthority{}, trusted: map[string]*services.TrustedCluster{}, changed: make(chan struct{})}
}

// UpsertTrustedCluster stores tc.
func (a *AccessPoint) UpsertTrustedCluster(tc *services.TrustedCluster) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cp := *tc
	a.trusted[tc.Metadata.Name] = &cp
	a.notifyLocked()
}

// DeleteTrustedCluster removes a trusted cluster.
func (a *AccessPoint) DeleteTrustedCluster(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.trusted, name)
	a.notifyLocked()
}

// GetTrustedCluster implements lib/srv.AccessPoint.
func (a *AccessPoint) GetTrustedCluster(_ context.Context, name string) (*services.TrustedCluster, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	tc, ok := a.trusted[name]
	if !ok {
		return nil, trace.NotFound("trusted_cluster %q not found", name)
	}
	cp := *tc
	return &cp, nil
}

// UpsertRole stores r.
func (a *AccessPoint) UpsertRole(r *services.Role) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cp := *r
	a.roles[r.Metadata.Name] = &cp
}

// DeleteRole removes a role.
func (a *AccessPoint) DeleteRole(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.roles, name)
}

// SetCA stores ca.
func (a *AccessPoint) SetCA(ca *services.CertAuthority) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cp := *ca
	a.cas[string(ca.Type)+"/"+ca.ClusterName] = &cp
	a.notifyLocked()
}

// GetRole implements lib/srv.AccessPoint.
func (a *AccessPoint) GetRole(_ context.Context, name string) (*services.Role, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.roles[name]
	if !ok {
		return nil, trace.NotFound("role %q not found", name)
	}
	cp := *r
	return &cp, nil
}

// GetCertAuthority implements lib/srv.AccessPoint.
func (a *AccessPoint) GetCertAuthority(_ context.Context, cluster string, t services.CertAuthType, _ bool) (*services.CertAuthority, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ca, ok := a.cas[string(t)+"/"+cluster]
	if !ok {
		return nil, trace.NotFound("%s CA of cluster %q not found", t, cluster)
	}
	cp := *ca
	return &cp, nil
}

// AccessRole is the preset `access` role: {{internal.logins}} on every
// node, agent and port forwarding allowed.
func AccessRole() *services.Role {
	return &services.Role{
		Kind:     services.KindRole,
		Metadata: services.Metadata{Name: "access"},
		Spec: services.RoleSpec{
			Logins:         []string{"{{internal.logins}}"},
			NodeLabels:     map[string]services.LabelValues{"*": {"*"}},
			ForwardAgent:   true,
			PortForwarding: true,
		},
	}
}

// HostCert describes a host certificate for RoleHostSigner.
type HostCert struct {
	UUID string
	// Role goes in services.CertExtensionHostRole ("node", "proxy");
	// empty leaves the extension out.
	Role       string
	Principals []string
	// ValidBefore; zero means forever.
	ValidBefore time.Time
	// Cluster, when set, goes in services.CertExtensionCluster (what a
	// leaf cluster's tunnel certificate carries).
	Cluster string
}

// RoleHostSigner makes a host key certified as h describes, with the role
// extension auth's GenerateHostCert adds.
func (c *CA) RoleHostSigner(t testing.TB, h HostCert) ssh.Signer {
	t.Helper()
	key := NewSigner(t)
	before := uint64(ssh.CertTimeInfinity)
	if !h.ValidBefore.IsZero() {
		before = uint64(h.ValidBefore.Unix())
	}
	cert := &ssh.Certificate{
		Key:             key.PublicKey(),
		Serial:          1,
		CertType:        ssh.HostCert,
		KeyId:           h.UUID,
		ValidPrincipals: append([]string{h.UUID}, h.Principals...),
		ValidBefore:     before,
	}
	if h.Role != "" {
		cert.Permissions.Extensions = map[string]string{services.CertExtensionHostRole: h.Role}
	}
	if h.Cluster != "" {
		if cert.Permissions.Extensions == nil {
			cert.Permissions.Extensions = map[string]string{}
		}
		cert.Permissions.Extensions[services.CertExtensionCluster] = h.Cluster
	}
	require.NoError(t, cert.SignCert(rand.Reader, c.Signer))
	s, err := ssh.NewCertSigner(cert, key)
	require.NoError(t, err)
	return s
}
