package auth

import (
	"bytes"
	"context"
	"crypto/x509"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend"
)

// FuzzParseJoinPublicKey feeds the TLS public key of a join request (sent
// by an unauthenticated peer) to its parser.
func FuzzParseJoinPublicKey(f *testing.F) {
	_, pemKey, err := generateTLSKey()
	if err != nil {
		f.Fatal(err)
	}
	key, err := parseTLSPrivateKey(pemKey)
	if err != nil {
		f.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(der)
	f.Fuzz(func(t *testing.T, data []byte) {
		pub, err := parsePublicKey(data)
		if err != nil {
			if !trace.IsBadParameter(err) {
				t.Fatalf("want BadParameter, got %v", err)
			}
			return
		}
		if _, err := x509.MarshalPKIXPublicKey(pub); err != nil {
			t.Fatalf("accepted a key that does not marshal: %v", err)
		}
	})
}

// FuzzWatchStream feeds a watch stream (from the network) to the client's
// reader: it must never panic, and must stop with Done at the end of input.
func FuzzWatchStream(f *testing.F) {
	f.Add([]byte(`{"type":"init"}` + "\n" + `{"type":"put","key":"/nodes/c/u","value":"e30="}` + "\n"))
	f.Add([]byte(`{"type":"error","error":"boom"}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx, cancel := context.WithCancel(context.Background())
		w := &remoteWatcher{events: make(chan backend.Event, 1024), done: make(chan struct{}), cancel: cancel}
		w.wg.Add(1)
		resp := &http.Response{Body: io.NopCloser(bytes.NewReader(data))}
		go func() {
			// Drain so that run never blocks on a full queue.
			for {
				select {
				case <-w.events:
				case <-w.done:
					return
				}
			}
		}()
		w.run(ctx, resp)
		<-w.done
		if w.Error() == nil {
			t.Fatal("a stream that ended by itself must leave an error")
		}
		cancel()
	})
}

// FuzzErrorResponse feeds an error body (from the network) to the client's
// error decoder: it must always yield an error and never panic.
func FuzzErrorResponse(f *testing.F) {
	f.Add(403, []byte(`{"error":{"kind":"access_denied","message":"no"}}`))
	f.Add(500, []byte(`not json`))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		resp := &http.Response{StatusCode: status, Body: io.NopCloser(bytes.NewReader(body))}
		if authapi.ReadErrorResponse(resp) == nil {
			t.Fatal("nil error")
		}
	})
}

// FuzzParseIdentityFile feeds `pctl --identity FILE` contents to the parser.
func FuzzParseIdentityFile(f *testing.F) {
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		id, err := ParseIdentityFile(data)
		if err == nil && (id.TLSLeaf == nil || id.TLSCAPool == nil) {
			t.Fatal("parsed identity without its TLS parts")
		}
	})
}

// FuzzParseCallbackQuery feeds the query an identity provider (or
// whoever shaped the browser's URL) sent to the callback parser: it
// never panics, refuses with BadParameter, and what it accepts has a
// state and a code or an error, each given once.
func FuzzParseCallbackQuery(f *testing.F) {
	for _, s := range []string{
		"state=abc&code=def",
		"state=abc&error=access_denied&error_description=no",
		"state=a&state=b&code=c",
		"code=x",
		"state=%zz&code=1",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := ParseCallbackQuery(raw)
		if err != nil {
			if !trace.IsBadParameter(err) {
				t.Fatalf("want BadParameter, got %v", err)
			}
			return
		}
		if q.State == "" || (q.Code == "" && q.Error == "") {
			t.Fatalf("accepted %q as %+v", raw, q)
		}
	})
}

// FuzzCheckReturnTo: whatever return_to it accepts is a path on the
// proxy's own origin: resolved against the proxy's URL it never leaves
// that host.
func FuzzCheckReturnTo(f *testing.F) {
	for _, s := range []string{"/", "/web/nodes?x=1#y", "//evil.example", "/\\evil.example", "https://evil.example", "/%2F%2Fevil", "/\t/evil", ""} {
		f.Add(s)
	}
	base, _ := url.Parse("https://proxy.example.test/webapi/oidc/callback")
	f.Fuzz(func(t *testing.T, p string) {
		if err := CheckReturnTo(p); err != nil {
			if !trace.IsBadParameter(err) {
				t.Fatalf("want BadParameter, got %v", err)
			}
			return
		}
		if p == "" {
			return
		}
		u, err := base.Parse(p)
		if err != nil {
			t.Fatalf("accepted %q, which does not parse: %v", p, err)
		}
		if u.Host != base.Host || u.Scheme != base.Scheme {
			t.Fatalf("accepted %q, which leads to %s", p, u)
		}
	})
}

// FuzzCheckClientRedirectURL: what it accepts is plain http to a
// loopback host.
func FuzzCheckClientRedirectURL(f *testing.F) {
	for _, s := range []string{"http://127.0.0.1:1234/cb", "http://[::1]:1/", "http://localhost:80/", "http://127.0.0.1:80@evil:1/", "https://127.0.0.1:1/", "http://127.0.0.1/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if CheckClientRedirectURL(raw) != nil {
			return
		}
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("accepted %q, which does not parse", raw)
		}
		if h := u.Hostname(); u.Scheme != "http" || (h != "127.0.0.1" && h != "::1" && h != "localhost") {
			t.Fatalf("accepted %q (host %q)", raw, h)
		}
	})
}
