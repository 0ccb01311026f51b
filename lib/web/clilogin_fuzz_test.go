package web

import "testing"

// FuzzDecodeWebConsoleLoginRequest: psh's start of a login on the web
// login page comes from anyone on the network; whatever the decoder
// accepts must carry a loopback redirect and a 32-byte seal key.
func FuzzDecodeWebConsoleLoginRequest(f *testing.F) {
	f.Add([]byte(`{"pub_key":"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFZ3oHBJZHprEDR6+ggYBVWS1ZCmbQjSpbpm0JrRMDIi","ttl_seconds":3600,"redirect_url":"http://127.0.0.1:40000/callback","seal_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}`))
	f.Add([]byte(`{"redirect_url":"http://evil.example/","seal_key":"AA=="}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeWebConsoleLoginRequest(data)
		if err != nil {
			if req != nil {
				t.Fatal("request returned with an error")
			}
			return
		}
		if len(req.SealKey) != 32 || CheckLoopbackRedirect(req.RedirectURL) != nil || req.TTLSeconds < 0 {
			t.Fatalf("accepted an invalid request: %+v", req)
		}
	})
}
