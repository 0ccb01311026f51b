package auth

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// HostCertRequest asks for an SSH host certificate.
type HostCertRequest struct {
	// PublicKey is the host key to certify, in authorized_keys format.
	PublicKey []byte `json:"public_key"`
	// UUID and Hostname name the host; both become principals.
	UUID     string `json:"uuid"`
	Hostname string `json:"hostname"`
	// Principals are extra principals, typically the host's IPs.
	Principals []string `json:"principals,omitempty"`
	// Role is RoleNode or RoleProxy.
	Role string `json:"role"`
}

// GenerateUserCert signs an SSH user certificate for req.User. The
// principals are the logins the user's roles grant; the extensions carry
// the user, roles, traits and cluster so a node decides without calling
// back (see services.CertExtensionUser). The lifetime is the smaller of
// req.TTL and the strictest role's max_session_ttl.
func (s *Server) GenerateUserCert(ctx context.Context, req authapi.UserCertRequest) ([]byte, error) {
	user, err := s.store.GetUser(ctx, req.User)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return s.generateUserCert(ctx, user, req)
}

// grant, when given, is the approved access request whose roles user
// already carries (accessrequests.go): the certificate names it and ends
// with it.
func (s *Server) generateUserCert(ctx context.Context, user *services.User, req authapi.UserCertRequest, grant ...*services.AccessRequest) ([]byte, error) {
	if err := s.checkUserLock(ctx, user.Name); err != nil {
		return nil, trace.Wrap(err)
	}
	pub, err := parseAuthorizedKey(req.PublicKey)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	checker, err := s.accessChecker(ctx, user)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	logins := checker.Logins()
	if len(logins) == 0 {
		// A certificate without principals would be valid for any login
		// to some SSH implementations; never issue one.
		return nil, trace.BadParameter("user %q has no logins: give the user logins (pctl users add --logins) or a role that grants logins", user.Name)
	}
	ttl := checker.MaxSessionTTL()
	if req.TTL > 0 && req.TTL < ttl {
		ttl = req.TTL
	}
	roles, err := json.Marshal(checker.RoleNames())
	if err != nil {
		return nil, trace.Wrap(err)
	}
	traits := user.Traits
	if traits == nil {
		traits = map[string][]string{}
	}
	traitsJSON, err := json.Marshal(traits)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	now := s.clock.Now()
	cert := &ssh.Certificate{
		Key:             pub,
		CertType:        ssh.UserCert,
		KeyId:           user.Name,
		ValidPrincipals: logins,
		ValidAfter:      uint64(now.Add(-clockSkew).Unix()),
		ValidBefore:     uint64(now.Add(ttl).Unix()),
		Permissions: ssh.Permissions{
			Extensions: map[string]string{
				// X11 forwarding is deliberately absent: not supported.
				"permit-pty":                  "",
				services.CertExtensionUser:    user.Name,
				services.CertExtensionRoles:   string(roles),
				services.CertExtensionTraits:  string(traitsJSON),
				services.CertExtensionCluster: s.cfg.ClusterName,
			},
		},
	}
	// The forwarding permits follow the roles: an OpenSSH node enforces
	// the certificate alone, so a permit no role grants must not be in
	// it. A Postern node checks both, so for it nothing changes.
	if checker.PortForwardingAnywhere() {
		cert.Permissions.Extensions["permit-port-forwarding"] = ""
	}
	if checker.ForwardAgentAnywhere() {
		cert.Permissions.Extensions["permit-agent-forwarding"] = ""
	}
	for _, g := range grant {
		applyRequestGrant(cert, g)
	}
	if err := s.sign(cert, s.userSigner); err != nil {
		return nil, trace.Wrap(err)
	}
	s.log.WithFields(map[string]any{"user": user.Name, "principals": logins, "ttl": ttl.String()}).Debug("Issued user certificate.")
	return ssh.MarshalAuthorizedKey(cert), nil
}

