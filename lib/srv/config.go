package srv

import (
	"context"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/sshalgo"
)

// AccessPoint is what the SSH server needs from auth: the cluster's CAs to
// check certificates, the roles named in them, and the root clusters this
// cluster trusts (whose users it accepts, their roles mapped). The
// services Store, the AccessCache and the auth API client all satisfy it;
// calls must be bounded by ctx.
type AccessPoint interface {
	GetCertAuthority(ctx context.Context, clusterName string, t services.CertAuthType, withSecrets bool) (*services.CertAuthority, error)
	GetRole(ctx context.Context, name string) (*services.Role, error)
	GetTrustedCluster(ctx context.Context, name string) (*services.TrustedCluster, error)
}

// Defaults. See each Config field for what zero means.
const (
	// DefaultKeepAliveInterval matches what sessions through NAT gateways
	// and load balancers survive (their idle timers are typically 5-15 min).
	DefaultKeepAliveInterval = 5 * time.Minute
	// DefaultKeepAliveCountMax is OpenSSH's ClientAliveCountMax default.
	DefaultKeepAliveCountMax = 3
	// DefaultHandshakeTimeout bounds the SSH handshake and authentication,
	// like OpenSSH's LoginGraceTime but shorter: certificate auth needs no
	// typing, so a slow handshake is a stuck or hostile client.
	DefaultHandshakeTimeout = 30 * time.Second
	// DefaultServerVersion is the SSH identification string.
	DefaultServerVersion = "SSH-2.0-Postern"
)

// Config configures a Server.
type Config struct {
	// ClusterName is the cluster whose user CA signs accepted certificates.
	// Required.
	ClusterName string
	// HostSigners are the host keys, normally one key with its host
	// certificate (ssh.NewCertSigner). Required.
	HostSigners []ssh.Signer
	// Algorithms are the key exchanges, ciphers and MACs offered (the
	// ssh_kex_algorithms, ssh_ciphers and ssh_macs settings); an empty
	// list means sshalgo's default one.
	Algorithms sshalgo.Lists
	// AccessPoint provides CAs and roles. Required.
	AccessPoint AccessPoint
	// GetNode returns this node's own record (uuid, hostname, labels) as
	// roles see it; called at each authentication so that label changes
	// apply to new connections. Required in node mode, unused in proxy mode.
	GetNode func() services.Node
	// Proxy, when set, puts the server in proxy mode: no node RBAC at
	// connect, subsystems and direct-tcpip go to Proxy, shells, exec,
	// -R and agent forwarding are refused (proxyPolicy in policy.go).
	// Nil means node mode (nodePolicy).
	Proxy ProxyHandler
	// Component names this server in logs; default "node" or "proxy:ssh".
	Component string
	// IdleTimeout closes a connection when no channel data moved for this
	// long. Zero disables it.
	IdleTimeout time.Duration
	// KeepAliveInterval is how often keepalive@openssh.com is sent; after
	// KeepAliveCountMax unanswered ones the connection is closed. Zero
	// means DefaultKeepAliveInterval; negative disables keep-alives.
	KeepAliveInterval time.Duration
	// KeepAliveCountMax: zero means DefaultKeepAliveCountMax.
	KeepAliveCountMax int
	// HandshakeTimeout bounds the SSH handshake including authentication.
	// Zero means DefaultHandshakeTimeout. It is a socket deadline, so it
	// runs on the real clock whatever Clock is.
	HandshakeTimeout time.Duration
	// ServerVersion is the SSH identification string; default
	// DefaultServerVersion.
	ServerVersion string
	// LookupLogin resolves an OS login to its account. Nil means the OS
	// account database (LookupOSLogin). Tests use it to give `nobody` a
	// usable shell.
	LookupLogin func(login string) (*Login, error)
	// AgentSocketDir is where per-connection agent socket directories are
	// created. Empty means os.TempDir().
	AgentSocketDir string
	// Limiter caps connections per user and channels per user (lib/limiter
	// implements it). Nil means no caps here; per-address caps apply at the
	// listener, before any handshake work is spent.
	Limiter Limiter
	// Locks refuses and ends what a lock covers (locks.go). Nil means no
	// locks are enforced; the service always sets it.
	Locks LockChecker
	// Recorder records pty sessions (recording.go). Nil means sessions
	// are not recorded (proxy mode, and tests that do not ask).
	Recorder *Recorder
	// Locale decides sessions' LANG and LC_* (locale.go); the zero value
	// uses the system's default locale and its installed ones.
	Locale LocaleConfig
	// Deps: Clock drives certificate validity, keep-alives and the idle
	// timeout; Logger's default has Component; Audit receives
	// session.start/end, access.denied, port.forward, agent.forward;
	// Tracer starts the accept, auth, channel and session spans.
	observe.Deps
}

// Limiter is the part of lib/limiter the server uses. A refusal is a
// trace.LimitExceeded error whose message the client sees.
type Limiter interface {
	// AcquireUser takes one connection slot of user.
	AcquireUser(user string) (release func(), err error)
	// AcquireSession takes one channel slot (session or direct-tcpip) of
	// user.
	AcquireSession(user string) (release func(), err error)
	// AcquireForward takes one connection slot of a forwarded port (key
	// names the connection, the direction and the address), so one busy
	// forward cannot eat the descriptors every other session needs.
	AcquireForward(key string) (release func(), err error)
}

// CheckAndSetDefaults validates cfg and fills in defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.ClusterName == "" {
		return trace.BadParameter("srv: missing ClusterName")
	}
	if len(c.HostSigners) == 0 {
		return trace.BadParameter("srv: missing HostSigners")
	}
	if c.AccessPoint == nil {
		return trace.BadParameter("srv: missing AccessPoint")
	}
	if c.Proxy == nil && c.GetNode == nil {
		return trace.BadParameter("srv: missing GetNode (required in node mode)")
	}
	if err := c.Locale.checkAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	if c.Component == "" {
		c.Component = observe.ComponentNode
		if c.Proxy != nil {
			c.Component = observe.ComponentProxySSH
		}
	}
	c.Deps.SetDefaults(c.Component)
	if c.IdleTimeout < 0 {
		return trace.BadParameter("srv: negative IdleTimeout %v", c.IdleTimeout)
	}
	if c.KeepAliveInterval == 0 {
		c.KeepAliveInterval = DefaultKeepAliveInterval
	}
	if c.KeepAliveCountMax <= 0 {
		c.KeepAliveCountMax = DefaultKeepAliveCountMax
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.ServerVersion == "" {
		c.ServerVersion = DefaultServerVersion
	}
	if c.LookupLogin == nil {
		c.LookupLogin = LookupOSLogin
	}
	return nil
}
