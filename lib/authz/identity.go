// Package authz answers who a certificate names and what that identity
// may reach, once for every path that asks: the node's SSH server
// (lib/srv), the proxy's SSH port (lib/proxy/sshproxy), the web terminal
// and node list (lib/web) and psh (the host-CA check). Two copies of a
// security decision drift apart (one of them once parsed certificate
// extensions without the trailing-data check); one copy cannot.
//
// It is a leaf above lib/services: it imports nothing of Postern's
// servers, so a client can link it without linking them.
package authz

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/services"
)

// Identity is who a connection or web session authenticated as, read from
// the user certificate, with the roles it names fetched live.
type Identity struct {
	// Login is the OS login the client asked for (the SSH user name);
	// empty where the login is chosen later (a web session picks one per
	// terminal).
	Login string
	// User is the Postern user (certificate extension, else KeyId).
	User string
	// Roles are the role names granted at issue time.
	Roles []string
	// Traits are the user's traits at issue time.
	Traits map[string][]string
	// Cluster is the issuing cluster ("" when the certificate names none).
	Cluster string
	// RemoteRoles are, for a user of a root cluster this (leaf) cluster
	// trusts, the roles the root's certificate names; Roles are then the
	// leaf roles they map to (MapTrusted). Nil for local users.
	RemoteRoles []string
	// RequestID is the access request whose roles the certificate
	// carries ("" for none): a lock on it ends the identity's access.
	RequestID string
	// Cert is the certificate itself.
	Cert *ssh.Certificate
	// Checker answers RBAC questions with the roles as they were when the
	// identity was built (fetched live, see NewAccessChecker). Nil grants
	// nothing.
	Checker *services.AccessChecker
}

// FromCertificate reads Postern's extensions of a user certificate. A
// certificate from the right CA but without readable roles grants nothing,
// so it is refused rather than treated as "no roles". It does not check
// the signature or the validity window: callers authenticate first
// (x/crypto's CertChecker) and only then ask who the certificate names.
func FromCertificate(cert *ssh.Certificate, login string) (*Identity, error) {
	if cert == nil {
		return nil, trace.AccessDenied("no certificate")
	}
	ext := cert.Permissions.Extensions
	id := &Identity{Login: login, Cert: cert, User: ext[services.CertExtensionUser], Cluster: ext[services.CertExtensionCluster],
		RequestID: ext[services.CertExtensionRequestID]}
	if id.User == "" {
		id.User = cert.KeyId
	}
	if id.User == "" {
		return nil, trace.AccessDenied("certificate names no Postern user")
	}
	rolesJSON, ok := ext[services.CertExtensionRoles]
	if !ok {
		return nil, trace.AccessDenied("certificate of user %q carries no roles extension", id.User)
	}
	if err := strictUnmarshal(rolesJSON, &id.Roles); err != nil {
		return nil, trace.AccessDenied("certificate of user %q: malformed roles extension: %v", id.User, err)
	}
	if traitsJSON, ok := ext[services.CertExtensionTraits]; ok && traitsJSON != "" {
		if err := strictUnmarshal(traitsJSON, &id.Traits); err != nil {
			return nil, trace.AccessDenied("certificate of user %q: malformed traits extension: %v", id.User, err)
		}
	}
	return id, nil
}

// strictUnmarshal decodes exactly one JSON value: `[] []` is not a role
// list, whatever encoding/json.Unmarshal's leniency elsewhere.
func strictUnmarshal(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return trace.BadParameter("trailing data")
	}
	return nil
}

// LockTargets are the locks that end this identity's access: its user
// and, for a certificate issued for an access request, the request.
func (id *Identity) LockTargets() []services.LockTarget {
	t := []services.LockTarget{{User: id.User}}
	if id.RequestID != "" {
		t = append(t, services.LockTarget{AccessRequest: id.RequestID})
	}
	return t
}

// CheckCluster makes the check x/crypto's CertChecker does not: the
// certificate's cluster extension, when present, must be ours (a CA key
// shared by mistake between clusters must not mix their users).
func (id *Identity) CheckCluster(clusterName string) error {
	if id.Cluster != "" && id.Cluster != clusterName {
		return trace.AccessDenied("certificate of user %q was issued by cluster %q, not %q", id.User, id.Cluster, clusterName)
	}
	return nil
}

