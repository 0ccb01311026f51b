package proxy

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// rootUserCert is a user certificate as a root's auth issues it (signed
// by a throwaway CA: Identify below stands for the signature check).
func rootUserCert(t *testing.T, user string) *ssh.Certificate {
	t.Helper()
	_, caKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	ca, err := ssh.NewSignerFromKey(caKey)
	require.NoError(t, err)
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	sshPub, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	cert := &ssh.Certificate{
		Key: sshPub, CertType: ssh.UserCert, KeyId: user, ValidPrincipals: []string{"ops"},
		ValidBefore: ssh.CertTimeInfinity,
		Permissions: ssh.Permissions{Extensions: map[string]string{services.CertExtensionUser: user, services.CertExtensionCluster: "root"}},
	}
	require.NoError(t, cert.SignCert(rand.Reader, ca))
	return cert
}

// leafRoundTrip sends one LeafRequest over a pipe served by h and returns
// the reply and the client end (for the spliced bytes).
func leafRoundTrip(t *testing.T, h *LeafTransport, line string) (proxyapi.LeafReply, net.Conn, *bufio.Reader) {
	t.Helper()
	client, server := net.Pipe()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); h.Serve(context.Background(), server) }()
	t.Cleanup(func() { client.Close(); wg.Wait() })
	_ = client.SetDeadline(time.Now().Add(10 * time.Second))
	// Written aside: the server stops reading at a bad request and
	// answers, and net.Pipe writes wait for the reader.
	wg.Add(1)
	go func() { defer wg.Done(); _, _ = io.WriteString(client, line+"\n") }()
	br := bufio.NewReader(client)
	replyLine, err := br.ReadString('\n')
	require.NoError(t, err)
	var reply proxyapi.LeafReply
	require.NoError(t, json.Unmarshal([]byte(replyLine), &reply))
	return reply, client, br
}

func leafRequest(t *testing.T, target string, cert *ssh.Certificate) string {
	t.Helper()
	b, err := json.Marshal(proxyapi.LeafRequest{Target: target, Cert: string(ssh.MarshalAuthorizedKey(cert)), Source: "203.0.113.5:4000"})
	require.NoError(t, err)
	return string(b)
}

