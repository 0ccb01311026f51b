package web

import (
	"net/url"
	"strings"
	"testing"

	"github.com/go-webauthn/webauthn/protocol"

	"github.com/postern-dev/postern/lib/api"
)

// FuzzDecodeSSHLoginRequest: the login decoder takes bytes from anyone on
// the network; it must never panic, and whatever it accepts must carry a
// user, a key and a TTL in range.
func FuzzDecodeSSHLoginRequest(f *testing.F) {
	f.Add([]byte(`{"user":"alice","password":"pw","otp_token":"123456","pub_key":"ssh-ed25519 AAAA","ttl_seconds":3600}`))
	f.Add([]byte(`{"user":"alice","pub_key":"k","extra":true}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeSSHLoginRequest(data)
		if err != nil {
			if req != nil {
				t.Fatal("request returned with an error")
			}
			return
		}
		if req.User == "" || req.PubKey == "" || req.TTLSeconds < 0 || req.TTLSeconds > maxTTLSeconds {
			t.Fatalf("accepted an invalid request: %+v", req)
		}
	})
}

// FuzzCheckReturnTo: return_to comes from any link anyone may send a
// user; whatever CheckReturnTo accepts must stay on the proxy when a
// browser resolves it against the proxy's address.
func FuzzCheckReturnTo(f *testing.F) {
	for _, s := range []string{"", "/", "/web/cluster/c1/node/u/alice", "//evil.example", "/\\evil.example", "/\t/evil.example", "https://evil.example", "/%2F%2Fevil.example"} {
		f.Add(s)
	}
	base, err := url.Parse("https://proxy.example.com:3080/webapi/oidc/callback")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := CheckReturnTo(p)
		if err != nil {
			return
		}
		if !strings.HasPrefix(got, "/") || strings.HasPrefix(got, "//") {
			t.Fatalf("accepted %q as %q", p, got)
		}
		ref, err := url.Parse(got)
		if err != nil {
			t.Fatalf("accepted %q, which does not parse: %v", got, err)
		}
		if u := base.ResolveReference(ref); u.Host != base.Host || u.Scheme != base.Scheme {
			t.Fatalf("accepted %q, which leads to %s", got, u)
		}
	})
}

// FuzzDecodeSSOConsoleLoginRequest: psh's single sign-on start comes from
// anyone on the network; whatever the decoder accepts must name a
// connector, a loopback redirect and a 32-byte seal key.
func FuzzDecodeSSOConsoleLoginRequest(f *testing.F) {
	f.Add([]byte(`{"connector":"corp","pub_key":"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFZ3oHBJZHprEDR6+ggYBVWS1ZCmbQjSpbpm0JrRMDIi","ttl_seconds":3600,"redirect_url":"http://127.0.0.1:40000/callback","seal_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}`))
	f.Add([]byte(`{"connector":"corp","redirect_url":"http://evil.example/","seal_key":"AA=="}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeSSOConsoleLoginRequest(data)
		if err != nil {
			if req != nil {
				t.Fatal("request returned with an error")
			}
			return
		}
		if req.Connector == "" || len(req.SealKey) != 32 || CheckLoopbackRedirect(req.RedirectURL) != nil {
			t.Fatalf("accepted an invalid request: %+v", req)
		}
	})
}

// FuzzPasskeyAnswer: the body of a passkey ceremony's finish comes from
// anyone on the network and reaches auth's WebAuthn parsers (CBOR,
// base64url, JSON): neither the body decoder nor they may panic on it.
func FuzzPasskeyAnswer(f *testing.F) {
	f.Add([]byte(`{"challenge_id":"0123","webauthn":{"id":"AQ","rawId":"AQ","type":"public-key","response":{"clientDataJSON":"e30","authenticatorData":"AA","signature":"AA"}}}`))
	f.Add([]byte(`{"challenge_id":"0123","webauthn":{"id":"AQ","rawId":"AQ","type":"public-key","response":{"clientDataJSON":"e30","attestationObject":"oA"}}}`))
	f.Add([]byte(`{"challenge_id":"","webauthn":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var body mfaFinishBody
		if err := api.UnmarshalStrict(data, &body); err != nil {
			return
		}
		_, _ = protocol.ParseCredentialRequestResponseBytes(body.WebAuthn)
		_, _ = protocol.ParseCredentialCreationResponseBytes(body.WebAuthn)
	})
}
