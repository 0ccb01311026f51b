package auth

import (
	"bytes"
	"context"
	"crypto/x509"
	"io"
	"net/http"
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
