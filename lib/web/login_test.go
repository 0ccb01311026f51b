package web

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/pquerna/otp/totp"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// loginEnv is a real auth server on a memory backend behind a real web
// server on 127.0.0.1.
type loginEnv struct {
	clock *clockwork.FakeClock
	auth  *auth.Server
	store *services.Store
	url   string
	http  *http.Client
}

func quietLogger() logrus.FieldLogger {
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	return l.WithField("component", "web-test")
}

func newLoginEnv(t *testing.T) *loginEnv {
	t.Helper()
	clock := clockwork.NewFakeClockAt(time.Now().Truncate(time.Second))
	bk, err := memory.New(memory.Config{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { bk.Close() })
	store := services.NewStore(bk)
	as, err := auth.NewServer(auth.ServerConfig{
		Store: store, ClusterName: "c1", BcryptCost: bcrypt.MinCost, Deps: observe.Deps{Clock: clock, Logger: quietLogger()},
		Limits: auth.LoginLimits{MaxFailures: 3, MaxAddrFailures: 5, Window: time.Minute},
	})
	require.NoError(t, err)

	pair, err := LoadOrCreateTLS(t.TempDir(), "", "", nil, time.Now())
	require.NoError(t, err)
	s, err := NewServer(Config{
		ClusterName: "c1", ProxySSHAddr: "127.0.0.1:3023", Certificate: pair,
		Auth: as, SecondFactor: CachedSecondFactor(as, clock),
		Deps: observe.Deps{Clock: clock, Logger: quietLogger()},
	})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()

	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		require.NoError(t, s.Shutdown(context.Background()))
		require.NoError(t, <-done)
	})
	return &loginEnv{clock: clock, auth: as, store: store, url: "https://" + ln.Addr().String(), http: &http.Client{Transport: tr}}
}

func (e *loginEnv) post(t *testing.T, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := e.http.Post(e.url+"/webapi/ssh/certs", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	require.NoError(t, err)
	return resp, buf.Bytes()
}

func (e *loginEnv) ping(t *testing.T) webapi.PingResponse {
	t.Helper()
	resp, err := e.http.Get(e.url + "/webapi/ping")
	require.NoError(t, err)
	defer resp.Body.Close()
	var p webapi.PingResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
	return p
}

func loginBody(t *testing.T, user, password, otp string) string {
	t.Helper()
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	data, err := json.Marshal(webapi.SSHLoginRequest{User: user, Password: password, OTPToken: otp, PubKey: string(pub), TTLSeconds: 3600})
	require.NoError(t, err)
	return string(data)
}

func requireError(t *testing.T, resp *http.Response, body []byte, code int, contains string) {
	t.Helper()
	require.Equal(t, code, resp.StatusCode, string(body))
	var e webapi.ErrorResponse
	require.NoError(t, json.Unmarshal(body, &e), string(body))
	require.Contains(t, e.Error, contains)
}

func TestSSHCertsLogin(t *testing.T) {
	e := newLoginEnv(t)
	ctx := context.Background()
	_, err := e.auth.CreateUser(ctx, "alice", []byte("secret pass"), []string{"alice", "root"}, nil, false)
	require.NoError(t, err)
	require.Equal(t, webapi.SecondFactorOff, e.ping(t).SecondFactor)

	resp, body := e.post(t, loginBody(t, "alice", "secret pass", ""))
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var out webapi.SSHLoginResponse
	require.NoError(t, json.Unmarshal(body, &out))
	require.Equal(t, "alice", out.Username)
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(out.Cert))
	require.NoError(t, err)
	cert := pub.(*ssh.Certificate)
	require.Equal(t, []string{"alice", "root"}, cert.ValidPrincipals)
	require.Equal(t, uint64(e.clock.Now().Add(time.Hour).Unix()), cert.ValidBefore, "ttl_seconds honoured")
	require.Len(t, out.HostSigners, 1)
	require.Equal(t, "c1", out.HostSigners[0].ClusterName)
	require.Equal(t, e.auth.HostCAKeys(), out.HostSigners[0].CheckingKeys)

	t.Run("wrong password and unknown user look the same", func(t *testing.T) {
		resp, body := e.post(t, loginBody(t, "alice", "nope", ""))
		requireError(t, resp, body, http.StatusUnauthorized, "invalid credentials")
		resp, body2 := e.post(t, loginBody(t, "mallory", "nope", ""))
		requireError(t, resp, body2, http.StatusUnauthorized, "invalid credentials")
		require.Equal(t, string(body), string(body2))
	})

	t.Run("rate limited with Retry-After", func(t *testing.T) {
		e.clock.Advance(2 * time.Minute) // forget the failures above
		for range 3 {
			resp, body := e.post(t, loginBody(t, "bob", "nope", ""))
			requireError(t, resp, body, http.StatusUnauthorized, "invalid credentials")
		}
		resp, body := e.post(t, loginBody(t, "bob", "nope", ""))
		requireError(t, resp, body, http.StatusTooManyRequests, "too many failed login attempts")
		// The lockout's wait as auth named it (a structured field, not
		// parsed from the message): the window, 60 s.
		require.Equal(t, "60", resp.Header.Get("Retry-After"))
		// bob is locked at this address, not the address: alice's right
		// password from it still works...
		resp, body = e.post(t, loginBody(t, "alice", "secret pass", ""))
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		// ...until it keeps guessing at bob: then the address is locked
		// for everyone until the window passes.
		resp, body = e.post(t, loginBody(t, "bob", "nope", ""))
		requireError(t, resp, body, http.StatusTooManyRequests, "too many failed login attempts")
		resp, body = e.post(t, loginBody(t, "alice", "secret pass", ""))
		requireError(t, resp, body, http.StatusTooManyRequests, "too many")
		e.clock.Advance(2 * time.Minute)
		resp, body = e.post(t, loginBody(t, "alice", "secret pass", ""))
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	})

	t.Run("malformed requests", func(t *testing.T) {
		for _, tc := range []struct{ body, want string }{
			{`{`, "invalid login request"},
			{`{"user":"alice","password":"x","pub_key":"k","extra":1}`, `unknown field "extra"`},
			{`{"user":"alice","pub_key":"k"} {}`, "trailing data"},
			{`{"password":"x","pub_key":"k"}`, "missing user"},
			{`{"user":"alice","password":"x"}`, "missing pub_key"},
			{`{"user":"alice","pub_key":"k","ttl_seconds":-1}`, "ttl_seconds"},
			{`{"user":"alice","pub_key":"not a key"}`, "invalid public key"},
			{`[]`, "invalid login request"},
		} {
			resp, body := e.post(t, tc.body)
			requireError(t, resp, body, http.StatusBadRequest, tc.want)
		}
		resp, body := e.post(t, `{"user":"`+strings.Repeat("a", maxLoginBody)+`"}`)
		requireError(t, resp, body, http.StatusRequestEntityTooLarge, "too large")
	})
}