// MapTrusted makes a root cluster's user an identity of this (leaf)
// cluster: its roles become the local roles tc's role_map maps them to.
// The root's roles themselves grant nothing here (a leaf's "admin" is not
// the root's), so a certificate whose roles map to nothing is refused;
// the error names the unmapped roles for the audit log and the process
// log only (the user is told "access denied": the leaf's policy is not
// theirs to read). Calling it again (a re-check) maps the original
// remote roles afresh.
func (id *Identity) MapTrusted(tc *services.TrustedCluster) error {
	if id.RemoteRoles == nil {
		id.RemoteRoles = slices.Clone(id.Roles)
		if id.RemoteRoles == nil {
			id.RemoteRoles = []string{}
		}
	}
	id.Roles = nil
	if tc == nil || tc.Metadata.Name != id.Cluster || !tc.Spec.Enabled {
		return trace.AccessDenied("certificate of user %q was issued by cluster %q, which this cluster does not trust", id.User, id.Cluster)
	}
	local, unmapped := tc.Spec.RoleMap.Map(id.RemoteRoles)
	if len(local) == 0 {
		return trace.AccessDenied("roles %v of user %q of cluster %q map to no role here: no role_map entry of trusted_cluster %q matches %v",
			id.RemoteRoles, id.User, id.Cluster, tc.Metadata.Name, unmapped)
	}
	id.Roles = local
	return nil
}

// RoleGetter reads one role; the node's access point and the proxy's auth
// client both are one.
type RoleGetter interface {
	GetRole(ctx context.Context, name string) (*services.Role, error)
}

// NewAccessChecker fetches the roles live and builds a checker. A role
// deleted since the certificate was issued simply grants nothing (deny by
// default); any other lookup failure fails closed.
func NewAccessChecker(ctx context.Context, roles RoleGetter, roleNames []string, traits map[string][]string) (*services.AccessChecker, error) {
	out := make([]*services.Role, 0, len(roleNames))
	for _, name := range roleNames {
		r, err := roles.GetRole(ctx, name)
		if trace.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, trace.Wrap(err, "fetching role %q", name)
		}
		out = append(out, r)
	}
	return services.NewAccessChecker(out, traits), nil
}

// Load fetches the identity's roles live and sets Checker.
func (id *Identity) Load(ctx context.Context, roles RoleGetter) error {
	checker, err := NewAccessChecker(ctx, roles, id.Roles, id.Traits)
	if err != nil {
		return trace.Wrap(err)
	}
	id.Checker = checker
	return nil
}

// CheckLogin allows login on node when the certificate carries the login
// and a role grants it there. The node checks the login the client
// presented; the web terminal, which chooses the login itself, checks it
// before dialing.
func (id *Identity) CheckLogin(node *services.Node, login string) error {
	if id.Checker == nil || id.Cert == nil {
		return trace.AccessDenied("user %q has no roles", id.User)
	}
	if !slices.Contains(id.Cert.ValidPrincipals, login) {
		return trace.AccessDenied("login %q is not in the certificate of user %q", login, id.User)
	}
	return trace.Wrap(id.Checker.CheckAccessToNode(node, login))
}

// LoginsOn returns the certificate's logins a role allows on node, in the
// certificate's order; none means the node is not the user's to see.
func (id *Identity) LoginsOn(node *services.Node) []string {
	if id.Checker == nil || id.Cert == nil {
		return nil
	}
	var logins []string
	for _, login := range id.Cert.ValidPrincipals {
		if id.Checker.CheckAccessToNode(node, login) == nil {
			logins = append(logins, login)
		}
	}
	return logins
}

// CanReach reports whether one of the certificate's logins may be used on
// node. It is the visibility rule of routing and of every node list: a
// proxy cannot see which login the user will present inside the encrypted
// inner connection, so any login the roles allow makes the node visible,
// and the node then checks the actual one. As a method value it is a
// proxy.AccessFilter.
func (id *Identity) CanReach(node services.Node) bool {
	if id.Checker == nil || id.Cert == nil {
		return false
	}
	for _, login := range id.Cert.ValidPrincipals {
		if id.Checker.CheckAccessToNode(&node, login) == nil {
			return true
		}
	}
	return false
}

// Logins are the certificate's logins (nil without a certificate), for
// logs and audit reasons.
func (id *Identity) Logins() []string {
	if id.Cert == nil {
		return nil
	}
	return id.Cert.ValidPrincipals
}
