package services

import (
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gravitational/trace"
)

// Certificate extensions Postern writes into user certificates. They carry
// who the holder is and which roles were granted at issue time, so a node
// can decide without asking auth who the user is; the role definitions
// themselves are looked up live, so a tightened role applies at once.
const (
	// CertExtensionUser is the Postern user name.
	CertExtensionUser = "postern-user@postern.dev"
	// CertExtensionRoles is a JSON array of role names.
	CertExtensionRoles = "postern-roles@postern.dev"
	// CertExtensionTraits is a JSON object of the user's traits, so that
	// {{internal.logins}} expands on a node exactly as it did at issue.
	CertExtensionTraits = "postern-traits@postern.dev"
	// CertExtensionCluster is the cluster that issued the certificate.
	CertExtensionCluster = "postern-cluster@postern.dev"
	// CertExtensionHostRole is a host certificate's role ("node",
	// "proxy"): the tunnel port admits only nodes, and a node trusts only
	// proxies at the other end of its tunnel. A host certificate without
	// it (issued before reverse tunnels) is refused there.
	CertExtensionHostRole = "postern-host-role@postern.dev"
	// CertExtensionSessionMFA marks a per-session certificate, issued
	// after a fresh second factor for one session: a JSON SessionMFATarget
	// naming the node (UUID), its cluster and the login. The proxy lets it
	// reach that node only, and only nodes a require_session_mfa role
	// reaches need it.
	CertExtensionSessionMFA = "postern-session-mfa@postern.dev"
)

// SessionMFATarget is what a per-session certificate is bound to.
type SessionMFATarget struct {
	Cluster string `json:"cluster"`
	Node    string `json:"node"`
	Login   string `json:"login"`
}

// SessionMFATTL is a per-session certificate's lifetime: long enough to
// connect with it, no longer. A session it opened goes on after it
// expires; a new one needs a new factor.
const SessionMFATTL = time.Minute

// loginsTemplate expands to the user's own logins trait.
const loginsTemplate = "{{internal.logins}}"

// TraitExternalPrefix starts the name of every trait an identity
// provider's claims set: the claim "email" is the trait "external.email",
// which roles name as {{external.email}}. The prefix keeps a provider's
// claims apart from Postern's own traits: a claim called "logins" must
// never feed {{internal.logins}}.
const TraitExternalPrefix = "external."

// loginTemplate is a parsed role login template: the trait it reads, and
// whether only the local part (before the last "@") of each value is
// used ({{email.local(external.email)}}).
type loginTemplate struct {
	trait      string
	emailLocal bool
}

// parseLoginTemplate parses a role login that contains "{{": ok is false
// for anything but {{internal.logins}}, {{external.CLAIM}} and
// {{email.local(external.CLAIM)}}.
func parseLoginTemplate(l string) (t loginTemplate, ok bool) {
	if l == loginsTemplate {
		return loginTemplate{trait: TraitLogins}, true
	}
	inner, ok := strings.CutPrefix(l, "{{")
	if !ok {
		return t, false
	}
	if inner, ok = strings.CutSuffix(inner, "}}"); !ok {
		return t, false
	}
	inner = strings.TrimSpace(inner)
	if arg, ok := strings.CutPrefix(inner, "email.local("); ok {
		arg, ok = strings.CutSuffix(arg, ")")
		if !ok {
			return t, false
		}
		t.emailLocal = true
		inner = strings.TrimSpace(arg)
	}
	claim, ok := strings.CutPrefix(inner, TraitExternalPrefix)
	if !ok || CheckClaimName(claim) != nil {
		return loginTemplate{}, false
	}
	t.trait = TraitExternalPrefix + claim
	return t, true
}

// expand returns the logins t yields for traits. Values that are not
// valid logins are dropped: an external trait is whatever the identity
// provider said, and it becomes a certificate principal and an account
// name on the node.
func (t loginTemplate) expand(traits map[string][]string) []string {
	var out []string
	for _, v := range traits[t.trait] {
		if t.emailLocal {
			i := strings.LastIndexByte(v, '@')
			if i <= 0 {
				continue
			}
			v = v[:i]
		}
		if CheckLogin(v) == nil {
			out = append(out, v)
		}
	}
	return out
}

