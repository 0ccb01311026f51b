package client

import (
	"bytes"
	"context"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/utils"
)

// hostSigner returns a host key with a certificate from ca for principals.
func hostSigner(t *testing.T, ca *testCA, principals ...string) ssh.Signer {
	t.Helper()
	priv, _, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	s, err := ssh.ParsePrivateKey(priv)
	require.NoError(t, err)
	cert := ca.sign(t, s.PublicKey(), ssh.HostCert, principals, time.Now().Add(time.Hour))
	cs, err := ssh.NewCertSigner(cert, s)
	require.NoError(t, err)
	return cs
}

// startJumpProxy runs a real x/crypto SSH server on 127.0.0.1:0 that
// serves `proxy:node1:22` by running a second SSH server (node1's) inside
// the subsystem channel, as the real proxy's splice to a node looks to psh.
func startJumpProxy(t *testing.T, ca *testCA) string {
	t.Helper()
	return startJumpProxyWith(t, hostSigner(t, ca, "127.0.0.1"), hostSigner(t, ca, "node1"), nil)
}

// startJumpProxyWith is startJumpProxy with the proxy's and the node's
// host keys given; onSub, when set, sees each subsystem name requested.
func startJumpProxyWith(t *testing.T, proxyKey, nodeKey ssh.Signer, onSub func(string)) string {
	t.Helper()
	proxyCfg := &ssh.ServerConfig{NoClientAuth: true}
	proxyCfg.AddHostKey(proxyKey)
	nodeCfg := &ssh.ServerConfig{NoClientAuth: true}
	nodeCfg.AddHostKey(nodeKey)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	spawn := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f()
		}()
	}
	serveNode := func(ch ssh.Channel, addr net.Addr) {
		defer ch.Close()
		_, chans, reqs, err := ssh.NewServerConn(&channelConn{Channel: ch, local: addr, remote: addr}, nodeCfg)
		if err != nil {
			return
		}
		spawn(func() { ssh.DiscardRequests(reqs) })
		for nch := range chans {
			_ = nch.Reject(ssh.Prohibited, "not in this test")
		}
	}
	spawn(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			spawn(func() {
				defer nc.Close()
				sconn, chans, reqs, err := ssh.NewServerConn(nc, proxyCfg)
				if err != nil {
					return
				}
				spawn(func() { ssh.DiscardRequests(reqs) })
				for nch := range chans {
					ch, creqs, err := nch.Accept()
					if err != nil {
						continue
					}
					spawn(func() {
						req, ok := <-creqs
						if !ok {
							return
						}
						var sub struct{ Name string }
						if req.Type != "subsystem" || ssh.Unmarshal(req.Payload, &sub) != nil {
							_ = req.Reply(false, nil)
							ch.Close()
							return
						}
						_ = req.Reply(true, nil)
						spawn(func() { ssh.DiscardRequests(creqs) })
						if onSub != nil {
							onSub(sub.Name)
						}
						if strings.HasPrefix(sub.Name, "nodes") {
							// As the proxy ends a subsystem (srv
							// session.finish), but the channel is
							// closed only after psh closed its side.
							_, _ = ch.Write([]byte("[]"))
							_ = ch.CloseWrite()
							_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{0}))
							_, _ = io.Copy(io.Discard, ch)
							ch.Close()
							return
						}
						serveNode(ch, sconn.LocalAddr())
					})
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

func jumpCreds(t *testing.T, ca *testCA, addr string) *Credentials {
	t.Helper()
	priv, _, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	signer, err := ssh.ParsePrivateKey(priv)
	require.NoError(t, err)
	return &Credentials{
		Profile:         &Profile{ProxySSH: addr},
		Signer:          signer,
		Cert:            &ssh.Certificate{ValidPrincipals: []string{"alice"}},
		HostKeyCallback: authz.HostKeyCallback([]ssh.PublicKey{ca.signer.PublicKey()}, clockwork.NewRealClock()),
	}
}

// TestNodeClientCloseWaits: when NodeClient.Close returns, the goroutines
// DialNode started for the connection (the connection watchers and the
// subsystem's readers) have ended (whoever starts a goroutine ends it). The check
// runs the moment Close returns, without goleak's retries: a goroutine
// that ends "soon after" is one nobody owns.
func TestNodeClientCloseWaits(t *testing.T) {
	ca := newTestCA(t)
	creds := jumpCreds(t, ca, startJumpProxy(t, ca))
	for range 5 {
		nc, err := DialNode(context.Background(), creds, proxy.Target{Host: "node1"}, "alice", KeepAliveConfig{Clock: clockwork.NewFakeClock()})
		require.NoError(t, err)
		defer nc.Close() // when an assertion below fails
		require.Len(t, clientGoroutines("waitDone", false), 2)
		require.Len(t, clientGoroutines("openSubsystem", false), 2)
		require.NoError(t, nc.Close())
		require.Empty(t, clientGoroutines("waitDone", true), "goroutines of a closed NodeClient are still running")
		require.Empty(t, clientGoroutines("openSubsystem", true), "goroutines of a closed NodeClient are still running")
	}
}

// TestListNodesWaits: ListNodes returns only after the subsystem's
// goroutines have ended.
func TestListNodesWaits(t *testing.T) {
	ca := newTestCA(t)
	creds := jumpCreds(t, ca, startJumpProxy(t, ca))
	for range 5 {
		nodes, err := ListNodes(context.Background(), creds, "")
		require.NoError(t, err)
		require.Empty(t, nodes)
		require.Empty(t, clientGoroutines("openSubsystem", true), "goroutines of ListNodes are still running")
	}
}

// clientGoroutines returns the stacks of the goroutines that this
// package's fn started. With blockedOnly, only goroutines blocked in
// something (a channel, a lock, I/O) count: one that is runnable has passed
// the signal its owner waits for and is only returning.
func clientGoroutines(fn string, blockedOnly bool) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		header, _, _ := bytes.Cut(g, []byte("\n"))
		if blockedOnly && (bytes.Contains(header, []byte("[runnable")) || bytes.Contains(header, []byte("[running"))) {
			continue
		}
		if bytes.Contains(g, []byte("created by github.com/postern-dev/postern/lib/client."+fn+" in goroutine")) {
			out = append(out, string(g))
		}
	}
	return out
}