// TestLeafTransport: the leaf's proxy routes a root user's connection
// with its own Router among the nodes the user's mapped roles reach, and
// answers every refusal without revealing a node the user may not see.
func TestLeafTransport(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	defer func() { ln.Close(); wg.Wait() }()
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("SSH-2.0-leaf-node\r\n"))
			c.Close()
		}
	})
	env := newRouterEnv(t, []services.Node{
		node("u-web", "web", ln.Addr().String(), 0, "env", "test"),
		node("u-db", "db", ln.Addr().String(), 0, "env", "prod"),
	}, &net.Dialer{})
	dev := &services.Role{Metadata: services.Metadata{Name: "dev"}, Spec: services.RoleSpec{
		Logins: []string{"ops"}, NodeLabels: map[string]services.LabelValues{"env": {"test"}},
	}}
	audit := events.NewRecorder()
	h, err := NewLeafTransport(LeafTransportConfig{
		Router: env.router,
		Identify: func(_ context.Context, cert *ssh.Certificate) (*authz.Identity, error) {
			if cert.KeyId == "mallory" {
				return nil, trace.AccessDenied(`roles [auditor] of user "mallory" of cluster "root" map to no role here`)
			}
			return &authz.Identity{User: cert.KeyId, Cluster: "root", Cert: cert, Roles: []string{"dev"},
				Checker: services.NewAccessChecker([]*services.Role{dev}, nil)}, nil
		},
		Deps: observe.Deps{Audit: audit},
	})
	require.NoError(t, err)
	alice := rootUserCert(t, "alice")

	reply, _, br := leafRoundTrip(t, h, leafRequest(t, "web:22", alice))
	require.Empty(t, reply.Error)
	banner, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "SSH-2.0-leaf-node\r\n", banner)

	// A node the mapped roles do not reach reads exactly like one that
	// does not exist; the leaf's audit log says why.
	hidden, _, _ := leafRoundTrip(t, h, leafRequest(t, "db", alice))
	missing, _, _ := leafRoundTrip(t, h, leafRequest(t, "ghost", alice))
	require.Equal(t, proxyapi.LeafReply{Error: `node "db" not found in cluster "c1"`, Kind: proxyapi.LeafNotFound}, hidden)
	require.Equal(t, proxyapi.LeafReply{Error: `node "ghost" not found in cluster "c1"`, Kind: proxyapi.LeafNotFound}, missing)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := audit.Wait(ctx, events.AccessDenied, func(e events.Event) bool { return e.Fields[events.FieldTarget] == "db" })
	require.NoError(t, err)
	require.Equal(t, "alice", ev.User)
	require.Equal(t, "root", ev.Fields[events.FieldUserCluster])

	// A user whose roles map to nothing: denied, the reason audited.
	denied, _, _ := leafRoundTrip(t, h, leafRequest(t, "web", rootUserCert(t, "mallory")))
	require.Equal(t, proxyapi.LeafReply{Error: "access denied", Kind: proxyapi.LeafDenied}, denied)
	ev, err = audit.Wait(ctx, events.AccessDenied, func(e events.Event) bool { return e.User == "mallory" })
	require.NoError(t, err)
	require.Contains(t, ev.Fields[events.FieldReason], "map to no role here")

	// Kind route: the leaf's Router explains among the nodes the mapped
	// roles reach; db (which alice may not reach) reads like ghost.
	route := func(target string, cert *ssh.Certificate) proxyapi.LeafReply {
		b, err := json.Marshal(proxyapi.LeafRequest{Target: target, Cert: string(ssh.MarshalAuthorizedKey(cert)), Kind: proxyapi.LeafKindRoute})
		require.NoError(t, err)
		r, _, _ := leafRoundTrip(t, h, string(b))
		return r
	}
	web := route("web", alice)
	require.Empty(t, web.Error)
	require.False(t, web.RouteFailed)
	require.Contains(t, web.Explanation, "candidates: \n  * web u-web ")
	require.Contains(t, web.Explanation, "chosen:     u-web")
	require.NotContains(t, web.Explanation, "u-db")
	hiddenRoute, missingRoute := route("db", alice), route("ghost", alice)
	require.True(t, hiddenRoute.RouteFailed)
	require.Contains(t, hiddenRoute.Explanation, `error:      node "db" not found in cluster "c1"`)
	require.NotContains(t, hiddenRoute.Explanation, "u-db")
	require.Equal(t, strings.ReplaceAll(missingRoute.Explanation, "ghost", "db"), hiddenRoute.Explanation)
	require.Equal(t, proxyapi.LeafReply{Error: "access denied", Kind: proxyapi.LeafDenied}, route("web", rootUserCert(t, "mallory")))

	for name, line := range map[string]string{
		"not JSON":      "hello",
		"unknown field": `{"target":"web","cert":"x","extra":1}`,
		"no cert":       `{"target":"web","cert":""}`,
		"bad target":    `{"target":"a b:c","cert":""}`,
	} {
		t.Run(name, func(t *testing.T) {
			r, _, _ := leafRoundTrip(t, h, line)
			require.Equal(t, proxyapi.LeafBadRequest, r.Kind, r.Error)
		})
	}
	t.Run("too long", func(t *testing.T) {
		r, _, _ := leafRoundTrip(t, h, `{"target":"`+strings.Repeat("a", proxyapi.MaxLeafRequest)+`"}`)
		require.Equal(t, proxyapi.LeafBadRequest, r.Kind)
		require.Contains(t, r.Error, "longer than")
	})
}

