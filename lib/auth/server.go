// Package auth is Postern's authority: it owns the cluster's certificate
// authorities, issues SSH and X.509 certificates, checks passwords and
// one-time passwords, turns join tokens into host identities, and serves all
// of that to nodes, proxies and pctl over a mutually authenticated HTTPS API
// (apiserver.go), with a matching client (client.go).
//
// Trust model in one paragraph: the host CA carries, besides its SSH key, the
// cluster's X.509 CA. Every process that talks to auth holds an Identity: an
// X.509 certificate from that CA whose subject says who it is (CN = id,
// O = role, OU = cluster) plus, for nodes and proxies, an SSH host
// certificate. The API decides what a caller may do from the role in its
// certificate alone, so authorization needs no lookup and no session.
package auth

import (
	"context"
	"crypto"
	"crypto/x509"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
)

// System roles: the Organization of an identity's X.509 certificate.
const (
	RoleAuth  = "auth"
	RoleNode  = "node"
	RoleProxy = "proxy"
	RoleAdmin = "admin"
)

// maxJoinFailures failed joins from one address within the login window
// lock that address out of the join endpoint for the window. Higher than
// the login limit: several hosts behind one NAT may share a stale token.
const maxJoinFailures = 20

// Fixed identity IDs of the auth server's own identities.
const (
	AuthIdentityID  = "auth"
	AdminIdentityID = "admin"
)

// ServerConfig configures the auth server.
type ServerConfig struct {
	// Store holds every resource; required.
	Store *services.Store
	// IdentifyRootUser checks a trusted root cluster's user certificate
	// against the store's trusted CAs and maps its roles
	// (srv.IdentifyRootUser, which lib/auth does not link: the proxy's web
	// backend links auth, and must not link the SSH server). Nil refuses
	// root users' certificates for OpenSSH nodes (opensshroot.go).
	IdentifyRootUser func(ctx context.Context, store *services.Store, clusterName string, clock clockwork.Clock, cert *ssh.Certificate) (*authz.Identity, error)
	// ClusterName names the cluster; required. It is baked into the CAs and
	// every certificate, so it cannot change once the cluster exists.
	ClusterName string
	// AdminIdentityDir, when set, is where the admin identity is written on
	// start (unless a valid one for this cluster is already there): pctl on
	// the same machine uses it. Empty means none is written.
	AdminIdentityDir string
	// PublicAddrs are extra host[:port] names under which nodes reach the
	// auth API; they become SANs of its TLS certificate.
	PublicAddrs []string
	// HostUUID is the UUID of the host this auth server runs on, when its
	// node role runs in the same process. That node's name is its
	// operator's choice, made on the auth server itself (an all-in-one
	// named after the machine, in a cluster named after the machine too),
	// so the naming rules that keep a joined node from posing as a
	// cluster, the proxy or another node do not apply to it. No joined
	// host can have this UUID: auth mints every joined host's.
	HostUUID string
	// BcryptCost is the cost of new password hashes; zero means
	// bcrypt.DefaultCost. Lower it only where hashing time matters more
	// than resistance to offline cracking: tests (bcrypt.MinCost) and
	// throwaway demo clusters. Existing hashes keep the cost they were
	// made with.
	BcryptCost int
	// Deps: Audit receives auth.login and auth.failed; Clock drives
	// certificate times, token expiry, TOTP and the login limiter.
	observe.Deps
	// AuditLog answers GET /v1/events (`pctl events ls`); nil means the
	// API says the audit log is not searchable here.
	AuditLog EventSearcher
	// Limits bounds failed logins; zero fields get defaults.
	Limits LoginLimits
	// Recordings stores session recordings uploaded by nodes (the service
	// gives a recording.DirStorage under the data dir). Nil means the
	// recording endpoints answer NotImplemented.
	Recordings recording.Storage
	// DialProxy reaches another cluster's auth API through that cluster's
	// proxy (lib/web.DialJoinRelay): a leaf's trust exchange with its
	// root. Nil means this cluster cannot become a leaf (creating a
	// trusted_cluster answers NotImplemented).
	DialProxy DialProxyFunc
	// RequestNotifier, when set, gets a JSON line for every access
	// request state change (access_requests.webhook); it must not block.
	RequestNotifier events.Exporter
}