// accessChecker loads the user's roles. A role that no longer exists is
// skipped (with a warning) rather than failing the login: deleting a role
// must take its rights away, not lock every holder out.
func (s *Server) accessChecker(ctx context.Context, user *services.User) (*services.AccessChecker, error) {
	var roles []*services.Role
	for _, name := range user.Roles {
		role, err := s.store.GetRole(ctx, name)
		if trace.IsNotFound(err) {
			s.log.WithFields(map[string]any{"user": user.Name, "role": name}).Warn("User refers to a role that does not exist.")
			continue
		}
		if err != nil {
			return nil, trace.Wrap(err)
		}
		roles = append(roles, role)
	}
	return services.NewAccessChecker(roles, user.Traits), nil
}

// GenerateHostCert signs an SSH host certificate. Principals: uuid,
// hostname, uuid.CLUSTER, hostname.CLUSTER and the extra principals, so
// that `ssh host`, `ssh uuid` and `ssh host.cluster` all verify.
func (s *Server) GenerateHostCert(ctx context.Context, req HostCertRequest) ([]byte, error) {
	pub, err := parseAuthorizedKey(req.PublicKey)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if req.Role != RoleNode && req.Role != RoleProxy && req.Role != RoleAuth {
		return nil, trace.BadParameter("host certificate role must be %q or %q, got %q", RoleNode, RoleProxy, req.Role)
	}
	if err := checkName("host UUID", req.UUID); err != nil {
		return nil, trace.Wrap(err)
	}
	principals := hostPrincipals(req.UUID, req.Hostname, s.cfg.ClusterName, req.Principals)
	now := s.clock.Now()
	cert := &ssh.Certificate{
		Key:             pub,
		CertType:        ssh.HostCert,
		KeyId:           req.UUID,
		ValidPrincipals: principals,
		ValidAfter:      uint64(now.Add(-clockSkew).Unix()),
		// Host certificates live as long as the CA: a node keeps its
		// identity across restarts and there is no renewal yet.
		ValidBefore: uint64(s.tlsCACert.NotAfter.Unix()),
		// A non-critical extension: OpenSSH ignores it in host
		// certificates; the tunnel port reads it.
		Permissions: ssh.Permissions{Extensions: map[string]string{services.CertExtensionHostRole: req.Role}},
	}
	if err := s.sign(cert, s.hostSigner); err != nil {
		return nil, trace.Wrap(err)
	}
	return ssh.MarshalAuthorizedKey(cert), nil
}