// TestLeafTransportOpenSSH: a root user's dial to one of the leaf's
// OpenSSH nodes is answered with the node, the mapped role that requires
// a recording and the certificate the leaf's auth signed for the user's
// certificate (or why there is none); a Postern node's answer names
// nothing.
func TestLeafTransportOpenSSH(t *testing.T) {
	addr := bannerServer(t)
	env := newRouterEnv(t, []services.Node{
		openSSHNode("o-db", "db", addr, "env", "test"),
		node("u-web", "web", addr, 0, "env", "test"),
	}, &net.Dialer{})
	dev := &services.Role{Metadata: services.Metadata{Name: "dev"}, Spec: services.RoleSpec{
		Logins: []string{"ops"}, NodeLabels: map[string]services.LabelValues{"env": {"test"}}, SessionRecording: services.RecordingRequire,
	}}
	require.NoError(t, dev.CheckAndSetDefaults())
	var asked []string
	var mu sync.Mutex
	h, err := NewLeafTransport(LeafTransportConfig{
		Router: env.router,
		Identify: func(_ context.Context, cert *ssh.Certificate) (*authz.Identity, error) {
			return &authz.Identity{User: cert.KeyId, Cluster: "root", Cert: cert, Roles: []string{"dev"},
				Checker: services.NewAccessChecker([]*services.Role{dev}, nil)}, nil
		},
		OpenSSHCert: func(_ context.Context, uuid string, rootCert []byte) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, uuid)
			if strings.Contains(string(rootCert), "ssh-ed25519-cert") {
				return []byte("ssh-ed25519-cert-v01@openssh.com AAAA leaf-signed\n"), nil
			}
			return nil, trace.AccessDenied("no")
		},
	})
	require.NoError(t, err)
	alice := rootUserCert(t, "alice")

	reply, _, _ := leafRoundTrip(t, h, leafRequest(t, "db:22", alice))
	require.Empty(t, reply.Error)
	require.Equal(t, &proxyapi.LeafOpenSSHNode{UUID: "o-db", Hostname: "db", RecordingRequiredBy: "dev", Cert: "ssh-ed25519-cert-v01@openssh.com AAAA leaf-signed"}, reply.OpenSSH)
	require.Equal(t, []string{"o-db"}, asked)

	reply, _, _ = leafRoundTrip(t, h, leafRequest(t, "web:22", alice))
	require.Empty(t, reply.Error)
	require.Nil(t, reply.OpenSSH, "a Postern node records its own sessions")
	require.Equal(t, []string{"o-db"}, asked, "no certificate for a Postern node")

	// Without the hook: the node, and why there is no certificate.
	h.cfg.OpenSSHCert = nil
	reply, _, _ = leafRoundTrip(t, h, leafRequest(t, "db:22", alice))
	require.NotNil(t, reply.OpenSSH)
	require.Empty(t, reply.OpenSSH.Cert)
	require.Contains(t, reply.OpenSSH.CertError, "does not issue certificates")
}

// TestLeafTransportOpenSSHLocked: a lock in the leaf on its OpenSSH node
// ends a root user's open connection to it (a stock sshd knows nothing
// of locks); one on another node ends nothing.
func TestLeafTransportOpenSSHLocked(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	defer func() { ln.Close(); wg.Wait() }()
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				c.Write([]byte("SSH-2.0-OpenSSH_9.2p1\r\n"))
				_, _ = io.Copy(io.Discard, c)
			})
		}
	})
	env := newRouterEnv(t, []services.Node{openSSHNode("o-db", "db", ln.Addr().String(), "env", "test")}, &net.Dialer{})
	locks, err := services.NewLockWatcher(services.LockWatcherConfig{Events: env.store, Clock: clockwork.NewRealClock()})
	require.NoError(t, err)
	defer locks.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, locks.WaitSynced(ctx))
	dev := &services.Role{Metadata: services.Metadata{Name: "dev"}, Spec: services.RoleSpec{
		Logins: []string{"ops"}, NodeLabels: map[string]services.LabelValues{"env": {"test"}},
	}}
	h, err := NewLeafTransport(LeafTransportConfig{
		Router: env.router,
		Locks:  locks,
		Identify: func(_ context.Context, cert *ssh.Certificate) (*authz.Identity, error) {
			return &authz.Identity{User: cert.KeyId, Cluster: "root", Cert: cert, Roles: []string{"dev"},
				Checker: services.NewAccessChecker([]*services.Role{dev}, nil)}, nil
		},
	})
	require.NoError(t, err)
	reply, client, br := leafRoundTrip(t, h, leafRequest(t, "db:22", rootUserCert(t, "alice")))
	// Before the server's wait above: a connection the lock did not end
	// must not hold it.
	defer client.Close()
	require.Empty(t, reply.Error)
	banner, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "SSH-2.0-OpenSSH_9.2p1\r\n", banner)

	// Another node's lock: still open.
	changed := locks.Changes()
	require.NoError(t, env.store.UpsertLock(ctx, services.Lock{Target: services.LockTarget{Node: "other"}}))
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("lock never arrived")
	}
	_, err = client.Write([]byte("still here\n"))
	require.NoError(t, err)

	require.NoError(t, env.store.UpsertLock(ctx, services.Lock{Target: services.LockTarget{Node: "o-db"}, Message: "maintenance"}))
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = br.ReadString('\n')
	require.ErrorIs(t, err, io.EOF, "the connection ends at the lock")
}
