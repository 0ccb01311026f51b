package client

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/proxyapi"
)

func TestParseForwardSpec(t *testing.T) {
	for in, want := range map[string]ForwardSpec{
		"8080:db:5432":              {BindHost: "127.0.0.1", BindPort: "8080", Host: "db", HostPort: "5432"},
		"0.0.0.0:8080:db:5432":      {BindHost: "0.0.0.0", BindPort: "8080", Host: "db", HostPort: "5432"},
		"localhost:1:[::1]:22":      {BindHost: "127.0.0.1", BindPort: "1", Host: "::1", HostPort: "22"},
		"[::1]:8080:10.0.0.1:80":    {BindHost: "::1", BindPort: "8080", Host: "10.0.0.1", HostPort: "80"},
		"*:8080:example.com:443":    {BindHost: "", BindPort: "8080", Host: "example.com", HostPort: "443"},
		":8080:example.com:443":     {BindHost: "127.0.0.1", BindPort: "8080", Host: "example.com", HostPort: "443"},
		"127.0.0.1:9:127.0.0.1:100": {BindHost: "127.0.0.1", BindPort: "9", Host: "127.0.0.1", HostPort: "100"},
	} {
		got, err := ParseForwardSpec(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "8080", "8080:db", "a:b:c:d:e", "[::1:80:db:1", "8080::5432", "[::1]x:1:h:2"} {
		_, err := ParseForwardSpec(bad)
		require.Error(t, err, bad)
	}
}

func TestNormalizeProxyAddr(t *testing.T) {
	for in, want := range map[string]string{
		"proxy.example.com":      "proxy.example.com:3080",
		"proxy.example.com:443":  "proxy.example.com:443",
		"[::1]":                  "[::1]:3080",
		"[::1]:3080":             "[::1]:3080",
		"127.0.0.1":              "127.0.0.1:3080",
		"proxy.example.com:3080": "proxy.example.com:3080",
	} {
		got, err := NormalizeProxyAddr(in)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	for _, bad := range []string{"", "https://proxy", "proxy/x"} {
		_, err := NormalizeProxyAddr(bad)
		require.Error(t, err, bad)
	}
	require.Equal(t, "proxy.example.com:3023", proxySSHAddr("proxy.example.com:3080", "0.0.0.0:3023"))
	require.Equal(t, "proxy.example.com:3023", proxySSHAddr("proxy.example.com:3080", ":3023"))
	require.Equal(t, "10.0.0.1:3023", proxySSHAddr("proxy.example.com:3080", "10.0.0.1:3023"))
}

// scripted answers prompts from a list.
type scripted []string

func (s *scripted) Secret(string) (string, error) {
	if len(*s) == 0 {
		return "", nil
	}
	v := (*s)[0]
	*s = (*s)[1:]
	return v, nil
}

func TestWebClientNotPostern(t *testing.T) {
	for name, h := range map[string]http.HandlerFunc{
		"html": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, "<html></html>")
		},
		"json but not ping": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"hello":"world"}`)
		},
		"404": func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) },
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewTLSServer(h)
			defer srv.Close()
			addr := strings.TrimPrefix(srv.URL, "https://")
			home := t.TempDir()
			_, err := Login(context.Background(), LoginConfig{
				Web: WebConfig{Proxy: addr, Insecure: true}, User: "alice", Store: NewStore(home), Prompt: &scripted{"pw"},
			})
			require.ErrorContains(t, err, addr+" is not a Postern proxy")
			entries, err := os.ReadDir(home)
			require.NoError(t, err)
			require.Empty(t, entries, "nothing written")
		})
	}
}

func TestWebClientTLS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"cluster_name":"c1","proxy_ssh_addr":"127.0.0.1:3023","second_factor":"off","server_version":"dev"}`)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "https://")

	wc, err := NewWebClient(WebConfig{Proxy: addr})
	require.NoError(t, err)
	_, err = wc.Ping(context.Background())
	require.ErrorContains(t, err, "does not verify")
	require.ErrorContains(t, err, "--insecure")
	require.True(t, trace.IsAccessDenied(err))
	wc.Close()

	// --cacert with the server's certificate verifies.
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, pemCert(srv.Certificate().Raw), 0o600))
	wc, err = NewWebClient(WebConfig{Proxy: addr, CACertFile: caFile})
	require.NoError(t, err)
	ping, err := wc.Ping(context.Background())
	require.NoError(t, err)
	require.Equal(t, "c1", ping.ClusterName)
	wc.Close()

	_, err = NewWebClient(WebConfig{Proxy: addr, CACertFile: filepath.Join(t.TempDir(), "missing.pem")})
	require.ErrorContains(t, err, "--cacert")
}