func TestSSHCertsOTP(t *testing.T) {
	e := newLoginEnv(t)
	ctx := context.Background()
	url, err := e.auth.CreateUser(ctx, "carol", []byte("pw"), []string{"carol"}, nil, true)
	require.NoError(t, err)
	require.Equal(t, webapi.SecondFactorOTP, e.ping(t).SecondFactor)
	key, err := otpKeyFromURL(url)
	require.NoError(t, err)

	resp, body := e.post(t, loginBody(t, "carol", "pw", ""))
	requireError(t, resp, body, http.StatusUnauthorized, "invalid credentials")
	resp, body = e.post(t, loginBody(t, "carol", "pw", "000000"))
	requireError(t, resp, body, http.StatusUnauthorized, "invalid credentials")
	code, err := totp.GenerateCode(key, e.clock.Now())
	require.NoError(t, err)
	resp, body = e.post(t, loginBody(t, "carol", "pw", code))
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
}

func TestSSHCertsWithoutAuth(t *testing.T) {
	pair, err := LoadOrCreateTLS(t.TempDir(), "", "", nil, time.Now())
	require.NoError(t, err)
	s, err := NewServer(Config{ClusterName: "c1", ProxySSHAddr: "127.0.0.1:3023", Certificate: pair})
	require.NoError(t, err)
	rec := newRecorder()
	req, err := http.NewRequest(http.MethodPost, "/webapi/ssh/certs", strings.NewReader("{}"))
	require.NoError(t, err)
	s.srv.Handler.ServeHTTP(rec, req)
	require.Equal(t, http.StatusNotImplemented, rec.code)
}

func TestRetryAfter(t *testing.T) {
	require.Equal(t, 10*time.Minute, retryAfter(authapi.RetryAfter(10*time.Minute, "locked")))
	require.Equal(t, 2*time.Second, retryAfter(trace.Wrap(authapi.RetryAfter(1500*time.Millisecond, "locked"))))
	// A refusal naming no wait (an older auth server's) gets the default;
	// the message is never parsed.
	require.Equal(t, defaultRetryAfter, retryAfter(trace.LimitExceeded("too many failed login attempts; try again in 10m0s")))
}
