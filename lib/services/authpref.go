package services

import (
	"context"
	"encoding/json"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
)

// KindAuthPreference is the kind of the cluster's authentication
// preference: which second factors logins need.
const KindAuthPreference = "auth_preference"

// AuthPreferenceName is the fixed name of the singleton.
const AuthPreferenceName = "auth_preference"

const authPreferencePrefix = "auth_preference"

// Second-factor policies of AuthPreference.
const (
	// SecondFactorOff: no second factor is asked (enrolled ones are still
	// checked: a user's own factor is never skipped).
	SecondFactorOff = "off"
	// SecondFactorOTP: every local login needs a TOTP code.
	SecondFactorOTP = "otp"
	// SecondFactorWebAuthn: every local login needs a passkey.
	SecondFactorWebAuthn = "webauthn"
	// SecondFactorOn: every local login needs either.
	SecondFactorOn = "on"
)

// AuthPreference is the singleton authentication preference of a cluster.
type AuthPreference struct {
	Kind     string             `json:"kind,omitempty"`
	Version  string             `json:"version,omitempty"`
	Metadata Metadata           `json:"metadata"`
	Spec     AuthPreferenceSpec `json:"spec"`
}

// AuthPreferenceSpec is the body of AuthPreference.
type AuthPreferenceSpec struct {
	// SecondFactor is off, otp, webauthn or on (otp or webauthn); empty
	// means off.
	SecondFactor string `json:"second_factor,omitempty"`
	// WebAuthn is the relying party passkeys are bound to; nil means the
	// proxy's first public host name and web port.
	WebAuthn *WebAuthnPreference `json:"webauthn,omitempty"`
	// Passwordless allows a login with a discoverable passkey alone (it
	// verifies the user, so it is two factors in one).
	Passwordless bool `json:"passwordless,omitempty"`
}

// WebAuthnPreference names the WebAuthn relying party.
type WebAuthnPreference struct {
	// RPID is the relying party id: a host name (a registrable domain or
	// the host itself). Browsers refuse an IP address as an RP id, so a
	// cluster reached by IP alone cannot use passkeys; use a name
	// (localhost in tests).
	RPID string `json:"rp_id"`
	// Origins are the exact origins (https://HOST[:PORT]) the browser
	// may run a ceremony from; each host must be RPID or under it.
	Origins []string `json:"origins,omitempty"`
}

// CheckAndSetDefaults validates the preference and fills the defaults.
func (p *AuthPreference) CheckAndSetDefaults() error {
	if p.Kind == "" {
		p.Kind = KindAuthPreference
	}
	if p.Kind != KindAuthPreference {
		return trace.BadParameter("auth preference: kind is %q, want %q", p.Kind, KindAuthPreference)
	}
	if p.Version == "" {
		p.Version = V1
	}
	if p.Version != V1 {
		return trace.BadParameter("auth preference: unsupported version %q, want %q", p.Version, V1)
	}
	if p.Metadata.Name == "" {
		p.Metadata.Name = AuthPreferenceName
	}
	if p.Metadata.Name != AuthPreferenceName {
		return trace.BadParameter("auth preference: metadata.name is %q; it is a singleton named %q", p.Metadata.Name, AuthPreferenceName)
	}
	switch p.Spec.SecondFactor {
	case "":
		p.Spec.SecondFactor = SecondFactorOff
	case SecondFactorOff, SecondFactorOTP, SecondFactorWebAuthn, SecondFactorOn:
	default:
		return trace.BadParameter("auth preference: second_factor %q: want off, otp, webauthn or on", p.Spec.SecondFactor)
	}
	if w := p.Spec.WebAuthn; w != nil {
		if err := w.Check(); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}

// Check validates an RP id and its origins.
func (w *WebAuthnPreference) Check() error {
	if w.RPID == "" {
		return trace.BadParameter("auth preference: webauthn.rp_id is empty")
	}
	if net.ParseIP(w.RPID) != nil {
		return trace.BadParameter("auth preference: webauthn.rp_id %q is an IP address; browsers accept only a host name as a WebAuthn RP id", w.RPID)
	}
	if strings.ContainsAny(w.RPID, ":/ ") {
		return trace.BadParameter("auth preference: webauthn.rp_id %q: want a host name, without scheme or port", w.RPID)
	}
	for _, o := range w.Origins {
		u, err := url.Parse(o)
		if err != nil || u.Host == "" || u.Path != "" || u.RawQuery != "" || (u.Scheme != "https" && u.Scheme != "http") {
			return trace.BadParameter("auth preference: webauthn.origins: %q is not an origin (https://HOST[:PORT])", o)
		}
		h := u.Hostname()
		if h != w.RPID && !strings.HasSuffix(h, "."+w.RPID) {
			return trace.BadParameter("auth preference: webauthn.origins: host of %q is not %q or under it", o, w.RPID)
		}
	}
	return nil
}

// AllowsOTP says whether TOTP codes may be a second factor.
func (p *AuthPreference) AllowsOTP() bool {
	return p.Spec.SecondFactor == SecondFactorOTP || p.Spec.SecondFactor == SecondFactorOn
}

// AllowsWebAuthn says whether passkeys may be a second factor.
func (p *AuthPreference) AllowsWebAuthn() bool {
	return p.Spec.SecondFactor == SecondFactorWebAuthn || p.Spec.SecondFactor == SecondFactorOn
}

// Required says whether every local login needs a second factor.
func (p *AuthPreference) Required() bool { return p.Spec.SecondFactor != SecondFactorOff }

func authPreferenceKey() string { return backend.Key(authPreferencePrefix, AuthPreferenceName) }

// GetAuthPreference returns the preference; NotFound when none was set
// (auth then derives its answers from the users' enrolments).
func (s *Store) GetAuthPreference(ctx context.Context) (*AuthPreference, error) {
	item, err := s.b.Get(ctx, authPreferenceKey())
	if trace.IsNotFound(err) {
		return nil, trace.NotFound("no auth_preference is set")
	}
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var p AuthPreference
	if err := json.Unmarshal(item.Value, &p); err != nil {
		return nil, trace.BadParameter("corrupt record at %q: %v", item.Key, err)
	}
	if err := p.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	return &p, nil
}

// SetAuthPreference validates and writes the preference.
func (s *Store) SetAuthPreference(ctx context.Context, p *AuthPreference) error {
	if p == nil {
		return trace.BadParameter("missing auth preference")
	}
	if err := p.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	return s.put(ctx, authPreferenceKey(), p, time.Time{})
}

// DeleteAuthPreference removes the preference (back to the derived
// defaults).
func (s *Store) DeleteAuthPreference(ctx context.Context) error {
	return s.delete(ctx, authPreferenceKey(), "no auth_preference is set")
}
