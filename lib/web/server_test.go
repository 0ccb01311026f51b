package web

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/postern-dev/postern/lib/api/webapi"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSelfSignedPairIsKept(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	a, err := LoadOrCreateTLS(dir, "", "", []string{"proxy.example.com"}, now)
	require.NoError(t, err)
	b, err := LoadOrCreateTLS(dir, "", "", nil, now)
	require.NoError(t, err)
	require.Equal(t, a.Certificate[0], b.Certificate[0], "second start reuses the pair")
	st, err := os.Stat(filepath.Join(dir, SelfSignedKeyFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	leaf, err := x509.ParseCertificate(a.Certificate[0])
	require.NoError(t, err)
	require.Contains(t, leaf.DNSNames, "proxy.example.com")

	require.NoError(t, os.WriteFile(filepath.Join(dir, SelfSignedCertFile), []byte("garbage"), 0o600))
	_, err = LoadOrCreateTLS(dir, "", "", nil, now)
	require.ErrorContains(t, err, dir)

	_, err = LoadOrCreateTLS(dir, "/nonexistent.crt", "/nonexistent.key", nil, now)
	require.ErrorContains(t, err, "/nonexistent.crt")
}

func TestPing(t *testing.T) {
	pair, err := LoadOrCreateTLS(t.TempDir(), "", "", nil, time.Now())
	require.NoError(t, err)
	s, err := NewServer(Config{ClusterName: "c1", ProxySSHAddr: "127.0.0.1:3023", Certificate: pair})
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
	clt := &http.Client{Transport: tr}
	resp, err := clt.Get("https://" + ln.Addr().String() + "/webapi/ping")
	require.NoError(t, err)
	var ping webapi.PingResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ping))
	resp.Body.Close()
	require.Equal(t, webapi.PingResponse{ClusterName: "c1", ProxySSHAddr: "127.0.0.1:3023", SecondFactor: "off", ServerVersion: "dev"}, ping)
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'self'")
	tr.CloseIdleConnections()

	require.NoError(t, s.Shutdown(context.Background()))
	require.NoError(t, <-done)
}
