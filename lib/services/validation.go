package services

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"
)

// Resource versions. There is only one so far; the field exists so that a
// later incompatible spec can be told apart from this one in stored JSON and
// in operators' files.
const (
	V1 = "v1"
)

// NetworkingConfigName is the fixed name of the cluster networking config
// singleton (it is also the last component of its backend key).
const NetworkingConfigName = "cluster_networking_config"

// maxNameLen bounds every resource name. Names become backend keys, log
// fields and certificate extension values; 253 is the longest DNS name, which
// is the longest thing (a node hostname) that legitimately lands here.
const maxNameLen = 253

// CheckUserName validates a user name. The charset is conservative on
// purpose: user names end up in certificate KeyIds, audit logs, file names
// under ~/.postern/keys and backend keys, so only letters, digits and
// ". _ - @ +" are accepted (enough for e-mail style names), and the first
// character must be a letter or digit so a name can never look like a flag
// or a relative path.
func CheckUserName(name string) error {
	return checkName("user name", name, "._-@+")
}

// CheckRoleName validates a role name: letters, digits and ". _ -", starting
// with a letter or digit. Role names are listed in certificates as a JSON
// array and typed on command lines, where anything fancier is a trap.
func CheckRoleName(name string) error {
	return checkName("role name", name, "._-")
}

// CheckClusterName validates a cluster name. Cluster names appear in backend
// keys (so no "/"), as the CLUSTER of `HOST.CLUSTER` and `proxy:H:P@CLUSTER`
// (so no "@" or ":"), and in host certificate principals.
func CheckClusterName(name string) error {
	return checkName("cluster name", name, "._-")
}

func checkName(field, name, extra string) error {
	if name == "" {
		return trace.BadParameter("%s is empty", field)
	}
	if len(name) > maxNameLen {
		return trace.BadParameter("%s %q is longer than %d characters", field, name, maxNameLen)
	}
	for i, r := range name {
		ok := r < unicode.MaxASCII && (isASCIILetterOrDigit(r) || (i > 0 && strings.ContainsRune(extra, r)))
		if !ok {
			if i == 0 {
				return trace.BadParameter("%s %q must start with a letter or a digit", field, name)
			}
			return trace.BadParameter("%s %q contains %q: only letters, digits and %q are allowed", field, name, r, extra)
		}
	}
	return nil
}

