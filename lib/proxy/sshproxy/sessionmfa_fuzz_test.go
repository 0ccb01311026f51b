package sshproxy

import (
	"net"
	"net/url"
	"testing"
)

// FuzzDecodeSessionMFACertRequest: psh's per-session certificate request
// comes from any holder of a user certificate; whatever the decoder
// accepts names a target and a login and carries exactly one of a code
// and a loopback hand-off with a 32-byte seal key, or neither for a check.
func FuzzDecodeSessionMFACertRequest(f *testing.F) {
	f.Add([]byte(`{"target":"db","login":"root","otp":"123456","public_key":"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFZ3oHBJZHprEDR6+ggYBVWS1ZCmbQjSpbpm0JrRMDIi"}`))
	f.Add([]byte(`{"target":"db","login":"root","check":true,"otp":"1","public_key":"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFZ3oHBJZHprEDR6+ggYBVWS1ZCmbQjSpbpm0JrRMDIi"}`))
	f.Add([]byte(`{"target":"db","login":"root","browser":{"redirect_url":"http://evil.example/","seal_key":"AA=="}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeSessionMFACertRequest(data)
		if err != nil {
			if req != nil {
				t.Fatal("request returned with an error")
			}
			return
		}
		if req.Check && (req.OTP != "" || req.Browser != nil) {
			t.Fatalf("accepted a check with a factor: %+v", req)
		}
		if req.Target == "" || req.Login == "" || (!req.Check && (req.OTP == "") == (req.Browser == nil)) {
			t.Fatalf("accepted an invalid request: %+v", req)
		}
		if b := req.Browser; b != nil {
			u, err := url.Parse(b.RedirectURL)
			if err != nil || len(b.SealKey) != 32 {
				t.Fatalf("accepted an invalid hand-off: %+v", b)
			}
			if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
				t.Fatalf("accepted a hand-off off this machine: %q", b.RedirectURL)
			}
		}
	})
}