func TestLoginErrorsMapped(t *testing.T) {
	var status atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/webapi/ping" {
			fmt.Fprint(w, `{"cluster_name":"c1","proxy_ssh_addr":"127.0.0.1:3023","second_factor":"otp","server_version":"dev"}`)
			return
		}
		w.WriteHeader(int(status.Load()))
		fmt.Fprintf(w, `{"error":"status %d"}`, status.Load())
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "https://")
	for code, kind := range map[int]func(error) bool{
		http.StatusUnauthorized:        trace.IsAccessDenied,
		http.StatusTooManyRequests:     trace.IsLimitExceeded,
		http.StatusBadRequest:          trace.IsBadParameter,
		http.StatusInternalServerError: trace.IsConnectionProblem,
	} {
		status.Store(int32(code))
		prompts := scripted{"pw", "123456"}
		home := t.TempDir()
		_, err := Login(context.Background(), LoginConfig{
			Web: WebConfig{Proxy: addr, Insecure: true}, User: "alice", Store: NewStore(home), Prompt: &prompts, TTL: time.Hour,
		})
		require.True(t, kind(err), "%d: %v", code, err)
		require.Contains(t, err.Error(), fmt.Sprintf("status %d", code))
		require.Empty(t, prompts, "OTP asked when the proxy says otp")
		entries, _ := os.ReadDir(home)
		require.Empty(t, entries)
	}
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestNodesTableEscapes: `psh ls` prints node-supplied text escaped, never
// raw control characters, with the labels formatted as everywhere else.
func TestNodesTableEscapes(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, WriteNodesTable(&out, []proxyapi.NodeEntry{{
		UUID: "u1", Hostname: "web\r\nfake-host", Addr: "10.0.0.1:3022",
		Labels: map[string]string{"env": "\x1b[31m\r\n", "a": "1"}, Logins: []string{"root"},
	}, {UUID: "u2", Hostname: "db", Addr: "10.0.0.2:3022", Logins: []string{"root"}},
		{UUID: "u3", Hostname: "nat", Tunnel: true, Logins: []string{"root"}}}))
	s := out.String()
	require.Contains(t, s, `a=1,env="\x1b[31m\r\n"`)
	require.Contains(t, s, `"web\r\nfake-host"`)
	require.NotContains(t, s, "\x1b")
	require.NotContains(t, s, "\r")
	require.Equal(t, 4, bytes.Count(out.Bytes(), []byte("\n")), "one line per node plus the header:\n%s", s)
	require.Contains(t, s, "db  ")
	// A node behind NAT has no address: the column says why.
	require.Regexp(t, `(?m)^nat +\(tunnel\) +- +root +u3$`, s)
}

// TestOpenSSHConfigKeepAlives: the block `psh config` writes asks OpenSSH
// for keep-alives on both hops, so a frozen node or proxy ends the session.
func TestOpenSSHConfigKeepAlives(t *testing.T) {
	s := NewStore(t.TempDir())
	out, err := s.OpenSSHConfig(&Profile{Proxy: "proxy.example:3080", ProxySSH: "proxy.example:3023", User: "alice", Cluster: "c1"}, "/usr/bin/psh")
	require.NoError(t, err)
	block := out[strings.Index(out, "Host *.c1 proxy.example\n"):strings.Index(out, "Host proxy.example\n")]
	require.Contains(t, block, "    ServerAliveInterval 15\n")
	require.Contains(t, block, "    ServerAliveCountMax 2\n")
}

// TestOpenSSHConfigPerCluster: `psh config` writes one ProxyCommand block
// per cluster (the proxy's, then each leaf), each naming its cluster, all
// with the login's certificate and known_hosts and strict host key
// checking; a profile whose cluster names could inject config is refused.
func TestOpenSSHConfigPerCluster(t *testing.T) {
	s := NewStore("/home/a/.postern")
	p := &Profile{Proxy: "root.example:3080", ProxySSH: "root.example:3023", User: "alice", Cluster: "root", Clusters: []string{"east", "west"}}
	out, err := s.OpenSSHConfig(p, "/usr/bin/psh")
	require.NoError(t, err)
	require.Equal(t, `# Postern cluster "root" through proxy root.example:3080 (generated by `+"`psh config`"+`)
# Nodes of "root" that require a fresh second factor per session: psh asks for it before ssh connects
Match host "*.root,!root.example" exec "'/usr/bin/psh' --home='/home/a/.postern' proxy ssh --cluster=root --session-mfa %r@%h:%p"
    CertificateFile "/home/a/.postern/session-mfa/%r@%h:%p-cert.pub"
Host *.root *.east *.west root.example
    UserKnownHostsFile "/home/a/.postern/known_hosts"
    StrictHostKeyChecking yes
    IdentityFile "/home/a/.postern/keys/root.example:3080/alice"
    CertificateFile "/home/a/.postern/keys/root.example:3080/alice-cert.pub"
    IdentitiesOnly yes
    ServerAliveInterval 15
    ServerAliveCountMax 2
Host root.example
    Port 3023
Host *.root !root.example
    ProxyCommand "/usr/bin/psh" --home="/home/a/.postern" proxy ssh --cluster=root %r@%h:%p
# Postern leaf cluster "east", reached through the proxy of "root"
Host *.east !root.example
    ProxyCommand "/usr/bin/psh" --home="/home/a/.postern" proxy ssh --cluster=east %r@%h:%p
# Postern leaf cluster "west", reached through the proxy of "root"
Host *.west !root.example
    ProxyCommand "/usr/bin/psh" --home="/home/a/.postern" proxy ssh --cluster=west %r@%h:%p
`, out)

	p.Clusters = []string{"x\n    ProxyCommand evil"}
	_, err = s.OpenSSHConfig(p, "/usr/bin/psh")
	require.ErrorContains(t, err, "cluster")
}
