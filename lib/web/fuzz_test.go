package web

import (
	"testing"
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
