// Package config turns postern.yaml and the command-line flags of
// `postern start` into one validated Config.
//
// Precedence is flags over the YAML file over defaults, as operators expect
// from every daemon they run: the file describes the machine, a flag is a
// one-off override. A file with an unknown key is an error naming the file
// and the line, never silently ignored: a typo in a security setting must not
// quietly fall back to a default.
package config

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"gopkg.in/yaml.v3"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/sshalgo"
)

// Roles a process can run, in any combination.
const (
	RoleAuth  = "auth"
	RoleProxy = "proxy"
	RoleNode  = "node"
)

// Backend types.
const (
	BackendSQLite = "sqlite"
	BackendEtcd   = "etcd"
)

// Defaults (docs/reference.md lists them; operators rely on the ports).
const (
	DefaultDataDir  = "/var/lib/postern"
	DefaultNodeAddr = "0.0.0.0:3022"
	DefaultSSHAddr  = "0.0.0.0:3023"
	DefaultAuthAddr = "0.0.0.0:3025"
	DefaultWebAddr  = "0.0.0.0:3080"
	// DefaultTunnelAddr is the proxy's reverse tunnel port.
	DefaultTunnelAddr = "0.0.0.0:3024"
	// DefaultPeerAddr is the proxy's peering port (several proxies).
	DefaultPeerAddr = "0.0.0.0:3021"
	// DefaultDiagAddr is loopback only: metrics and health describe the
	// estate and are nobody else's business unless the operator says so.
	DefaultDiagAddr = "127.0.0.1:3000"
	// DefaultGCPercent is the daemon's GOGC. Measured with
	// bench/postern-vs-openssh.sh (ssh -J, 512 MiB each way, same run):
	// the proxy's garbage is x/crypto's per-packet buffers, and at Go's
	// default of 100 the collector is a fifth of the hop's upload CPU;
	// 400 cuts it to a fraction of that. The cost is memory: between
	// collections the heap may grow to 5x the live heap instead of 2x
	// (live heap is ~50 KiB per idle session, so ~250 MiB peak instead of
	// ~100 MiB at 1,000 sessions). GOMEMLIMIT, when the operator sets it,
	// still bounds the total: the runtime collects earlier near the limit.
	DefaultGCPercent = 400
	// MinGCPercent and MaxGCPercent bound gc_percent: below 10 the process
	// does little but collect, above 10,000 the heap is effectively
	// unbounded.
	MinGCPercent = 10
	MaxGCPercent = 10000
	// DefaultShutdownGrace is how long sessions may drain on SIGTERM before
	// they are cut: long enough for a command to finish, short enough for a
	// service manager's own stop timeout (systemd's default is 90s).
	DefaultShutdownGrace = 30 * time.Second
	// DefaultClusterName is used when none is configured.
	DefaultClusterName = "postern"
)

// Limits are the connection caps (the hardening issue fills them in).
type Limits struct {
	// MaxConnectionsPerIP caps concurrent connections from one source
	// address on each listener; zero means the default.
	MaxConnectionsPerIP int `yaml:"max_connections_per_ip,omitempty"`
	// MaxConnectionsPerUser caps concurrent authenticated connections of one
	// user; zero means the default.
	MaxConnectionsPerUser int `yaml:"max_connections_per_user,omitempty"`
	// MaxSessionsPerUser caps one user's concurrent session and
	// forwarding channels on the proxy; zero means the default.
	MaxSessionsPerUser int `yaml:"max_sessions_per_user,omitempty"`
	// MaxConnections caps all concurrent connections on each listener;
	// zero means the default.
	MaxConnections int `yaml:"max_connections,omitempty"`
	// MaxHandshakes and MaxHandshakesPerIP cap connections still in their
	// TLS or SSH handshake on the tunnel and peer ports, in total and per
	// source address; zero means the defaults.
	MaxHandshakes      int `yaml:"max_handshakes,omitempty"`
	MaxHandshakesPerIP int `yaml:"max_handshakes_per_ip,omitempty"`
	// MaxDescriptors is the file descriptor budget every listener's
	// connections share; zero means RLIMIT_NOFILE less a reserve for the
	// rest of the process.
	MaxDescriptors int `yaml:"max_descriptors,omitempty"`
	// HandshakeTimeout bounds the handshake on the tunnel and peer ports:
	// a connection that has not authenticated by then is closed. Zero
	// means 10s.
	HandshakeTimeout time.Duration `yaml:"handshake_timeout,omitempty"`
	// For every cap, a negative value means no cap (lib/limiter explains
	// each default).
	// IdleTimeout closes SSH connections without traffic; zero means never.
	IdleTimeout time.Duration `yaml:"idle_timeout,omitempty"`
}

