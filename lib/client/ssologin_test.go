package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/nacl/box"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
)

// sealTo seals a login result as auth does.
func sealTo(t *testing.T, key []byte, resp authapi.SSHLoginResponse) string {
	t.Helper()
	data, err := json.Marshal(resp)
	require.NoError(t, err)
	var pub [32]byte
	copy(pub[:], key)
	sealed, err := box.SealAnonymous(nil, data, &pub, rand.Reader)
	require.NoError(t, err)
	return base64.RawURLEncoding.EncodeToString(sealed)
}

func getPage(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// TestSSOHandoffTakesOneResultSealedToItsKey: a result sealed to another
// psh's key is refused (and psh keeps waiting for its own); its own is
// taken once; a replay is refused, and after the listener stopped nobody
// answers at all.
func TestSSOHandoffTakesOneResultSealedToItsKey(t *testing.T) {
	h, err := NewSSOHandoff()
	require.NoError(t, err)
	redirect, stop, err := h.Listen("127.0.0.1:0")
	require.NoError(t, err)
	defer stop()
	require.Regexp(t, `^http://127\.0\.0\.1:\d+/callback$`, redirect)

	other, err := NewSSOHandoff()
	require.NoError(t, err)
	result := authapi.SSHLoginResponse{Username: "alice", Cert: []byte("ssh-ed25519-cert-v01@openssh.com AAAA")}
	code, body := getPage(t, redirect+"?response="+sealTo(t, other.SealKey(), result))
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "not for this psh")

	code, _ = getPage(t, redirect+"?response=not-base64!")
	require.Equal(t, http.StatusBadRequest, code)

	own := redirect + "?response=" + sealTo(t, h.SealKey(), result)
	code, body = getPage(t, own)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "Logged in, you can close this tab")
	got, err := h.Wait(context.Background(), clockwork.NewFakeClock(), time.Minute)
	require.NoError(t, err)
	require.Equal(t, "alice", got.Username)

	code, body = getPage(t, own)
	require.Equal(t, http.StatusGone, code, "a replay is refused")
	require.Contains(t, body, "only one")
	stop()
	_, err = http.Get(own)
	require.Error(t, err, "the listener stopped")
}

// TestSSOHandoffTimeout: psh gives up after the timeout, saying what to
// do, and mentions results it refused.
func TestSSOHandoffTimeout(t *testing.T) {
	h, err := NewSSOHandoff()
	require.NoError(t, err)
	redirect, stop, err := h.Listen("127.0.0.1:0")
	require.NoError(t, err)
	defer stop()
	other, err := NewSSOHandoff()
	require.NoError(t, err)
	code, _ := getPage(t, redirect+"?response="+sealTo(t, other.SealKey(), authapi.SSHLoginResponse{Username: "mallory", Cert: []byte("x")}))
	require.Equal(t, http.StatusForbidden, code)

	clock := clockwork.NewFakeClock()
	errc := make(chan error, 1)
	go func() {
		_, err := h.Wait(context.Background(), clock, DefaultSSOTimeout)
		errc <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(DefaultSSOTimeout)
	err = <-errc
	require.ErrorContains(t, err, "no login came back from the browser within 3m0s")
	require.ErrorContains(t, err, "run psh login again")
	require.ErrorContains(t, err, "1 login result(s) not for this psh were refused")
}

// fakeSSOProxy is a proxy whose auth signs the key psh sends and seals
// the result to psh's key, and a browser that follows the identity
// provider's URL back to psh's loopback listener.
type fakeSSOProxy struct {
	t  *testing.T
	ca *testCA
	mu sync.Mutex
	// req is psh's console login request.
	req webapi.SSOConsoleLoginRequest
}

func (p *fakeSSOProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/webapi/ping":
		fmt.Fprint(w, `{"cluster_name":"c1","proxy_ssh_addr":"0.0.0.0:3023","second_factor":"off","server_version":"dev","connectors":[{"name":"corp","type":"oidc","display":"Corp"}]}`)
	case "/webapi/oidc/login/console":
		p.mu.Lock()
		defer p.mu.Unlock()
		if err := json.NewDecoder(r.Body).Decode(&p.req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		// The "identity provider" URL carries the loopback redirect, as
		// the state does at a real one.
		fmt.Fprintf(w, `{"auth_url":"https://idp.example/authorize?client=%s"}`, url.QueryEscape(p.req.RedirectURL))
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// browse plays the browser: after the identity provider's login, the
// proxy redirects to psh's listener with the sealed result.
func (p *fakeSSOProxy) browse(authURL string) (int, string) {
	u, err := url.Parse(authURL)
	require.NoError(p.t, err)
	p.mu.Lock()
	req := p.req
	p.mu.Unlock()
	pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(req.PubKey))
	require.NoError(p.t, err)
	cert := p.ca.sign(p.t, pk, ssh.UserCert, []string{"alice"}, time.Now().Add(time.Hour))
	result := authapi.SSHLoginResponse{
		Username: "alice@corp.example", Cert: ssh.MarshalAuthorizedKey(cert),
		HostSigners: []authapi.HostSigner{{ClusterName: "c1", CheckingKeys: []string{string(trimNL(ssh.MarshalAuthorizedKey(p.ca.signer.PublicKey())))}}},
	}
	return getPage(p.t, u.Query().Get("client")+"?response="+sealTo(p.t, req.SealKey, result))
}

// TestSSOLoginSavesProfileAsPasswordLogin: psh login --auth prints the
// provider's URL, takes the result from its listener and stores the same
// profile, key, certificate and known_hosts as a password login.
func TestSSOLoginSavesProfileAsPasswordLogin(t *testing.T) {
	p := &fakeSSOProxy{t: t, ca: newTestCA(t)}
	srv := httptest.NewTLSServer(p)
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "https://")
	home := t.TempDir()
	var out syncBuffer
	browsed := make(chan string, 1)
	res, err := SSOLogin(context.Background(), SSOLoginConfig{
		Web: WebConfig{Proxy: addr, Insecure: true}, Connector: "corp", TTL: time.Hour, Store: NewStore(home), Out: &out,
		OpenBrowser: func(u string) error {
			go func() {
				code, body := p.browse(u)
				browsed <- fmt.Sprint(code, " ", body)
			}()
			return nil
		},
	})
	require.NoError(t, err)
	require.Contains(t, <-browsed, "200 ")
	require.Regexp(t, regexp.MustCompile(`^If the browser does not open, visit: https://idp\.example/authorize\?client=http%3A%2F%2F127\.0\.0\.1%3A\d+%2Fcallback\n$`), out.String())
	require.Equal(t, "alice@corp.example", res.Profile.User)
	require.Equal(t, "127.0.0.1:3023", res.Profile.ProxySSH)
	require.Equal(t, int64(3600), p.req.TTLSeconds)
	require.Len(t, p.req.SealKey, 32)

	creds, err := NewStore(home).Credentials(time.Now())
	require.NoError(t, err)
	require.Equal(t, "alice@corp.example", creds.Profile.User)
	require.Equal(t, addr, creds.Profile.Proxy)

	// An unknown connector is told with the ones the proxy has, before any
	// browser round trip.
	_, err = SSOLogin(context.Background(), SSOLoginConfig{Web: WebConfig{Proxy: addr, Insecure: true}, Connector: "crop", Store: NewStore(t.TempDir())})
	require.ErrorContains(t, err, `no single sign-on connector "crop" (it has: corp)`)
}

// syncBuffer is a bytes.Buffer safe for the writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
