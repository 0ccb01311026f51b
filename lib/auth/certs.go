package auth

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"slices"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/services"
)

// UserCertRequest asks for an SSH user certificate.
type UserCertRequest struct {
	// User is the Postern user name.
	User string `json:"user"`
	// PublicKey is the key to certify, in authorized_keys format.
	PublicKey []byte `json:"public_key"`
	// TTL is the wanted lifetime; zero or more than the roles allow means
	// the roles' max_session_ttl.
	TTL time.Duration `json:"ttl"`
}

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
func (s *Server) GenerateUserCert(ctx context.Context, req UserCertRequest) ([]byte, error) {
	user, err := s.store.GetUser(ctx, req.User)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return s.generateUserCert(ctx, user, req)
}

func (s *Server) generateUserCert(ctx context.Context, user *services.User, req UserCertRequest) ([]byte, error) {
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
				"permit-port-forwarding":      "",
				"permit-agent-forwarding":     "",
				services.CertExtensionUser:    user.Name,
				services.CertExtensionRoles:   string(roles),
				services.CertExtensionTraits:  string(traitsJSON),
				services.CertExtensionCluster: s.cfg.ClusterName,
			},
		},
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

// KnownHostsLines formats the host CA keys as known_hosts lines
// ("@cert-authority * KEY"), for psh and `pctl auth sign`.
func KnownHostsLines(hostCAKeys []string) []string {
	out := make([]string, 0, len(hostCAKeys))
	for _, k := range hostCAKeys {
		out = append(out, fmt.Sprintf("@cert-authority * %s", k))
	}
	return out
}