// CheckAndSetDefaults validates the config and fills defaults.
func (c *ServerConfig) CheckAndSetDefaults() error {
	c.Deps.SetDefaults(observe.ComponentAuth)
	if c.Store == nil {
		return trace.BadParameter("auth: missing Store")
	}
	if err := services.CheckClusterName(c.ClusterName); err != nil {
		return trace.Wrap(err)
	}
	if c.BcryptCost == 0 {
		c.BcryptCost = bcrypt.DefaultCost
	}
	if c.BcryptCost < bcrypt.MinCost || c.BcryptCost > bcrypt.MaxCost {
		return trace.BadParameter("auth: bcrypt cost %d outside %d..%d", c.BcryptCost, bcrypt.MinCost, bcrypt.MaxCost)
	}
	c.Limits.setDefaults()
	return nil
}

// Server is the auth server. It is safe for concurrent use.
type Server struct {
	cfg   ServerConfig
	store *services.Store
	clock clockwork.Clock
	log   logrus.FieldLogger

	// Loaded once at start; the CAs never change while the server runs
	// (no rotation yet).
	userCA     *services.CertAuthority
	hostCA     *services.CertAuthority
	userSigner ssh.Signer
	hostSigner ssh.Signer
	tlsCACert  *x509.Certificate
	tlsCAKey   crypto.Signer

	// dummyHash is compared against when a user does not exist, so that an
	// unknown user costs the same bcrypt time as a wrong password.
	dummyHash []byte

	limiter *loginLimiter
	// local checks local users' passwords and second factors (login.go).
	local localConnector
	// joinLimiter counts failed joins per source address (user part
	// empty): a join token is 128 random bits, so this is about keeping an
	// unauthenticated peer from hammering the backend and the logs, not
	// about guessing.
	joinLimiter *loginLimiter

	// addrs proves that announced node addresses answer with the node's
	// own host certificate (see AnnounceNode).
	addrs *addrVerifier

	// sso caches the discovered identity providers (sso.go).
	sso ssoProviders
}

// NewServer starts the auth server: it loads the cluster's CAs, creating
// them on first start, makes sure the preset roles exist, and writes the
// admin identity when asked.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	dummy, err := bcrypt.GenerateFromPassword([]byte("postern-dummy-password"), cfg.BcryptCost)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	s := &Server{
		cfg:       cfg,
		store:     cfg.Store,
		clock:     cfg.Clock,
		log:       cfg.Logger,
		dummyHash: dummy,
		limiter:   newLoginLimiter(cfg.Limits, cfg.Clock),
		joinLimiter: newLoginLimiter(LoginLimits{
			MaxAddrFailures: maxJoinFailures, Window: cfg.Limits.Window,
		}, cfg.Clock),
	}
	s.local = localConnector{s: s}
	// Construction, before any request: the CA and role bootstrap.
	ctx := context.Background()
	if err := s.initCAs(ctx); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := s.initRoles(ctx); err != nil {
		return nil, trace.Wrap(err)
	}
	hostCAKeys, err := parseAuthorizedKeys(s.hostCA.SSHPublicKeys)
	if err != nil {
		return nil, trace.Wrap(err, "host CA")
	}
	s.addrs = newAddrVerifier(cfg.Clock, cfg.Logger, func() []ssh.PublicKey { return hostCAKeys })
	if cfg.AdminIdentityDir != "" {
		if err := s.ensureAdminIdentity(ctx, cfg.AdminIdentityDir); err != nil {
			return nil, trace.Wrap(err)
		}
	}
	return s, nil
}

// ClusterName returns the cluster's name.
func (s *Server) ClusterName() string { return s.cfg.ClusterName }

// Store returns the store the server was built on.
func (s *Server) Store() *services.Store { return s.store }

// Clock returns the server's clock.
func (s *Server) Clock() clockwork.Clock { return s.clock }