// FileConfig is the YAML file, field for field. Empty values mean "not set
// here": defaults apply unless a flag sets them.
type FileConfig struct {
	DataDir     string            `yaml:"data_dir,omitempty"`
	Roles       []string          `yaml:"roles,omitempty"`
	ClusterName string            `yaml:"cluster_name,omitempty"`
	NodeName    string            `yaml:"nodename,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	// AuthServer is the auth API's HOST:PORT, or several separated by
	// commas (several auth processes on one etcd): clients fail over.
	AuthServer string `yaml:"auth_server,omitempty"`
	// ProxyServer, for a node behind NAT, is the proxy's web address
	// (HOST:3080): the node joins through it, opens no listening port and
	// reaches auth only over its reverse tunnel. Excludes AuthServer.
	ProxyServer string `yaml:"proxy_server,omitempty"`
	// TunnelAddr is where a proxy accepts reverse tunnels.
	TunnelAddr string `yaml:"tunnel_addr,omitempty"`
	Token      string `yaml:"token,omitempty"`
	CAPin      string `yaml:"ca_pin,omitempty"`
	NodeAddr   string `yaml:"node_addr,omitempty"`
	SSHAddr    string `yaml:"ssh_addr,omitempty"`
	WebAddr    string `yaml:"web_addr,omitempty"`
	AuthAddr   string `yaml:"auth_addr,omitempty"`
	DiagAddr   string `yaml:"diag_addr,omitempty"`

	// PeerAddr is where a proxy serves peered dials from other proxies
	// (mutual TLS, proxy identities only).
	PeerAddr string `yaml:"peer_addr,omitempty"`

	// DiagPprof serves net/http/pprof under /debug/pprof/ on the
	// diagnostics address. Off by default (profiles show memory contents'
	// shapes, command names and timings), and refused unless diag_addr is a
	// loopback address.
	DiagPprof bool `yaml:"diag_pprof,omitempty"`
	// GCPercent is the garbage collector's target (what GOGC sets): zero
	// means DefaultGCPercent unless the GOGC environment variable is set,
	// which then wins. See DefaultGCPercent for its memory cost.
	GCPercent     int           `yaml:"gc_percent,omitempty"`
	PublicAddrs   []string      `yaml:"public_addrs,omitempty"`
	WebCert       string        `yaml:"web_cert,omitempty"`
	WebKey        string        `yaml:"web_key,omitempty"`
	Backend       BackendConfig `yaml:"backend,omitempty"`
	Debug         bool          `yaml:"debug,omitempty"`
	LogFormat     string        `yaml:"log_format,omitempty"`
	ShutdownGrace time.Duration `yaml:"shutdown_grace,omitempty"`
	// WebTerminalGrace is how long a web terminal waits for a resume
	// after its browser went away; nil means the default (5m), 0 none.
	WebTerminalGrace *time.Duration `yaml:"web_terminal_grace,omitempty"`
	Limits           Limits         `yaml:"limits,omitempty"`
	// Recordings is where the auth server keeps session recordings.
	Recordings RecordingsConfig `yaml:"recordings,omitempty"`
	// Audit exports this process's audit events (audit.go).
	Audit AuditConfig `yaml:"audit,omitempty"`
	// AccessRequests configures access request notifications
	// (accessrequests.go).
	AccessRequests AccessRequestsConfig `yaml:"access_requests,omitempty"`
	// Tracing exports this process's spans (OpenTelemetry, OTLP/HTTP);
	// off when unset.
	Tracing observe.TracingConfig `yaml:"tracing,omitempty"`

	// SSHKexAlgorithms, SSHCiphers and SSHMACs are the key exchanges,
	// ciphers and MACs, in preference order, that every SSH port of this
	// process (proxy SSH, node, tunnel) offers and every SSH client it
	// runs (web terminal, tunnel agent) sends; unset means the hardened
	// defaults of lib/sshalgo. Each name must be one x/crypto implements
	// and does not call insecure: a typo or a removed algorithm is an
	// error at start-up, not a port that silently offers the defaults.
	SSHKexAlgorithms []string `yaml:"ssh_kex_algorithms,omitempty"`
	SSHCiphers       []string `yaml:"ssh_ciphers,omitempty"`
	SSHMACs          []string `yaml:"ssh_macs,omitempty"`
}

// BackendConfig selects the storage of an auth server.
type BackendConfig struct {
	// Type is sqlite (default) or etcd.
	Type string `yaml:"type,omitempty"`
	// EtcdEndpoints are the etcd client URLs when Type is etcd.
	EtcdEndpoints []string `yaml:"etcd_endpoints,omitempty"`
	// EtcdPrefix namespaces Postern's keys in a shared etcd.
	EtcdPrefix string `yaml:"etcd_prefix,omitempty"`
	// EtcdTLS, when set, makes the connections to etcd TLS (https://
	// endpoints), with a client certificate when cert_file is set.
	EtcdTLS *EtcdTLS `yaml:"etcd_tls,omitempty"`
}

// EtcdTLS are the PEM files of TLS to etcd: the CA of the etcd servers'
// certificates, and the client certificate and key etcd's
// --client-cert-auth checks.
type EtcdTLS struct {
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file,omitempty"`
}