func isASCIILetterOrDigit(r rune) bool {
	return (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
}

// checkKeyComponent validates something that becomes one component of a
// backend key but is otherwise free text (a node UUID, a token): not empty,
// no "/" (it would shift the key's components), no spaces or control
// characters (they make log lines lie).
func checkKeyComponent(field, v string) error {
	if v == "" {
		return trace.BadParameter("%s is empty", field)
	}
	if len(v) > maxNameLen {
		return trace.BadParameter("%s is longer than %d characters", field, maxNameLen)
	}
	for _, r := range v {
		if r == '/' || unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar {
			return trace.BadParameter("%s %q contains %q, which is not allowed", field, v, r)
		}
	}
	return nil
}

// CheckAndSetDefaults validates a node record as written by a heartbeat.
func (n *Node) CheckAndSetDefaults() error {
	if err := checkKeyComponent("node uuid", n.UUID); err != nil {
		return trace.Wrap(err)
	}
	if err := CheckClusterName(n.Cluster); err != nil {
		return trace.BadParameter("node %q: %v", n.UUID, err)
	}
	if n.Hostname == "" {
		n.Hostname = n.UUID
	}
	if err := checkKeyComponent("node hostname", n.Hostname); err != nil {
		return trace.BadParameter("node %q: %v", n.UUID, err)
	}
	if err := checkText("node hostname", n.Hostname, maxNameLen); err != nil {
		return trace.BadParameter("node %q: %v", n.UUID, err)
	}
	switch n.Kind {
	case "", NodeKindPostern:
	case NodeKindOpenSSH:
		// A stock sshd opens no tunnel; the proxy dials its address.
		if n.Tunnel {
			return trace.BadParameter("node %q: a node of kind %q cannot be a tunnel node", n.UUID, n.Kind)
		}
	default:
		return trace.BadParameter("node %q: kind is %q, want %q or %q", n.UUID, n.Kind, NodeKindPostern, NodeKindOpenSSH)
	}
	if n.Tunnel {
		// A tunnel node is reached only over its tunnel: an address on it
		// would be one the proxy must never dial.
		if n.Addr != "" {
			return trace.BadParameter("node %q: a tunnel node has no addr, got %q", n.UUID, n.Addr)
		}
	} else if _, _, err := SplitAddr(n.Addr); err != nil {
		return trace.BadParameter("node %q: addr: %v", n.UUID, err)
	}
	if err := CheckNodeLabels(n.Labels); err != nil {
		return trace.BadParameter("node %q: %v", n.UUID, err)
	}
	return nil
}

// CheckAndSetDefaults validates a proxy record as written by a heartbeat:
// a UUID and hostname that are safe key components and printable, a
// cluster name, and every address present a host:port.
func (p *Proxy) CheckAndSetDefaults() error {
	if err := checkKeyComponent("proxy uuid", p.UUID); err != nil {
		return trace.Wrap(err)
	}
	if err := CheckClusterName(p.Cluster); err != nil {
		return trace.BadParameter("proxy %q: %v", p.UUID, err)
	}
	if p.Hostname == "" {
		p.Hostname = p.UUID
	}
	if err := checkKeyComponent("proxy hostname", p.Hostname); err != nil {
		return trace.BadParameter("proxy %q: %v", p.UUID, err)
	}
	if err := checkText("proxy hostname", p.Hostname, maxNameLen); err != nil {
		return trace.BadParameter("proxy %q: %v", p.UUID, err)
	}
	for _, a := range []struct{ name, v string }{
		{"ssh_addr", p.SSHAddr}, {"web_addr", p.WebAddr}, {"tunnel_addr", p.TunnelAddr}, {"peer_addr", p.PeerAddr},
	} {
		if a.v == "" {
			continue
		}
		if _, _, err := SplitAddr(a.v); err != nil {
			return trace.BadParameter("proxy %q: %s: %v", p.UUID, a.name, err)
		}
	}
	if err := checkText("proxy version", p.Version, maxNameLen); err != nil {
		return trace.BadParameter("proxy %q: %v", p.UUID, err)
	}
	if len(p.OfflineOpenSSH) > maxOfflineOpenSSH {
		return trace.BadParameter("proxy %q: offline_openssh lists %d nodes, more than %d", p.UUID, len(p.OfflineOpenSSH), maxOfflineOpenSSH)
	}
	for _, id := range p.OfflineOpenSSH {
		if err := checkKeyComponent("offline_openssh node", id); err != nil {
			return trace.BadParameter("proxy %q: %v", p.UUID, err)
		}
	}
	return nil
}

// maxOfflineOpenSSH bounds a proxy record's offline list: the record is
// read by every pctl nodes ls, and no fleet registers more OpenSSH nodes.
const maxOfflineOpenSSH = 10_000

// Label bounds. Labels are printed in `pctl nodes ls`, `psh ls`, route
// explanations and ambiguity errors, and matched by every role check: a
// node must not be able to fill a terminal or the inventory with them.
// The lengths are those of Kubernetes label values and qualified keys,
// which operators already know; 64 labels is far more than any selector
// needs.
const (
	MaxNodeLabels    = 64
	MaxLabelKeyLen   = 253
	MaxLabelValueLen = 253
)

// CheckNodeLabels validates a node's labels: at most MaxNodeLabels, keys
// not empty, keys and values within their bounds and free of control
// characters. A label is written by the node itself (heartbeats), so it
// is untrusted text that later lands on an admin's terminal: an ESC in a
// value would let a node rewrite what `pctl nodes ls` shows.
func CheckNodeLabels(labels map[string]string) error {
	if len(labels) > MaxNodeLabels {
		return trace.BadParameter("%d labels, at most %d are allowed", len(labels), MaxNodeLabels)
	}
	for k, v := range labels {
		if k == "" {
			return trace.BadParameter("empty label key")
		}
		if err := checkText("label key", k, MaxLabelKeyLen); err != nil {
			return trace.Wrap(err)
		}
		if err := checkText(fmt.Sprintf("label %q: value", k), v, MaxLabelValueLen); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}

// checkText refuses text that would make a terminal or a log line lie:
// invalid UTF-8, control characters (C0, DEL and C1: ESC, CR, LF, BEL...),
// format characters (bidirectional overrides, zero-width joiners) and the
// Unicode line and paragraph separators. The value is quoted with %q in
// the error, which escapes all of these, so the error itself is safe to
// print.
func checkText(field, v string, maxLen int) error {
	if len(v) > maxLen {
		return trace.BadParameter("%s %q is longer than %d bytes", field, truncate([]byte(v), 40), maxLen)
	}
	if !utf8.ValidString(v) {
		return trace.BadParameter("%s %q is not valid UTF-8", field, v)
	}
	for _, r := range v {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029' {
			return trace.BadParameter("%s %q contains the control character %U", field, v, r)
		}
	}
	return nil
}

// hostnameMetachars are characters with a meaning in the places a
// hostname ends up: OpenSSH host patterns and principals ("*", "?", "!",
// ","), known_hosts ("[", "]"), proxy targets ("HOST:PORT", "@CLUSTER",
// "LOGIN@HOST") and URL paths ("/", "%").
const hostnameMetachars = "*?!,[]:@/%"

// CheckHostnameShape refuses a hostname that a node may not take because
// it would capture or confuse other names, whatever the charset allows.
// It is what the auth server applies at join and at every remote
// heartbeat; uuid is the caller's own UUID, addr its announced host:port
// (may be empty at join), and clusters the clusters the proxy routes to
// (the local one today; leaf clusters later). Refused:
//   - hostnames with characters outside letters, digits, ".", "-" and "_",
//     or not starting with a letter or digit (wildcards and pattern
//     characters above all: the hostname is a certificate principal);
//   - NAME.CLUSTER (any case) for a known cluster, and the cluster name
//     itself: routing rule 0 reads NAME.CLUSTER as NAME in CLUSTER, and the
//     cluster name is the proxy's principal;
//   - a UUID other than the node's own (routing rule 1 matches UUIDs
//     before hostnames: docs/reference.md, Routing);
//   - an IP address other than the host of the node's own addr (rule 2
//     matches addr hosts: a node called 10.0.0.5 would answer for the node
//     at 10.0.0.5);
//   - localhost and its subdomains: the proxy answers to localhost.
func CheckHostnameShape(hostname, uuid, addr string, clusters []string) error {
	if hostname == "" {
		return trace.BadParameter("hostname is empty")
	}
	if err := checkText("hostname", hostname, maxNameLen); err != nil {
		return trace.Wrap(err)
	}
	if ip, err := netip.ParseAddr(hostname); err == nil {
		host, _, _ := net.SplitHostPort(addr)
		own, err := netip.ParseAddr(host)
		if err != nil || own.Unmap() != ip.Unmap() {
			if addr == "" {
				return trace.BadParameter("hostname %q is an IP address that is not this node's address (it announces none): give the node a name", hostname)
			}
			return trace.BadParameter("hostname %q is an IP address that is not this node's address %q: give the node a name, or announce that address", hostname, addr)
		}
		return nil
	}
	for i, r := range hostname {
		ok := r < unicode.MaxASCII && (isASCIILetterOrDigit(r) || (i > 0 && strings.ContainsRune("._-", r)))
		if !ok {
			if strings.ContainsRune(hostnameMetachars, r) {
				return trace.BadParameter("hostname %q contains %q, which has a meaning in host patterns and targets", hostname, r)
			}
			if i == 0 {
				return trace.BadParameter("hostname %q must start with a letter or a digit", hostname)
			}
			return trace.BadParameter("hostname %q contains %q: use letters, digits and . - _, starting with a letter or a digit", hostname, r)
		}
	}
	if strings.Contains(hostname, "..") || strings.HasSuffix(hostname, ".") {
		return trace.BadParameter("hostname %q has an empty DNS label", hostname)
	}
	if IsUUIDShaped(hostname) && !strings.EqualFold(hostname, uuid) {
		return trace.BadParameter("hostname %q is a UUID that is not this node's UUID: it would answer for another node", hostname)
	}
	lower := strings.ToLower(hostname)
	if lower == "localhost" || strings.HasSuffix(lower, ".localhost") || lower == "localhost.localdomain" {
		return trace.BadParameter("hostname %q names the local machine, which the proxy answers to", hostname)
	}
	for _, c := range clusters {
		c = strings.ToLower(c)
		if c == "" {
			continue
		}
		if lower == c {
			return trace.BadParameter("hostname %q is the name of cluster %q", hostname, c)
		}
		if strings.HasSuffix(lower, "."+c) {
			return trace.BadParameter("hostname %q ends in .%s: NAME.CLUSTER means NAME in cluster %q, so no node may be called that", hostname, c, c)
		}
	}
	return nil
}

// IsUUIDShaped reports whether s parses as a UUID in any of the forms the
// uuid package accepts (canonical, braces, urn:uuid:, 32 hex digits): a
// name that looks like a UUID is reserved for the node minted with it.
func IsUUIDShaped(s string) bool {
	_, err := uuid.Parse(s)
	return err == nil
}

// SplitAddr splits a node address "host:port" (IPv6 as "[v6]:port") and
// checks the port is a number in 1..65535. A node must say which port it
// serves on: the proxy dials exactly this address and nothing else.
func SplitAddr(addr string) (host, port string, err error) {
	if addr == "" {
		return "", "", trace.BadParameter("address is empty")
	}
	host, port, err = net.SplitHostPort(addr)
	if err != nil {
		return "", "", trace.BadParameter("address %q: want host:port: %v", addr, err)
	}
	if host == "" {
		return "", "", trace.BadParameter("address %q has no host", addr)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return "", "", trace.BadParameter("address %q: port %q is not a number between 1 and 65535", addr, port)
	}
	return host, port, nil
}

// CheckAndSetDefaults validates a user and defaults Roles to ["access"].
func (u *User) CheckAndSetDefaults() error {
	if err := CheckUserName(u.Name); err != nil {
		return trace.Wrap(err)
	}
	if len(u.Roles) == 0 {
		u.Roles = []string{PresetAccessRole}
	}
	for _, r := range u.Roles {
		if err := CheckRoleName(r); err != nil {
			return trace.BadParameter("user %q: roles: %v", u.Name, err)
		}
	}
	for k, vals := range u.Traits {
		if k == "" {
			return trace.BadParameter("user %q: traits: empty trait name", u.Name)
		}
		if claim, ok := strings.CutPrefix(k, TraitExternalPrefix); ok {
			if err := CheckClaimName(claim); err != nil {
				return trace.BadParameter("user %q: traits: %v", u.Name, err)
			}
		}
		if k == TraitLogins {
			for _, l := range vals {
				if err := CheckLogin(l); err != nil {
					return trace.BadParameter("user %q: traits: %v", u.Name, err)
				}
			}
		}
	}
	return nil
}

// CheckLogin validates an OS login as used in a role or a logins trait. It
// becomes a certificate principal and, on the node, the account a shell runs
// as, so the charset is that of POSIX portable user names plus "@" and "\"
// for directory-backed accounts.
func CheckLogin(login string) error {
	if login == "" {
		return trace.BadParameter("login is empty")
	}
	if len(login) > maxNameLen {
		return trace.BadParameter("login %q is too long", login)
	}
	if login[0] == '-' {
		return trace.BadParameter("login %q must not start with '-'", login)
	}
	for _, r := range login {
		if !(r < unicode.MaxASCII && (isASCIILetterOrDigit(r) || strings.ContainsRune("._-@\\$", r))) {
			return trace.BadParameter("login %q contains %q, which is not allowed", login, r)
		}
	}
	return nil
}

// CheckAndSetDefaults validates a role and fills in kind, version and the
// session TTL, so that what `pctl get role` shows is what is enforced.
func (r *Role) CheckAndSetDefaults() error {
	if r.Kind == "" {
		r.Kind = KindRole
	}
	if r.Kind != KindRole {
		return trace.BadParameter("role: kind is %q, want %q", r.Kind, KindRole)
	}
	if r.Version == "" {
		r.Version = V1
	}
	if r.Version != V1 {
		return trace.BadParameter("role %q: unsupported version %q, want %q", r.Metadata.Name, r.Version, V1)
	}
	if err := CheckRoleName(r.Metadata.Name); err != nil {
		return trace.BadParameter("role: metadata.name: %v", err)
	}
	for _, l := range r.Spec.Logins {
		if strings.Contains(l, "{{") || strings.Contains(l, "}}") {
			if _, ok := parseLoginTemplate(l); !ok {
				return trace.BadParameter("role %q: spec.logins: unsupported template %q: want %s, {{external.CLAIM}} or {{email.local(external.CLAIM)}}", r.Metadata.Name, l, loginsTemplate)
			}
			continue
		}
		if err := CheckLogin(l); err != nil {
			return trace.BadParameter("role %q: spec.logins: %v", r.Metadata.Name, err)
		}
	}
	if err := CheckLabelSelector(r.Spec.NodeLabels); err != nil {
		return trace.BadParameter("role %q: spec.%v", r.Metadata.Name, err)
	}
	if r.Spec.MaxSessionTTL < 0 {
		return trace.BadParameter("role %q: spec.max_session_ttl must not be negative", r.Metadata.Name)
	}
	if r.Spec.MaxSessionTTL == 0 {
		r.Spec.MaxSessionTTL = Duration(DefaultMaxSessionTTL)
	}
	switch r.Spec.SessionRecording {
	case "", RecordingRequire, RecordingExempt:
	default:
		return trace.BadParameter("role %q: spec.session_recording: unknown value %q, want %q or %q (or leave it out to follow the cluster's session_recording)",
			r.Metadata.Name, r.Spec.SessionRecording, RecordingRequire, RecordingExempt)
	}
	if err := r.checkRequestOptions(); err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(checkSessionJoin(r))
}

// CheckAndSetDefaults validates a certificate authority: a known type, a
// cluster name and at least one parseable public key (a CA without a key
// would make every certificate check fail in a confusing way).
func (c *CertAuthority) CheckAndSetDefaults() error {
	if c.Type != UserCA && c.Type != HostCA {
		return trace.BadParameter("cert_authority: type is %q, want %q or %q", c.Type, UserCA, HostCA)
	}
	if err := CheckClusterName(c.ClusterName); err != nil {
		return trace.BadParameter("cert_authority %s: cluster_name: %v", c.Type, err)
	}
	if len(c.SSHPublicKeys) == 0 {
		return trace.BadParameter("cert_authority %s/%s: ssh_public_keys is empty", c.Type, c.ClusterName)
	}
	for i, k := range c.SSHPublicKeys {
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil {
			return trace.BadParameter("cert_authority %s/%s: ssh_public_keys[%d]: %v", c.Type, c.ClusterName, i, err)
		}
	}
	return nil
}

// DefaultClusterNetworkingConfig is what a cluster runs with until an admin
// sets something else.
func DefaultClusterNetworkingConfig() *ClusterNetworkingConfig {
	c := &ClusterNetworkingConfig{}
	// Cannot fail on the zero value.
	_ = c.CheckAndSetDefaults()
	return c
}

// CheckAndSetDefaults validates the networking config and fills defaults:
// unambiguous_match routing (an ambiguous name is an error, never a guess)
// and DefaultSSHDialTimeout.
func (c *ClusterNetworkingConfig) CheckAndSetDefaults() error {
	if c.Kind == "" {
		c.Kind = KindClusterNetworking
	}
	if c.Kind != KindClusterNetworking {
		return trace.BadParameter("cluster networking config: kind is %q, want %q", c.Kind, KindClusterNetworking)
	}
	if c.Version == "" {
		c.Version = V1
	}
	if c.Version != V1 {
		return trace.BadParameter("cluster networking config: unsupported version %q, want %q", c.Version, V1)
	}
	if c.Metadata.Name == "" {
		c.Metadata.Name = NetworkingConfigName
	}
	if c.Metadata.Name != NetworkingConfigName {
		return trace.BadParameter("cluster networking config: metadata.name is %q; it is a singleton named %q", c.Metadata.Name, NetworkingConfigName)
	}
	switch c.Spec.RoutingStrategy {
	case "":
		c.Spec.RoutingStrategy = RoutingUnambiguousMatch
	case RoutingUnambiguousMatch, RoutingMostRecent:
	default:
		return trace.BadParameter("cluster networking config: spec.routing_strategy is %q, want %q or %q",
			c.Spec.RoutingStrategy, RoutingUnambiguousMatch, RoutingMostRecent)
	}
	if c.Spec.SSHDialTimeout < 0 {
		return trace.BadParameter("cluster networking config: spec.ssh_dial_timeout must not be negative, got %v", c.Spec.SSHDialTimeout.Value())
	}
	if c.Spec.SSHDialTimeout == 0 {
		c.Spec.SSHDialTimeout = Duration(DefaultSSHDialTimeout)
	}
	switch {
	case c.Spec.TunnelFindTimeout < 0 || c.Spec.TunnelFindTimeout.Value() > MaxTunnelFindTimeout:
		return trace.BadParameter("cluster networking config: spec.tunnel_find_timeout must be between 0 and %v, got %v", MaxTunnelFindTimeout, c.Spec.TunnelFindTimeout.Value())
	case c.Spec.TunnelFindTimeout == 0:
		c.Spec.TunnelFindTimeout = Duration(DefaultTunnelFindTimeout)
	}
	switch {
	case c.Spec.KeepAliveInterval < 0:
		return trace.BadParameter("cluster networking config: spec.keep_alive_interval must not be negative, got %v", c.Spec.KeepAliveInterval.Value())
	case c.Spec.KeepAliveInterval == 0:
		c.Spec.KeepAliveInterval = Duration(DefaultTunnelKeepAliveInterval)
	}
	switch {
	case c.Spec.KeepAliveCountMax < 0:
		return trace.BadParameter("cluster networking config: spec.keep_alive_count_max must not be negative, got %d", c.Spec.KeepAliveCountMax)
	case c.Spec.KeepAliveCountMax == 0:
		c.Spec.KeepAliveCountMax = DefaultTunnelKeepAliveCountMax
	}
	switch c.Spec.SessionRecording {
	case "":
		c.Spec.SessionRecording = RecordingNode
	case RecordingNode, RecordingOff:
	default:
		return trace.BadParameter("cluster networking config: spec.session_recording is %q, want %q or %q",
			c.Spec.SessionRecording, RecordingNode, RecordingOff)
	}
	if c.Spec.MaxRecordingBytes < 0 {
		return trace.BadParameter("cluster networking config: spec.max_recording_bytes must not be negative, got %d", c.Spec.MaxRecordingBytes)
	}
	if c.Spec.MaxRecordingBytes == 0 {
		c.Spec.MaxRecordingBytes = DefaultMaxRecordingBytes
	}
	if _, err := ParseNetworks(c.Spec.NodeAddressNetworks); err != nil {
		return trace.BadParameter("cluster networking config: spec.node_address_networks: %v", trace.UserMessage(err))
	}
	return nil
}

// ParseNetworks parses a list of networks: CIDR prefixes ("10.0.0.0/8",
// "fd00::/8") or single addresses (a /32 or /128). The error names the
// entry and its position.
func ParseNetworks(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for i, s := range list {
		if p, err := netip.ParsePrefix(s); err == nil {
			if p != p.Masked() {
				return nil, trace.BadParameter("entry %d %q has host bits set: did you mean %q?", i, s, p.Masked().String())
			}
			out = append(out, p)
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return nil, trace.BadParameter("entry %d %q is not a network: want a CIDR prefix such as 10.0.0.0/8, or an IP address", i, s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// CheckAndSetDefaults validates a join token. A token must expire: a join
// secret that lives forever is a standing invitation.
func (t *Token) CheckAndSetDefaults() error {
	if err := checkKeyComponent("token name", t.Name); err != nil {
		return trace.Wrap(err)
	}
	if err := CheckTokenType(t.Type); err != nil {
		return trace.Wrap(err)
	}
	if t.Expires.IsZero() {
		return trace.BadParameter("token: expires is not set; join tokens must have a TTL")
	}
	return nil
}

// CheckTokenType accepts TokenTypeNode, TokenTypeProxy and
// TokenTypeTrustedCluster.
func CheckTokenType(t string) error {
	if !slices.Contains([]string{TokenTypeNode, TokenTypeProxy, TokenTypeTrustedCluster}, t) {
		return trace.BadParameter("token type is %q, want %q, %q or %q", t, TokenTypeNode, TokenTypeProxy, TokenTypeTrustedCluster)
	}
	return nil
}