// AccessChecker answers RBAC questions for one user: the user's roles with
// the user's traits. Decisions are pure functions over this data, so they
// are tested with tables and made identically on every node and proxy.
// Deny is the default: an empty checker allows nothing.
type AccessChecker struct {
	roles  []*Role
	traits map[string][]string
}

// NewAccessChecker builds a checker. roles must already be validated.
func NewAccessChecker(roles []*Role, traits map[string][]string) *AccessChecker {
	return &AccessChecker{roles: roles, traits: traits}
}

// RoleNames lists the checker's roles.
func (a *AccessChecker) RoleNames() []string {
	out := make([]string, 0, len(a.roles))
	for _, r := range a.roles {
		out = append(out, r.Metadata.Name)
	}
	return out
}

// expandLogins applies traits to a role's logins, dropping empty results.
func (a *AccessChecker) expandLogins(r *Role) []string {
	var out []string
	for _, l := range r.Spec.Logins {
		if t, ok := parseLoginTemplate(l); ok {
			out = append(out, t.expand(a.traits)...)
			continue
		}
		if strings.Contains(l, "{{") {
			// An unknown template never grants anything.
			continue
		}
		out = append(out, l)
	}
	return out
}

// Logins is the union of every role's expanded logins, sorted: the
// principals of the user's certificate.
func (a *AccessChecker) Logins() []string {
	var out []string
	for _, r := range a.roles {
		for _, l := range a.expandLogins(r) {
			if l != "" && !slices.Contains(out, l) {
				out = append(out, l)
			}
		}
	}
	slices.Sort(out)
	return out
}

// rolesForNode returns the roles whose node_labels match node.
func (a *AccessChecker) rolesForNode(node *Node) []*Role {
	var out []*Role
	for _, r := range a.roles {
		if LabelsMatch(r.Spec.NodeLabels, node.Labels) {
			out = append(out, r)
		}
	}
	return out
}

// CheckAccessToNode allows login on node when one role both matches the
// node's labels and grants the login. The error never says which part
// failed to the user beyond what they could learn anyway.
func (a *AccessChecker) CheckAccessToNode(node *Node, login string) error {
	if login == "" {
		return trace.AccessDenied("no login given")
	}
	matched := a.rolesForNode(node)
	if len(matched) == 0 {
		return trace.AccessDenied("access to node %q denied: no role matches its labels", node.Hostname)
	}
	for _, r := range matched {
		if slices.Contains(a.expandLogins(r), login) {
			return nil
		}
	}
	return trace.AccessDenied("access to node %q as login %q denied: no role grants that login on this node", node.Hostname, login)
}

// CanForwardAgent reports whether a role that reaches node allows ssh -A.
func (a *AccessChecker) CanForwardAgent(node *Node) bool {
	for _, r := range a.rolesForNode(node) {
		if r.Spec.ForwardAgent {
			return true
		}
	}
	return false
}

// CanPortForward reports whether a role that reaches node allows -L/-R.
func (a *AccessChecker) CanPortForward(node *Node) bool {
	for _, r := range a.rolesForNode(node) {
		if r.Spec.PortForwarding {
			return true
		}
	}
	return false
}

// ForwardAgentAnywhere reports whether any role allows ssh -A on some
// node: whether a user certificate carries permit-agent-forwarding. An
// OpenSSH node enforces only the certificate; a Postern node also checks
// the roles that reach it (CanForwardAgent).
func (a *AccessChecker) ForwardAgentAnywhere() bool {
	return slices.ContainsFunc(a.roles, func(r *Role) bool { return r.Spec.ForwardAgent })
}

// PortForwardingAnywhere reports whether any role allows -L/-R on some
// node: whether a user certificate carries permit-port-forwarding (see
// ForwardAgentAnywhere).
func (a *AccessChecker) PortForwardingAnywhere() bool {
	return slices.ContainsFunc(a.roles, func(r *Role) bool { return r.Spec.PortForwarding })
}