// Config is the validated configuration of one postern process.
type Config struct {
	FileConfig
	// ConfigFile is where FileConfig came from, for messages; empty when
	// no file was read.
	ConfigFile string
	// DiagAddrDefaulted is set by CheckAndSetDefaults when nobody chose the
	// diagnostics address. Two processes on one machine (two nodes on a
	// laptop, a node beside an all-in-one) would both take the default, and
	// the second must still start: a busy default only disables its
	// diagnostics with a warning, while an address someone asked for stays
	// a fatal error.
	DiagAddrDefaulted bool
}

// ReadFile parses a YAML config file. Unknown keys and type errors name the
// file and the line.
func ReadFile(path string) (*FileConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	fc, err := Parse(data)
	if err != nil {
		return nil, trace.BadParameter("%s: %v", path, err)
	}
	return fc, nil
}

// Parse decodes YAML config bytes strictly.
func Parse(data []byte) (*FileConfig, error) {
	var fc FileConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil {
		if err.Error() == "EOF" {
			return &fc, nil // an empty file is a valid, empty config
		}
		return nil, trace.BadParameter("%s", cleanYAMLError(err))
	}
	return &fc, nil
}

// cleanYAMLError turns yaml.v3's "yaml: unmarshal errors:\n  line 3: ..."
// into one line.
func cleanYAMLError(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	msg = strings.TrimPrefix(msg, "unmarshal errors:\n")
	lines := strings.Split(msg, "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	return strings.Join(lines, "; ")
}

// CheckAndSetDefaults fills defaults and validates everything a process
// needs before it touches the disk or the network.
func (c *Config) CheckAndSetDefaults() error {
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		return trace.Wrap(err)
	}
	c.DataDir = abs
	if len(c.Roles) == 0 {
		c.Roles = []string{RoleAuth, RoleProxy, RoleNode}
	}
	for _, r := range c.Roles {
		switch r {
		case RoleAuth, RoleProxy, RoleNode:
		default:
			return trace.BadParameter("unknown role %q: want a combination of auth, proxy and node", r)
		}
	}
	if c.ClusterName == "" {
		c.ClusterName = DefaultClusterName
	}
	if c.NodeName == "" {
		host, err := os.Hostname()
		if err != nil {
			return trace.Wrap(err, "reading the OS hostname (set --nodename)")
		}
		c.NodeName = host
	}
	for k := range c.Labels {
		if k == "" {
			return trace.BadParameter("labels: empty label key")
		}
	}
	defaults := []struct {
		name string
		v    *string
		def  string
	}{
		{"node_addr", &c.NodeAddr, DefaultNodeAddr},
		{"ssh_addr", &c.SSHAddr, DefaultSSHAddr},
		{"web_addr", &c.WebAddr, DefaultWebAddr},
		{"tunnel_addr", &c.TunnelAddr, DefaultTunnelAddr},
		{"peer_addr", &c.PeerAddr, DefaultPeerAddr},
		{"auth_addr", &c.AuthAddr, DefaultAuthAddr},
		{"diag_addr", &c.DiagAddr, DefaultDiagAddr},
	}
	// Or-ed, not assigned: CheckAndSetDefaults runs more than once on one
	// config (tool/postern validates the flags, service.New again), and
	// the second call finds the default already filled in.
	c.DiagAddrDefaulted = c.DiagAddrDefaulted || c.DiagAddr == ""
	for _, d := range defaults {
		if *d.v == "" {
			*d.v = d.def
		}
		if _, _, err := net.SplitHostPort(*d.v); err != nil {
			return trace.BadParameter("%s: invalid address %q: want HOST:PORT", d.name, *d.v)
		}
	}
	if c.DiagPprof {
		if err := checkLoopback(c.DiagAddr); err != nil {
			return trace.BadParameter("diag_pprof needs a loopback diag_addr (profiles are not for the network): %v", err)
		}
	}
	if c.GCPercent != 0 && (c.GCPercent < MinGCPercent || c.GCPercent > MaxGCPercent) {
		return trace.BadParameter("gc_percent %d: want %d..%d (or unset for %d)", c.GCPercent, MinGCPercent, MaxGCPercent, DefaultGCPercent)
	}
	if c.ProxyServer != "" {
		if len(c.Roles) != 1 || !c.HasRole(RoleNode) {
			return trace.BadParameter("proxy_server (--proxy-server) is for a node alone: run it with --roles node, not %v", c.Roles)
		}
		if c.AuthServer != "" {
			return trace.BadParameter("give either auth_server (--auth-server) or proxy_server (--proxy-server), not both")
		}
		if _, _, err := net.SplitHostPort(c.ProxyServer); err != nil {
			return trace.BadParameter("proxy_server: invalid address %q: want HOST:PORT (the proxy's web port, 3080)", c.ProxyServer)
		}
	} else if !c.HasRole(RoleAuth) {
		if c.AuthServer == "" {
			return trace.BadParameter("roles %v need --auth-server or, for a node behind NAT, --proxy-server (no local auth role)", c.Roles)
		}
		for _, a := range c.AuthServers() {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return trace.BadParameter("auth_server: invalid address %q: want HOST:PORT, or several separated by commas", a)
			}
		}
	}
	if c.CAPin != "" && !strings.HasPrefix(c.CAPin, "sha256:") {
		return trace.BadParameter("ca_pin %q: want sha256:HEX", c.CAPin)
	}
	if (c.WebCert == "") != (c.WebKey == "") {
		return trace.BadParameter("web_cert and web_key go together: set both or neither")
	}
	switch c.Backend.Type {
	case "":
		c.Backend.Type = BackendSQLite
	case BackendSQLite:
	case BackendEtcd:
		if len(c.Backend.EtcdEndpoints) == 0 {
			return trace.BadParameter("backend etcd needs etcd_endpoints (--etcd-endpoints)")
		}
		if err := c.Backend.checkEtcd(); err != nil {
			return trace.Wrap(err)
		}
	default:
		return trace.BadParameter("unknown backend %q: want sqlite or etcd", c.Backend.Type)
	}
	if err := c.Recordings.check(); err != nil {
		return trace.Wrap(err)
	}
	if c.Recordings.Dir != "" {
		abs, err := filepath.Abs(c.Recordings.Dir)
		if err != nil {
			return trace.Wrap(err)
		}
		c.Recordings.Dir = abs
	}
	if err := c.Audit.check(); err != nil {
		return trace.Wrap(err)
	}
	if err := c.AccessRequests.check(); err != nil {
		return trace.Wrap(err)
	}
	if err := c.Tracing.Check(); err != nil {
		return trace.Wrap(err)
	}
	switch c.LogFormat {
	case "":
		c.LogFormat = "text"
	case "text", "json":
	default:
		return trace.BadParameter("unknown log format %q: want text or json", c.LogFormat)
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	if err := c.checkSSHAlgorithms(); err != nil {
		return trace.Wrap(err)
	}
	return nil
}