// initCAs loads both CAs, creating whichever is missing. Creation goes
// through CreateCertAuthority, which fails with AlreadyExists when another
// auth server got there first; we then load the winner's CA, so two
// concurrent first starts agree on one CA.
func (s *Server) initCAs(ctx context.Context) error {
	for _, t := range []services.CertAuthType{services.UserCA, services.HostCA} {
		ca, err := s.store.GetCertAuthority(ctx, s.cfg.ClusterName, t, true)
		if trace.IsNotFound(err) {
			ca, err = s.createCA(ctx, t)
		}
		if err != nil {
			return trace.Wrap(err, "loading the %s CA", t)
		}
		if err := s.setCA(ca); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}

func (s *Server) createCA(ctx context.Context, t services.CertAuthType) (*services.CertAuthority, error) {
	pub, priv, err := newSSHCA()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	ca := services.CertAuthority{
		Type:           t,
		ClusterName:    s.cfg.ClusterName,
		SSHPublicKeys:  []string{pub},
		SSHPrivateKeys: [][]byte{priv},
	}
	if t == services.HostCA {
		ca.TLSCert, ca.TLSKey, err = newTLSCA(s.cfg.ClusterName, s.clock.Now())
		if err != nil {
			return nil, trace.Wrap(err)
		}
	}
	err = s.store.CreateCertAuthority(ctx, ca)
	switch {
	case err == nil:
		s.log.WithField("ca_type", t).Info("Created certificate authority.")
		return &ca, nil
	case trace.IsAlreadyExists(err):
		// Lost the race to a concurrent first start: use its CA.
		got, err := s.store.GetCertAuthority(ctx, s.cfg.ClusterName, t, true)
		return got, trace.Wrap(err)
	default:
		return nil, trace.Wrap(err)
	}
}

func (s *Server) setCA(ca *services.CertAuthority) error {
	if len(ca.SSHPrivateKeys) == 0 {
		return trace.BadParameter("%s CA of cluster %q has no private key", ca.Type, ca.ClusterName)
	}
	signer, err := ssh.ParsePrivateKey(ca.SSHPrivateKeys[0])
	if err != nil {
		return trace.BadParameter("%s CA of cluster %q: corrupt private key: %v", ca.Type, ca.ClusterName, err)
	}
	switch ca.Type {
	case services.UserCA:
		s.userCA, s.userSigner = ca, signer
	case services.HostCA:
		cert, err := parseCertPEM(ca.TLSCert)
		if err != nil {
			return trace.BadParameter("host CA of cluster %q: TLS certificate: %v", ca.ClusterName, err)
		}
		key, err := parseTLSPrivateKey(ca.TLSKey)
		if err != nil {
			return trace.BadParameter("host CA of cluster %q: TLS key: %v", ca.ClusterName, err)
		}
		s.hostCA, s.hostSigner, s.tlsCACert, s.tlsCAKey = ca, signer, cert, key
	default:
		return trace.BadParameter("unknown CA type %q", ca.Type)
	}
	return nil
}

// initRoles creates the preset roles that do not exist. An operator's edit
// of a preset role is kept: only absent roles are written.
func (s *Server) initRoles(ctx context.Context) error {
	for _, role := range services.PresetRoles() {
		_, err := s.store.GetRole(ctx, role.Metadata.Name)
		if err == nil {
			continue
		}
		if !trace.IsNotFound(err) {
			return trace.Wrap(err)
		}
		if err := s.store.UpsertRole(ctx, role); err != nil {
			return trace.Wrap(err)
		}
		s.log.WithField("role", role.Metadata.Name).Info("Created preset role.")
	}
	return nil
}

// TLSCACertPEM returns the cluster's X.509 CA certificate (PEM).
func (s *Server) TLSCACertPEM() []byte { return s.hostCA.TLSCert }

// CAPin returns the pin of the cluster's TLS CA, as `--ca-pin` takes it.
func (s *Server) CAPin() string { return caPinOf(s.tlsCACert) }

// tlsCAPool is a fresh pool holding the cluster's TLS CA.
func (s *Server) tlsCAPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(s.tlsCACert)
	return pool
}

// publicCA returns a copy of ca without secrets.
func publicCA(ca *services.CertAuthority) *services.CertAuthority {
	out := *ca
	out.SSHPrivateKeys = nil
	out.TLSKey = nil
	out.SSHPublicKeys = append([]string(nil), ca.SSHPublicKeys...)
	return &out
}

// EventSearcher finds audit events (lib/events.Log implements it).
type EventSearcher interface {
	Search(ctx context.Context, since time.Time, eventType string, limit int) ([]events.Event, error)
}