func hostPrincipals(uuid, hostname, cluster string, extra []string) []string {
	var out []string
	add := func(p string) {
		if p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	add(uuid)
	add(hostname)
	add(uuid + "." + cluster)
	if hostname != "" {
		add(hostname + "." + cluster)
		// OpenSSH lower-cases the host name it was given before it checks
		// the certificate (`ssh -J proxy Web-1` checks "web-1"), and the
		// Router routes that lower-cased name back to the node. Without
		// these a strict client could not reach a node whose name has
		// capitals. Another node whose name differs only in case holds the
		// same lower-cased principals, exactly as two nodes with the same
		// name do: which one a name means is the Router's decision (an
		// ambiguous-host error unless most_recent), and both are nodes the
		// cluster certified.
		add(strings.ToLower(hostname))
		add(strings.ToLower(hostname + "." + cluster))
	}
	for _, p := range extra {
		// An address with a port ("10.0.0.5:3022") contributes its host.
		if h, _, err := net.SplitHostPort(p); err == nil {
			p = h
		}
		add(p)
	}
	return out
}

// knownClusters are the clusters whose NAME.CLUSTER form no host may
// take as its name or principal (rule 0 of routing): this cluster, every
// leaf (a remote_cluster record: the proxy routes NAME.LEAF into the
// leaf) and every root this cluster trusts. Without the leaves a root
// node could call itself ldb.l1 while l1 is a leaf, and be what
// `ssh ldb.l1` reaches, under a certificate the root CA signed for that
// name, the moment the trust is removed.
//
// It reads the backend: call it only for an authenticated caller (a host
// certificate, or a join after its token was checked), so that nobody
// without a credential learns the leaves' names from a refusal.
func (s *Server) knownClusters(ctx context.Context) ([]string, error) {
	out := []string{s.cfg.ClusterName}
	rcs, err := s.store.GetRemoteClusters(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	for _, rc := range rcs {
		out = append(out, rc.Name)
	}
	tcs, err := s.store.GetTrustedClusters(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	for _, tc := range tcs {
		out = append(out, tc.Metadata.Name)
	}
	return out, nil
}

// checkHostHostname validates the hostname a joining or heartbeating host
// gives itself (uuid is its UUID, addr its announced address, possibly
// empty): the shape rules of services.CheckHostnameShape against clusters
// (knownClusters, or this cluster alone before a join's token is
// checked), and for a node, not one of the proxy's public names (the
// hostname becomes a principal, and users reach the proxy by those
// names).
func (s *Server) checkHostHostname(role, hostname, uuid, addr string, clusters []string) error {
	if err := services.CheckHostnameShape(hostname, uuid, addr, clusters); err != nil {
		return trace.Wrap(err)
	}
	if role == RoleNode && s.isProxyName(hostname) {
		return trace.BadParameter("hostname %q is a public name of the proxy", hostname)
	}
	return nil
}

// isProxyName reports whether name is one of the public names the proxy
// and auth server were configured with (public_addrs).
func (s *Server) isProxyName(name string) bool {
	for _, a := range s.cfg.PublicAddrs {
		h := a
		if host, _, err := net.SplitHostPort(a); err == nil {
			h = host
		}
		if strings.EqualFold(h, name) {
			return true
		}
	}
	return false
}

// joinPrincipals checks the extra principals a joining host asks for and
// returns them without the ones it gets anyway (uuid, hostname and their
// .CLUSTER forms). The first one it may not hold is refused with a
// BadParameter that names it; nothing is silently dropped, so the operator
// of an honest host sees why.
func (s *Server) joinPrincipals(ctx context.Context, role, uuid, hostname string, extra []string) ([]string, error) {
	if len(extra) == 0 {
		return nil, nil
	}
	if len(extra) > maxExtraPrincipals {
		return nil, trace.BadParameter("%d additional principals, at most %d are allowed", len(extra), maxExtraPrincipals)
	}
	nodes, err := s.store.GetNodes(ctx, s.cfg.ClusterName)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	clusters, err := s.knownClusters(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	derived := hostPrincipals(uuid, hostname, s.cfg.ClusterName, nil)
	var out []string
	for _, p := range extra {
		// An address with a port ("10.0.0.5:3022") contributes its host.
		if h, _, err := net.SplitHostPort(p); err == nil {
			p = h
		}
		if slices.ContainsFunc(derived, func(d string) bool { return strings.EqualFold(d, p) }) || slices.Contains(out, p) {
			continue
		}
		if err := s.checkExtraPrincipal(role, p, uuid, nodes, clusters); err != nil {
			return nil, trace.Wrap(err)
		}
		out = append(out, p)
	}
	return out, nil
}

// maxExtraPrincipals bounds a join's extra principals: a proxy listening on
// every address of a busy host has a few dozen, nothing legitimate has
// hundreds.
const maxExtraPrincipals = 128

// checkExtraPrincipal decides whether a joining host (role, with the
// minted uuid) may hold principal p besides its derived names. A host
// certificate principal is a name users' clients accept this host under
// (psh trusts `@cert-authority *`), so the rule is deny by default:
//   - an IP address is fine (hosts share machines, so IPs cannot be
//     exclusive) unless it is another node's hostname;
//   - a DNS-shaped name is fine unless it is another node's UUID or
//     hostname, any UUID, the cluster name or NAME.CLUSTER for a known
//     cluster, localhost, or (for a node) a proxy's public name;
//   - anything else (wildcards, pattern characters, control characters,
//     spaces) is refused.
//
// A proxy may name the cluster and localhost: psh connects to the proxy
// by those names and checks its certificate for them, and only a proxy token can make a proxy.
func (s *Server) checkExtraPrincipal(role, p, uuid string, nodes []services.Node, clusters []string) error {
	if p == "" {
		return trace.BadParameter("additional principal is empty")
	}
	isProxy := role == RoleProxy
	otherNode := func() *services.Node {
		for i := range nodes {
			n := &nodes[i]
			if n.UUID != uuid && (strings.EqualFold(n.UUID, p) || strings.EqualFold(n.Hostname, p)) {
				return n
			}
		}
		return nil
	}
	if ip, err := netip.ParseAddr(p); err == nil {
		if ip.Zone() != "" {
			return trace.BadParameter("additional principal %q: an IP address with a zone is not a host name", p)
		}
		if n := otherNode(); n != nil {
			return trace.BadParameter("additional principal %q is the hostname of node %q", p, n.UUID)
		}
		return nil
	}
	// The shape rules of a hostname apply to a principal too, with the
	// proxy's exceptions; the error names the principal.
	lower := strings.ToLower(p)
	isCluster := lower == strings.ToLower(s.cfg.ClusterName)
	isLocalhost := lower == "localhost"
	if !(isProxy && (isCluster || isLocalhost)) {
		if err := services.CheckHostnameShape(p, uuid, "", clusters); err != nil {
			return trace.BadParameter("additional principal %q refused: %v", p, trace.UserMessage(err))
		}
	}
	if n := otherNode(); n != nil {
		if strings.EqualFold(n.UUID, p) {
			return trace.BadParameter("additional principal %q is the UUID of another node", p)
		}
		return trace.BadParameter("additional principal %q is the hostname of node %q", p, n.UUID)
	}
	if !isProxy && s.isProxyName(p) {
		return trace.BadParameter("additional principal %q is a public name of the proxy", p)
	}
	return nil
}

func (s *Server) sign(cert *ssh.Certificate, signer ssh.Signer) error {
	var serial [8]byte
	if _, err := rand.Read(serial[:]); err != nil {
		return trace.Wrap(err)
	}
	cert.Serial = binary.BigEndian.Uint64(serial[:])
	if err := cert.SignCert(rand.Reader, signer); err != nil {
		return trace.Wrap(err)
	}
	return nil
}

func parseAuthorizedKey(data []byte) (ssh.PublicKey, error) {
	if len(data) == 0 {
		return nil, trace.BadParameter("missing public key")
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey(data)
	if err != nil {
		return nil, trace.BadParameter("invalid public key (want authorized_keys format): %v", err)
	}
	if _, ok := pub.(*ssh.Certificate); ok {
		return nil, trace.BadParameter("invalid public key: got a certificate, want a plain key")
	}
	return pub, nil
}

// parseAuthorizedKeys parses CA public keys (authorized_keys lines).
func parseAuthorizedKeys(lines []string) ([]ssh.PublicKey, error) {
	out := make([]ssh.PublicKey, 0, len(lines))
	for _, l := range lines {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(l))
		if err != nil {
			return nil, trace.BadParameter("invalid CA public key: %v", err)
		}
		out = append(out, pub)
	}
	return out, nil
}

// namePattern is what user names, host UUIDs and cluster names may hold:
// they end up in backend keys, certificate fields and log lines, so no
// slashes, spaces or control characters.
var namePattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._@+-]{0,127}$`)

func checkName(what, name string) error {
	if name == "" {
		return trace.BadParameter("missing %s", what)
	}
	if !namePattern.MatchString(name) {
		return trace.BadParameter("invalid %s %q: use letters, digits and . _ @ + - (at most 128, starting with a letter or digit)", what, name)
	}
	return nil
}

// HostCAKeys returns the cluster's host CA public keys (authorized_keys
// format, no newline): what a client puts in known_hosts.
func (s *Server) HostCAKeys() []string { return slices.Clone(s.hostCA.SSHPublicKeys) }

// UserCAKeys returns the cluster's user CA public keys.
func (s *Server) UserCAKeys() []string { return slices.Clone(s.userCA.SSHPublicKeys) }
