package integration

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/utils"
	"github.com/postern-dev/postern/lib/web"
)

// issuedCert is a key and a certificate the cluster's user CA signed for it.
type issuedCert struct {
	key  ssh.Signer
	cert *ssh.Certificate
}

// issueCert asks auth (as the admin) for a certificate of user.
func issueCert(t *testing.T, clt *auth.Client, user string, ttl time.Duration) issuedCert {
	t.Helper()
	priv, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	key, err := ssh.ParsePrivateKey(priv)
	require.NoError(t, err)
	certBytes, err := clt.GenerateUserCert(context.Background(), authapi.UserCertRequest{User: user, PublicKey: pub, TTL: ttl})
	require.NoError(t, err)
	parsed, _, _, _, err := ssh.ParseAuthorizedKey(certBytes)
	require.NoError(t, err)
	return issuedCert{key: key, cert: parsed.(*ssh.Certificate)}
}

// signer presents cert (which may be forged or tampered) with the key.
func (ic issuedCert) signer(t *testing.T, cert *ssh.Certificate) ssh.Signer {
	t.Helper()
	if cert == nil {
		cert = ic.cert
	}
	s, err := ssh.NewCertSigner(cert, ic.key)
	require.NoError(t, err)
	return s
}

// jumpWith does what ssh -J does with the given credentials: authenticate
// to the proxy, open direct-tcpip to target, authenticate to the node as
// login and run `true`. The first error is returned.
func (c *allInOne) jumpWith(t *testing.T, s ssh.Signer, login, target string) (*ssh.Client, error) {
	t.Helper()
	cfg := c.clientConfig(t)
	cfg.Auth = []ssh.AuthMethod{ssh.PublicKeys(s)}
	cfg.User = login
	cfg.Timeout = 20 * time.Second
	proxy, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), cfg)
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	t.Cleanup(func() { proxy.Close() })
	conn, err := proxy.Dial("tcp", target)
	if err != nil {
		return nil, fmt.Errorf("direct-tcpip: %w", err)
	}
	sconn, chans, reqs, err := ssh.NewClientConn(conn, target, cfg)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	clt := ssh.NewClient(sconn, chans, reqs)
	t.Cleanup(func() { clt.Close() })
	if _, err := run(t, clt, "true"); err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	return clt, nil
}

// createRole writes a role file and creates it with pctl.
func createRole(t *testing.T, dataDir, yaml string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "role.yaml")
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
	mustPctl(t, dataDir, "", "create", "-f", path)
}