// checkSSHAlgorithms validates ssh_kex_algorithms, ssh_ciphers and
// ssh_macs; the error names the key and the value.
func (c *Config) checkSSHAlgorithms() error {
	for _, l := range []struct {
		key   string
		kind  sshalgo.Kind
		names []string
	}{
		{"ssh_kex_algorithms", sshalgo.KeyExchanges, c.SSHKexAlgorithms},
		{"ssh_ciphers", sshalgo.Ciphers, c.SSHCiphers},
		{"ssh_macs", sshalgo.MACs, c.SSHMACs},
	} {
		if err := sshalgo.Check(l.kind, l.names); err != nil {
			return trace.BadParameter("%s: %v", l.key, err)
		}
	}
	return nil
}

// SSHAlgorithms are the configured algorithm lists (an unset one is
// sshalgo's default).
func (c *Config) SSHAlgorithms() sshalgo.Lists {
	return sshalgo.Lists{KeyExchanges: c.SSHKexAlgorithms, Ciphers: c.SSHCiphers, MACs: c.SSHMACs}.WithDefaults()
}

// checkEtcd validates the etcd endpoints against the TLS setting: with
// etcd_tls every endpoint must be https (a plain http endpoint would send
// the backend's secrets, the CA keys among them, in clear), and without it
// none may be (the client would have nothing to verify the server with).
func (b *BackendConfig) checkEtcd() error {
	for _, ep := range b.EtcdEndpoints {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return trace.BadParameter("etcd endpoint %q: want http://HOST:PORT or https://HOST:PORT", ep)
		}
		switch {
		case b.EtcdTLS != nil && u.Scheme != "https":
			return trace.BadParameter("etcd endpoint %q: backend.etcd_tls is set, so endpoints must be https://", ep)
		case b.EtcdTLS == nil && u.Scheme == "https":
			return trace.BadParameter("etcd endpoint %q is https: set backend.etcd_tls (ca_file, cert_file, key_file)", ep)
		}
	}
	if t := b.EtcdTLS; t != nil {
		if t.CAFile == "" {
			return trace.BadParameter("backend.etcd_tls: missing ca_file (the CA of the etcd servers' certificates)")
		}
		if (t.CertFile == "") != (t.KeyFile == "") {
			return trace.BadParameter("backend.etcd_tls: cert_file and key_file go together: set both or neither")
		}
	}
	return nil
}

