package auth

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
)

// serveImpostor runs a TLS server on loopback that presents chain with key
// and answers every request with 200 {} (it never gets that far when Join
// does its job). It returns the address.
func serveImpostor(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	l, err := netListen()
	require.NoError(t, err)
	srv := &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("{}")) }),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
	}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(tls.NewListener(l, srv.TLSConfig)) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return l.Addr().String()
}

// TestJoinRefusesImpostors checks why the pin alone is not enough: an
// impostor can send the real (public) CA certificate next to a leaf of its
// own. Join must verify the leaf against the pinned CA, for server use.
func TestJoinRefusesImpostors(t *testing.T) {
	env := newTestAuth(t)
	other := newTestAuth(t)
	ctx := context.Background()
	realCA := env.auth.tlsCACert.Raw

	// A server certificate from another CA, shipped with our real CA.
	foreign, err := other.auth.issueIdentity(ctx, IdentityRequest{ID: AuthIdentityID, Role: RoleAuth}, []string{JoinServerName}, []net.IP{net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	foreignCert := foreign.TLSCert
	foreignCert.Certificate = append(foreignCert.Certificate, realCA)

	// A node of our own cluster posing as auth: its certificate is signed
	// by the right CA but is for client use only.
	node := env.identity(t, "rogue-node", RoleNode)
	nodeCert := node.TLSCert
	nodeCert.Certificate = append(nodeCert.Certificate, realCA)

	for name, cert := range map[string]tls.Certificate{"foreign leaf": foreignCert, "node leaf": nodeCert} {
		t.Run(name, func(t *testing.T) {
			addr := serveImpostor(t, cert)
			_, err := Join(ctx, JoinParams{
				AuthAddr: addr, Token: "t", CAPin: env.auth.CAPin(), Role: RoleNode,
				Hostname: "victim", Clock: env.clock, Timeout: 10 * time.Second,
			})
			require.Error(t, err)
			require.True(t, trace.IsConnectionProblem(err), "%v", err)
			require.Contains(t, err.Error(), "not signed by the pinned CA")
		})
	}
}

func TestJoinParams(t *testing.T) {
	good := JoinParams{AuthAddr: "a:1", Token: "t", CAPin: "sha256:" + strings.Repeat("0", 64), Role: RoleNode, Hostname: "u"}
	for name, mutate := range map[string]func(p *JoinParams){
		"no addr":  func(p *JoinParams) { p.AuthAddr = "" },
		"no token": func(p *JoinParams) { p.Token = "" },
		"bad role": func(p *JoinParams) { p.Role = RoleAdmin },
		"no pin":   func(p *JoinParams) { p.CAPin = "" },
		"bad pin":  func(p *JoinParams) { p.CAPin = "md5:00" },
	} {
		p := good
		mutate(&p)
		_, err := Join(context.Background(), p)
		require.True(t, trace.IsBadParameter(err), "%s: %v", name, err)
	}
}