// SessionMFARequired reports whether a role that reaches node requires a
// fresh second factor per session (require_session_mfa): the strictest
// of the roles that grant access there wins.
func (a *AccessChecker) SessionMFARequired(node *Node) bool {
	return slices.ContainsFunc(a.rolesForNode(node), func(r *Role) bool { return r.Spec.RequireSessionMFA })
}

// IsAdmin reports whether any role grants cluster administration.
func (a *AccessChecker) IsAdmin() bool {
	for _, r := range a.roles {
		if r.Spec.Admin {
			return true
		}
	}
	return false
}

// MaxSessionTTL is the smallest cap among the roles: the strictest role
// wins, so adding a role can never lengthen a certificate.
func (a *AccessChecker) MaxSessionTTL() time.Duration {
	ttl := DefaultMaxSessionTTL
	for _, r := range a.roles {
		if v := r.Spec.MaxSessionTTL.Value(); v > 0 && v < ttl {
			ttl = v
		}
	}
	return ttl
}

// LabelsMatch reports whether labels satisfy selector: every selector key
// must match. The key "*" with value "*" matches every node; an empty
// selector matches nothing (deny by default).
func LabelsMatch(selector map[string]LabelValues, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for key, values := range selector {
		if key == Wildcard {
			if slices.Contains(values, Wildcard) {
				continue
			}
			return false
		}
		v, ok := labels[key]
		if !ok || !valueMatches(values, v) {
			return false
		}
	}
	return true
}

// Wildcard matches any label key or value.
const Wildcard = "*"

func valueMatches(values LabelValues, v string) bool {
	for _, want := range values {
		switch {
		case want == Wildcard, want == v:
			return true
		case isRegexp(want):
			if re, err := regexp.Compile(want); err == nil && re.MatchString(v) {
				return true
			}
		}
	}
	return false
}

func isRegexp(s string) bool {
	return len(s) >= 2 && strings.HasPrefix(s, "^") && strings.HasSuffix(s, "$")
}

// CheckLabelSelector validates a role's node_labels: non-empty keys, no
// empty values, regular expressions that compile, and a "*" key only with
// the "*" value.
func CheckLabelSelector(selector map[string]LabelValues) error {
	for key, values := range selector {
		if key == "" {
			return trace.BadParameter("node_labels: empty label key")
		}
		if len(values) == 0 {
			return trace.BadParameter("node_labels: label %q has no values", key)
		}
		for _, v := range values {
			if v == "" {
				return trace.BadParameter("node_labels: label %q has an empty value", key)
			}
			if key == Wildcard && v != Wildcard {
				return trace.BadParameter("node_labels: key %q only accepts the value %q, got %q", Wildcard, Wildcard, v)
			}
			if isRegexp(v) {
				if _, err := regexp.Compile(v); err != nil {
					return trace.BadParameter("node_labels: label %q: invalid regular expression %q: %v", key, v, err)
				}
			}
		}
	}
	return nil
}

// ReviewRecordings reports whether a role lets the holder see every
// user's session recordings.
func (a *AccessChecker) ReviewRecordings() bool {
	for _, r := range a.roles {
		if r.Spec.ReviewRecordings {
			return true
		}
	}
	return false
}

// RecordingPolicy is what the holder's roles ask of session recording:
// RecordingRequire when any role requires it, else RecordingExempt when
// any role exempts, else "" (follow the cluster setting); role names the
// first role that decided it, for the audit trail and error messages.
func (a *AccessChecker) RecordingPolicy() (mode, role string) {
	for _, r := range a.roles {
		if r.Spec.SessionRecording == RecordingRequire {
			return RecordingRequire, r.Metadata.Name
		}
	}
	for _, r := range a.roles {
		if r.Spec.SessionRecording == RecordingExempt {
			return RecordingExempt, r.Metadata.Name
		}
	}
	return "", ""
}