// AuthServers splits auth_server ("a:3025,b:3025") into its addresses,
// in the order given: the auth client tries them in that order and fails
// over to the next when one cannot be reached.
func (c *Config) AuthServers() []string { return SplitAddrs(c.AuthServer) }

// SplitAddrs splits a comma-separated address list, dropping blanks.
func SplitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// HasRole reports whether the process runs role.
func (c *Config) HasRole(role string) bool { return slices.Contains(c.Roles, role) }

// ParseLabels parses "k=v,k2=v2".
func ParseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, trace.BadParameter("invalid label %q: want key=value", kv)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}

// ParseRoles parses "auth,proxy,node".
func ParseRoles(s string) []string {
	var out []string
	for _, r := range strings.Split(s, ",") {
		if r = strings.TrimSpace(r); r != "" {
			out = append(out, r)
		}
	}
	return out
}

// Paths inside the data dir. Kept in one place so that the daemon, pctl and
// tests agree on the layout.
func (c *Config) BackendPath() string  { return filepath.Join(c.DataDir, "backend", "postern.db") }
func (c *Config) HostUUIDPath() string { return filepath.Join(c.DataDir, "host_uuid") }

// RecordingSpoolDir is where a node writes recording chunks until auth has
// them (DATA_DIR/recordings/SESSION/).
func (c *Config) RecordingSpoolDir() string { return filepath.Join(c.DataDir, "recordings") }

// ProxyRecordingSpoolDir is the proxy's spool of the web terminals it
// records (to OpenSSH nodes): apart from a node's spool in the same data
// dir, because each is uploaded with its own identity.
func (c *Config) ProxyRecordingSpoolDir() string { return filepath.Join(c.DataDir, "proxy-recordings") }

// AuthRecordingsDir is where the auth server stores uploaded recordings;
// apart from the spool, so that an all-in-one never uploads its own store.
func (c *Config) AuthRecordingsDir() string { return filepath.Join(c.DataDir, "auth", "recordings") }
func (c *Config) IdentityDir(role string) string {
	return filepath.Join(c.DataDir, "identity", role)
}
func (c *Config) AdminIdentityDir() string { return AdminIdentityDir(c.DataDir) }
func (c *Config) WebTLSDir() string        { return filepath.Join(c.DataDir, "web") }
func (c *Config) LogDir() string           { return filepath.Join(c.DataDir, "log") }

// AuthAddrFile is written next to the admin identity once the auth API
// listens: the address pctl on the same machine dials, so that an operator
// never has to repeat --auth-addr.
const AuthAddrFile = "auth_addr"

// AdminIdentityDir is where the auth server leaves the admin identity that
// pctl on the same machine uses.
func AdminIdentityDir(dataDir string) string { return filepath.Join(dataDir, "identity", "admin") }

// String is for debug logs.
func (c *Config) String() string {
	return fmt.Sprintf("roles=%v cluster=%s data_dir=%s", c.Roles, c.ClusterName, c.DataDir)
}

// checkLoopback accepts HOST:PORT whose host is a loopback IP or
// "localhost".
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return trace.BadParameter("invalid address %q: want HOST:PORT", addr)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return trace.BadParameter("%q is not a loopback address", addr)
}