// webClient trusts the cluster's self-signed web certificate.
func (c *allInOne) webClient(t *testing.T) *http.Client {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(c.dataDir, "web", web.SelfSignedCertFile))
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// TestSecurityDenials walks the ways in that must stay shut. Each row is an
// attempt with a real client against a running cluster; each must be
// refused, and none may reach a shell (where the refusal belongs to the
// proxy, the node's port sees no connection at all).
func TestSecurityDenials(t *testing.T) {
	c := newAllInOne(t)
	clt := adminClient(t, c.dataDir, c.p)
	nodePort := portOf(t, c.p.Addr(service.ListenerNode))
	nodeTarget := net.JoinHostPort(c.hostname, "0")

	createRole(t, c.dataDir, fmt.Sprintf("kind: role\nmetadata: {name: prod-only}\nspec:\n  logins: [%s]\n  node_labels: {env: prod}\n  forward_agent: true\n  port_forwarding: true\n", c.login))
	createRole(t, c.dataDir, fmt.Sprintf("kind: role\nmetadata: {name: no-forwarding}\nspec:\n  logins: [%s]\n  node_labels: {'*': '*'}\n", c.login))
	createRole(t, c.dataDir, fmt.Sprintf("kind: role\nmetadata: {name: doomed}\nspec:\n  logins: [%s]\n  node_labels: {'*': '*'}\n", c.login))
	mustPctl(t, c.dataDir, "password-carol\n", "users", "add", "carol", "--logins", c.login, "--roles", "prod-only")
	mustPctl(t, c.dataDir, "password-dave\n", "users", "add", "dave", "--logins", c.login, "--roles", "no-forwarding")
	mustPctl(t, c.dataDir, "password-eve\n", "users", "add", "eve", "--logins", c.login, "--roles", "doomed")
	mustPctl(t, c.dataDir, "password-frank\n", "users", "add", "frank", "--logins", c.login)

	alice := issueCert(t, clt, "alice", 10*time.Minute)
	// The control: alice's own certificate gets in.
	_, err := c.jumpWith(t, alice.signer(t, nil), c.login, nodeTarget)
	require.NoError(t, err)

	// denyAtProxy: refused by the proxy's authentication, and the node's
	// port sees nothing.
	denyAtProxy := func(t *testing.T, s ssh.Signer) {
		t.Helper()
		before := tcpConnsOnPort(t, nodePort)
		_, err := c.jumpWith(t, s, c.login, nodeTarget)
		require.Error(t, err)
		require.ErrorContains(t, err, "proxy: ssh: handshake failed")
		require.ErrorContains(t, err, "unable to authenticate")
		require.Empty(t, newConns(before, tcpConnsOnPort(t, nodePort)), "nothing may reach the node")
	}

	t.Run("expired certificate", func(t *testing.T) {
		short := issueCert(t, clt, "alice", time.Second)
		expiry := time.Unix(int64(short.cert.ValidBefore), 0)
		require.WithinDuration(t, time.Now().Add(time.Second), expiry, 2*time.Second, "auth honoured the short TTL")
		// The condition awaited is the wall clock passing ValidBefore
		// (second resolution): x/crypto checks certificates against it.
		time.Sleep(time.Until(expiry) + 1100*time.Millisecond)
		denyAtProxy(t, short.signer(t, nil))
	})

	t.Run("certificate from another CA", func(t *testing.T) {
		_, caKey, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		caSigner, err := ssh.NewSignerFromKey(caKey)
		require.NoError(t, err)
		forged := *alice.cert // same principals and extensions, other signer
		forged.Signature = nil
		require.NoError(t, forged.SignCert(rand.Reader, caSigner))
		denyAtProxy(t, alice.signer(t, &forged))
	})

	t.Run("tampered certificate", func(t *testing.T) {
		tampered := *alice.cert
		sig := *alice.cert.Signature
		sig.Blob = append([]byte(nil), sig.Blob...)
		sig.Blob[len(sig.Blob)/2] ^= 0x01
		tampered.Signature = &sig
		denyAtProxy(t, alice.signer(t, &tampered))

		// Widening the principals after signing is tampering too.
		widened := *alice.cert
		widened.ValidPrincipals = append(append([]string(nil), widened.ValidPrincipals...), "root", "postern-extra")
		denyAtProxy(t, alice.signer(t, &widened))
	})

	t.Run("unknown user and roles", func(t *testing.T) {
		// A genuine certificate whose user and role have since been
		// deleted: it names nobody the cluster knows.
		eve := issueCert(t, clt, "eve", 10*time.Minute)
		mustPctl(t, c.dataDir, "", "users", "rm", "eve")
		require.NoError(t, clt.DeleteRole(context.Background(), "doomed"))
		before := tcpConnsOnPort(t, nodePort)
		_, err := c.jumpWith(t, eve.signer(t, nil), c.login, nodeTarget)
		require.Error(t, err)
		// The proxy may refuse the login or the route (today: the route,
		// as "not found", since no role grants the node); either way it
		// must not get as far as the node.
		require.True(t, strings.HasPrefix(err.Error(), "proxy:") || strings.HasPrefix(err.Error(), "direct-tcpip:"), "refused too late: %v", err)
		require.Empty(t, newConns(before, tcpConnsOnPort(t, nodePort)), "nothing may reach the node")
	})

	t.Run("login not in the certificate", func(t *testing.T) {
		// The proxy leg uses a valid login, as OpenSSH's -J does with the
		// local user name; the node must refuse the login it is asked for.
		s := alice.signer(t, nil)
		cfg := c.clientConfig(t)
		cfg.Auth = []ssh.AuthMethod{ssh.PublicKeys(s)}
		proxy, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), cfg)
		require.NoError(t, err)
		defer proxy.Close()
		conn, err := proxy.Dial("tcp", nodeTarget)
		require.NoError(t, err)
		defer conn.Close()
		cfg.User = "postern-nologin"
		_, _, _, err = ssh.NewClientConn(conn, nodeTarget, cfg)
		require.ErrorContains(t, err, "unable to authenticate")

		// And directly on the proxy as that login.
		_, err = c.jumpWith(t, s, "postern-nologin", nodeTarget)
		require.Error(t, err)
		require.NotContains(t, err.Error(), "session:")
	})

	t.Run("node labels not allowed", func(t *testing.T) {
		carol := issueCert(t, clt, "carol", 10*time.Minute)
		before := tcpConnsOnPort(t, nodePort)
		_, err := c.jumpWith(t, carol.signer(t, nil), c.login, nodeTarget)
		require.ErrorContains(t, err, "direct-tcpip:")
		// Not "access denied": the user may not learn that the node exists.
		require.Contains(t, unquote(err.Error()), `node "node-1" not found in cluster "it"`)

		cfg := c.clientConfig(t)
		cfg.Auth = []ssh.AuthMethod{ssh.PublicKeys(carol.signer(t, nil))}
		proxy, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), cfg)
		require.NoError(t, err)
		defer proxy.Close()
		s, err := proxy.NewSession()
		require.NoError(t, err)
		defer s.Close()
		stdout, err := s.StdoutPipe()
		require.NoError(t, err)
		stderr, err := s.StderrPipe()
		require.NoError(t, err)
		// Whether or not the request itself is acknowledged, the channel
		// must carry no byte of the node and say "not found" on stderr.
		subErr := s.RequestSubsystem("proxy:" + nodeTarget)
		n, _ := io.Copy(io.Discard, stdout)
		require.Zero(t, n, "the node's banner leaked through the subsystem")
		msg, _ := io.ReadAll(stderr)
		require.Contains(t, string(msg), `node "node-1" not found in cluster "it"`, "request error: %v", subErr)
		require.Empty(t, newConns(before, tcpConnsOnPort(t, nodePort)), "the proxy must not dial the node")
	})

	t.Run("port forwarding not allowed", func(t *testing.T) {
		dave := issueCert(t, clt, "dave", 10*time.Minute)
		node, err := c.jumpWith(t, dave.signer(t, nil), c.login, nodeTarget)
		require.NoError(t, err, "dave may log in")
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		accepted := make(chan struct{}, 1)
		go func() {
			if conn, err := ln.Accept(); err == nil {
				accepted <- struct{}{}
				conn.Close()
			}
		}()
		_, err = node.Dial("tcp", ln.Addr().String())
		require.ErrorContains(t, err, "port forwarding is not allowed", "ssh -L must be refused, visibly")
		_, err = node.Listen("tcp", "127.0.0.1:0")
		require.Error(t, err, "ssh -R must be refused")
		ln.Close()
		select {
		case <-accepted:
			t.Fatal("the node dialed the forward target")
		default:
		}

		t.Run("agent forwarding not allowed", func(t *testing.T) {
			s, err := node.NewSession()
			require.NoError(t, err)
			defer s.Close()
			require.Error(t, agent.RequestAgentForwarding(s), "auth-agent-req must be refused")
			out, err := s.CombinedOutput("echo ${SSH_AUTH_SOCK:-none}")
			require.NoError(t, err)
			require.Equal(t, "none\n", string(out))
		})
	})

	t.Run("websocket without token or from a foreign origin", func(t *testing.T) {
		hc := c.webClient(t)
		webAddr := c.p.Addr(service.ListenerWeb).String()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		params := url.QueryEscape(fmt.Sprintf(`{"host":%q,"login":%q,"cols":80,"rows":24}`, c.hostname, c.login))
		termURL := "wss://" + webAddr + "/webapi/terminal?params=" + params
		before := tcpConnsOnPort(t, nodePort)

		// No cookie, and a first message without a token.
		ws, _, err := websocket.Dial(ctx, termURL, &websocket.DialOptions{HTTPClient: hc, Subprotocols: []string{web.TerminalSubprotocol}})
		if err == nil {
			require.NoError(t, ws.Write(ctx, websocket.MessageText, []byte(`{}`)))
			_, _, err = ws.Read(ctx)
			require.Equal(t, websocket.StatusPolicyViolation, websocket.CloseStatus(err), "%v", err)
			ws.CloseNow()
		}

		// A real session, but the upgrade comes from another site's page.
		resp, err := hc.Post("https://"+webAddr+"/webapi/sessions", "application/json",
			strings.NewReader(`{"user":"alice","password":"correct horse battery","otp_token":""}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var cookie string
		for _, ck := range resp.Cookies() {
			if ck.Name == web.SessionCookieName {
				cookie = ck.Value
			}
		}
		require.NotEmpty(t, cookie)
		_, resp, err = websocket.Dial(ctx, termURL, &websocket.DialOptions{
			HTTPClient:   hc,
			HTTPHeader:   http.Header{"Cookie": {web.SessionCookieName + "=" + cookie}, "Origin": {"https://evil.example"}},
			Subprotocols: []string{web.TerminalSubprotocol},
		})
		require.Error(t, err)
		require.NotNil(t, resp)
		require.Equal(t, http.StatusForbidden, resp.StatusCode)

		// The cookie without the bearer token in the first message.
		ws, _, err = websocket.Dial(ctx, termURL, &websocket.DialOptions{
			HTTPClient:   hc,
			HTTPHeader:   http.Header{"Cookie": {web.SessionCookieName + "=" + cookie}},
			Subprotocols: []string{web.TerminalSubprotocol},
		})
		require.NoError(t, err)
		require.NoError(t, ws.Write(ctx, websocket.MessageText, []byte(`{"token":"not-the-token"}`)))
		_, _, err = ws.Read(ctx)
		require.Equal(t, websocket.StatusPolicyViolation, websocket.CloseStatus(err), "%v", err)
		ws.CloseNow()

		require.Empty(t, newConns(before, tcpConnsOnPort(t, nodePort)), "no terminal may reach the node")
	})

	// Last: it trips the per-address limiter for the rest of the cluster's
	// life.
	t.Run("wrong password is rate limited", func(t *testing.T) {
		hc := c.webClient(t)
		_, pub, err := utils.GenerateKeyPair()
		require.NoError(t, err)
		body := fmt.Sprintf(`{"user":"frank","password":"wrong","otp_token":"","pub_key":%q,"ttl_seconds":600}`, strings.TrimSpace(string(pub)))
		var codes []int
		for i := 0; i < 20; i++ {
			resp, err := hc.Post("https://"+c.p.Addr(service.ListenerWeb).String()+"/webapi/ssh/certs", "application/json", strings.NewReader(body))
			require.NoError(t, err)
			resp.Body.Close()
			codes = append(codes, resp.StatusCode)
			if resp.StatusCode == http.StatusTooManyRequests {
				require.NotEmpty(t, resp.Header.Get("Retry-After"))
				break
			}
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		}
		require.Equal(t, http.StatusTooManyRequests, codes[len(codes)-1], "never rate limited: %v", codes)
		require.LessOrEqual(t, len(codes), 11, "rate limited too late: %v", codes)
		// The right password is refused too while the limit holds: guessing
		// cannot continue by luck.
		good := strings.Replace(body, `"wrong"`, `"password-frank"`, 1)
		resp, err := hc.Post("https://"+c.p.Addr(service.ListenerWeb).String()+"/webapi/ssh/certs", "application/json", strings.NewReader(good))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	})

	// Every denial above left an audit record an operator can find.
	t.Run("denials are audited", func(t *testing.T) {
		want := []struct {
			typ, user, reason string
		}{
			{events.AuthFailed, "frank", "invalid credentials"},
			{events.AccessDenied, "carol", "may not reach node"},
			{events.AccessDenied, "", "not signed by the user CA"},
			{events.AccessDenied, "alice", "expired"},
		}
		require.Eventually(t, func() bool {
			out, _, err := pctl(t, c.dataDir, "", "events", "ls", "--format", "json")
			if err != nil {
				return false
			}
			for _, w := range want {
				found := false
				for _, line := range strings.Split(out, "\n") {
					var e events.Event
					if json.Unmarshal([]byte(line), &e) != nil || e.Type != w.typ {
						continue
					}
					reason, _ := e.Fields[events.FieldReason].(string)
					if (w.user == "" || e.User == w.user) && strings.Contains(reason, w.reason) {
						found = true
						break
					}
				}
				if !found {
					t.Logf("no %s event for %q with reason %q yet", w.typ, w.user, w.reason)
					return false
				}
			}
			return true
		}, 20*time.Second, 200*time.Millisecond)
	})
}
