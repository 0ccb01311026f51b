package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

// pipeLeaves stands for the leaf tunnels on a root proxy: a leaf named
// name whose transport channels are served by a real LeafTransport (the
// leaf's Router over its own inventory) through net.Pipe.
type pipeLeaves struct {
	name string
	h    *LeafTransport
	// serve, when set, plays the leaf instead of h (a misbehaving one).
	serve func(net.Conn)
	wg    sync.WaitGroup
	// dials counts channels opened.
	mu    sync.Mutex
	dials int
}

func (p *pipeLeaves) LeafName(name string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.name == "" || !strings.EqualFold(name, p.name) {
		return "", false
	}
	return p.name, true
}

func (p *pipeLeaves) DialLeaf(ctx context.Context, name, _, _ string) (net.Conn, error) {
	if _, ok := p.LeafName(name); !ok {
		return nil, trace.NotFound("no tunnel from leaf cluster %q", name)
	}
	p.mu.Lock()
	p.dials++
	p.mu.Unlock()
	client, server := net.Pipe()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		if p.serve != nil {
			p.serve(server)
			return
		}
		p.h.Serve(context.Background(), server)
	}()
	return client, nil
}

// newLeafRouting is a root Router ("root") with one leaf (testCluster)
// whose LeafTransport maps alice to a role reaching env=test nodes and
// refuses mallory (roles mapping to nothing).
func newLeafRouting(t *testing.T, leafNodeAddr string) (*Router, *pipeLeaves, *events.Recorder) {
	t.Helper()
	leaf := newRouterEnv(t, []services.Node{
		node("u-web", "web", leafNodeAddr, 0, "env", "test"),
		node("u-db", "db", leafNodeAddr, 0, "env", "prod"),
		// The same name as web, hidden from alice: it must neither
		// make "web" ambiguous nor be named to her.
		node("u-secret-web", "web", leafNodeAddr, 0, "env", "prod"),
	}, &net.Dialer{})
	dev := &services.Role{Metadata: services.Metadata{Name: "dev"}, Spec: services.RoleSpec{
		Logins: []string{"ops"}, NodeLabels: map[string]services.LabelValues{"env": {"test"}},
	}}
	audit := events.NewRecorder()
	h, err := NewLeafTransport(LeafTransportConfig{
		Router: leaf.router,
		Nodes:  leaf.watcher,
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
	leaves := &pipeLeaves{name: testCluster, h: h}
	t.Cleanup(leaves.wg.Wait)
	root := newRouterEnvWith(t, nil, func(c *RouterConfig) {
		c.ClusterName = "root"
		// Its own clock: only the root's leaf timeouts wait on it.
		c.Clock = clockwork.NewFakeClockAt(t0)
		c.Leaves = leaves
		c.RemoteClusters = func(context.Context) ([]services.RemoteCluster, error) {
			return []services.RemoteCluster{{Name: testCluster, LastConnected: t0}, {Name: "gone"}}, nil
		}
	})
	return root.router, leaves, audit
}

// TestRootRoutesToLeaf: the root's Router resolves the cluster first and
// hands a leaf's target to the leaf (whose Router decides among the nodes
// the user's mapped roles reach there) by every spelling (@LEAF, rule 0
// HOST.LEAF in any case); what the leaf refuses reads to the user as the
// leaf says (a hidden node like a missing one), and a user whose roles
// map to nothing there, a leaf without a tunnel and an unknown cluster
// all read `cluster "X" not found`.
func TestRootRoutesToLeaf(t *testing.T) {
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
	root, leaves, leafAudit := newLeafRouting(t, ln.Addr().String())
	ctx := context.Background()
	alice, mallory := rootUserCert(t, "alice"), rootUserCert(t, "mallory")

	for _, target := range []Target{{Host: "web", Cluster: testCluster}, {Host: "web." + testCluster, Port: "22"}, {Host: "WEB." + strings.ToUpper(testCluster)}} {
		conn, route, err := root.DialHost(ctx, RouteRequest{Target: target, Cert: alice})
		require.NoError(t, err, target)
		require.True(t, route.Leaf)
		require.Equal(t, testCluster, route.Cluster)
		banner, err := bufio.NewReader(conn).ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "SSH-2.0-leaf-node\r\n", banner)
		conn.Close()
	}

	_, _, err = root.DialHost(ctx, RouteRequest{Target: Target{Host: "db", Cluster: testCluster}, Cert: alice})
	require.EqualError(t, err, `node "db" not found in cluster "c1"`)
	require.True(t, trace.IsNotFound(err))

	_, _, err = root.DialHost(ctx, RouteRequest{Target: Target{Host: "web", Cluster: testCluster}, Cert: mallory})
	require.EqualError(t, err, `cluster "c1" not found`)
	require.True(t, trace.IsNotFound(err))
	var ld *LeafDeniedError
	require.True(t, errors.As(err, &ld))
	require.Contains(t, ld.Reason, "denied")
	require.NotEmpty(t, leafAudit.Events(), "the leaf audits the unmapped roles")
	// By rule 0, the same refusal reads like a suffix that is no cluster.
	_, _, err = root.DialHost(ctx, RouteRequest{Target: Target{Host: "web." + testCluster}, Cert: mallory})
	require.EqualError(t, err, `node "web.c1" not found in cluster "root"`)
	require.True(t, errors.As(err, &ld))
	// Also with the local cluster named: HOST.LEAF@ROOT is rule 0 too.
	_, _, err = root.DialHost(ctx, RouteRequest{Target: Target{Host: "web." + testCluster, Cluster: "root"}, Cert: mallory})
	require.EqualError(t, err, `node "web.c1" not found in cluster "root"`)

	for _, target := range []Target{{Host: "web", Cluster: "gone"}, {Host: "web", Cluster: "nope"}} {
		_, _, err = root.DialHost(ctx, RouteRequest{Target: target, Cert: alice})
		require.EqualError(t, err, `cluster "`+target.Cluster+`" not found`)
	}
	// No certificate, nothing for the leaf to decide on.
	_, _, err = root.DialHost(ctx, RouteRequest{Target: Target{Host: "web", Cluster: testCluster}})
	require.EqualError(t, err, `cluster "c1" not found`)
	// web.gone is no leaf: a plain (local) miss.
	_, _, err = root.DialHost(ctx, RouteRequest{Target: Target{Host: "web.gone"}, Cert: alice})
	require.EqualError(t, err, `node "web.gone" not found in cluster "root"`)

	nodes, err := root.LeafNodes(ctx, testCluster, alice, "")
	require.NoError(t, err)
	require.Len(t, nodes, 1)
	require.Equal(t, "web", nodes[0].Hostname)
	require.Equal(t, testCluster, nodes[0].Cluster)
	_, err = root.LeafNodes(ctx, testCluster, mallory, "")
	require.EqualError(t, err, `cluster "c1" not found`)
	_, err = root.LeafNodes(ctx, "gone", alice, "")
	require.EqualError(t, err, `cluster "gone" not found`)

	names := func(sites []proxyapi.Site) []string {
		var out []string
		for _, s := range sites {
			out = append(out, s.Name+"/"+s.Status)
		}
		return out
	}
	require.Equal(t, []string{"root/online", testCluster + "/online"}, names(root.Sites(ctx, alice)))
	require.Equal(t, []string{"root/online"}, names(root.Sites(ctx, mallory)), "a leaf the user may not reach is not listed")
	require.Equal(t, []string{"root/online"}, names(root.Sites(ctx, nil)))

	// The leaf's tunnel goes: offline, said only to a user the leaf
	// accepted; to anyone else it does not exist.
	leaves.mu.Lock()
	leaves.name = ""
	leaves.mu.Unlock()
	for _, target := range []Target{{Host: "web", Cluster: testCluster}, {Host: "web." + testCluster}} {
		_, _, err = root.DialHost(ctx, RouteRequest{Target: target, Cert: alice})
		require.EqualError(t, err, `cluster "c1" is offline`, target)
		require.True(t, trace.IsConnectionProblem(err))
	}
	_, _, err = root.DialHost(ctx, RouteRequest{Target: Target{Host: "web", Cluster: testCluster}, Cert: mallory})
	require.EqualError(t, err, `cluster "c1" not found`)
	_, _, err = root.DialHost(ctx, RouteRequest{Target: Target{Host: "web", Cluster: testCluster}, Cert: rootUserCert(t, "alice")})
	require.EqualError(t, err, `cluster "c1" not found`, "another certificate the leaf never saw")
	require.Equal(t, []string{"root/online", testCluster + "/offline"}, names(root.Sites(ctx, alice)))
	require.Equal(t, []string{"root/online"}, names(root.Sites(ctx, mallory)))
}

// TestRootExplainsLeafRoute: the `route:` subsystem's body for a leaf
// target is the root's part (which tunnel) and the leaf's own
// explanation for the user's mapped roles, by every spelling; a node the
// leaf hides from the user is never a candidate nor named, and reads like
// a missing one; a user whose roles map to nothing there gets exactly
// what an unknown cluster (or, for HOST.LEAF, an unknown suffix) gives.
func TestRootExplainsLeafRoute(t *testing.T) {
	root, _, _ := newLeafRouting(t, "127.0.0.1:1")
	ctx := context.Background()
	alice, mallory := rootUserCert(t, "alice"), rootUserCert(t, "mallory")

	for _, target := range []Target{{Host: "web", Cluster: testCluster}, {Host: "web." + testCluster, Port: "22"}, {Host: "WEB." + strings.ToUpper(testCluster)}} {
		e, err := root.ExplainRequest(ctx, RouteRequest{Target: target, Cert: alice})
		require.NoError(t, err, target)
		require.True(t, e.Leaf)
		require.False(t, e.Failed())
		out := e.String()
		require.Contains(t, out, "cluster:    "+testCluster+"\n", out)
		require.Contains(t, out, "via:        the leaf's tunnel on this proxy", out)
		require.Contains(t, out, "in leaf cluster "+testCluster+":\n", out)
		require.NotContains(t, out[:strings.Index(out, "in leaf cluster")], "strategy:", "the root's strategy decides nothing in a leaf")
		require.Contains(t, out, "\n  candidates: \n    * web u-web ", out)
		require.Contains(t, out, "\n  chosen:     u-web (web, 127.0.0.1:1)\n", out)
		require.NotContains(t, out, "u-secret-web", "a node the leaf hides from alice is not named")
		require.NotContains(t, out, "env=prod")
	}

	// Hidden and missing read the same, but for the name.
	hidden, err := root.ExplainRequest(ctx, RouteRequest{Target: Target{Host: "db", Cluster: testCluster}, Cert: alice})
	require.NoError(t, err)
	missing, err := root.ExplainRequest(ctx, RouteRequest{Target: Target{Host: "ghost", Cluster: testCluster}, Cert: alice})
	require.NoError(t, err)
	require.True(t, hidden.Failed())
	require.Contains(t, hidden.String(), `error:      node "db" not found in cluster "c1"`)
	require.NotContains(t, hidden.String(), "u-db")
	require.Equal(t, strings.ReplaceAll(missing.String(), "ghost", "db"), hidden.String())

	// Roles mapping to nothing: an unknown cluster's answer.
	_, err = root.ExplainRequest(ctx, RouteRequest{Target: Target{Host: "web", Cluster: testCluster}, Cert: mallory})
	require.EqualError(t, err, `cluster "c1" not found`)
	var ld *LeafDeniedError
	require.True(t, errors.As(err, &ld))
	_, err = root.ExplainRequest(ctx, RouteRequest{Target: Target{Host: "web", Cluster: "nope"}, Cert: mallory})
	require.EqualError(t, err, `cluster "nope" not found`)
	// No certificate: nothing for the leaf to decide on.
	_, err = root.ExplainRequest(ctx, RouteRequest{Target: Target{Host: "web", Cluster: testCluster}})
	require.EqualError(t, err, `cluster "c1" not found`)
	// By rule 0: the local miss of a suffix that is no cluster.
	denied, err := root.ExplainRequest(ctx, RouteRequest{Target: Target{Host: "web." + testCluster}, Cert: mallory})
	require.NoError(t, err)
	unknown, err := root.ExplainRequest(ctx, RouteRequest{Target: Target{Host: "web.nope"}, Cert: mallory})
	require.NoError(t, err)
	require.True(t, unknown.Failed())
	require.Equal(t, strings.ReplaceAll(unknown.String(), "web.nope", "web."+testCluster), denied.String())
	require.Contains(t, denied.String(), `node "web.c1" not found in cluster "root"`)
}

// TestLeafSitesCached: listings reuse a leaf's answer for a while (the
// picker refreshes often), routing never does.
func TestLeafSitesCached(t *testing.T) {
	root, leaves, _ := newLeafRouting(t, "127.0.0.1:1")
	ctx := context.Background()
	alice := rootUserCert(t, "alice")
	root.Sites(ctx, alice)
	root.Sites(ctx, alice)
	leaves.mu.Lock()
	require.Equal(t, 1, leaves.dials)
	leaves.mu.Unlock()
	root.cfg.Clock.(interface{ Advance(d time.Duration) }).Advance(leafAccessTTL + time.Second)
	root.Sites(ctx, alice)
	leaves.mu.Lock()
	require.Equal(t, 2, leaves.dials)
	leaves.mu.Unlock()
}

// TestRootDistrustsLeafReplies: a leaf decides for its own nodes only. A
// leaf that lists nodes as another cluster's has them relabelled as its
// own, an oversized reply is refused, and one that never answers an
// access question holds a listing for leafAccessTimeout at most.
func TestRootDistrustsLeafReplies(t *testing.T) {
	root, leaves, _ := newLeafRouting(t, "127.0.0.1:1")
	ctx := context.Background()
	alice := rootUserCert(t, "alice")
	hang := make(chan struct{})
	defer close(hang)
	leaves.mu.Lock()
	leaves.serve = func(c net.Conn) {
		defer c.Close()
		req, err := readLeafRequest(c)
		if err != nil {
			return
		}
		switch req.Kind {
		case proxyapi.LeafKindNodes:
			b, _ := json.Marshal(proxyapi.LeafReply{Nodes: []proxyapi.NodeEntry{{UUID: "u1", Hostname: "evil", Cluster: "root"}}})
			_, _ = c.Write(append(b, '\n'))
		case proxyapi.LeafKindAccess:
			<-hang
		case proxyapi.LeafKindRoute:
			b, _ := json.Marshal(proxyapi.LeafReply{Explanation: "target: web\n\x1b]0;owned\x07chosen: evil\n"})
			_, _ = c.Write(append(b, '\n'))
		default:
			_, _ = c.Write(bytes.Repeat([]byte("x"), proxyapi.MaxLeafRequest+10))
		}
	}
	leaves.mu.Unlock()

	// First, while the root's clock has no other waiter (a fake clock's
	// timeout stays a waiter until it expires).
	done := make(chan []proxyapi.Site)
	go func() { done <- root.Sites(ctx, alice) }()
	clock := root.cfg.Clock.(*clockwork.FakeClock)
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(leafAccessTimeout)
	sites := <-done
	require.Len(t, sites, 1, "a leaf that does not answer is not listed")

	nodes, err := root.LeafNodes(ctx, testCluster, alice, "")
	require.NoError(t, err)
	require.Equal(t, testCluster, nodes[0].Cluster)

	_, _, err = root.DialHost(ctx, RouteRequest{Target: Target{Host: "web", Cluster: testCluster}, Cert: alice})
	require.ErrorContains(t, err, "leaf reply longer than")

	// A leaf's explanation cannot drive the root user's terminal.
	e, err := root.ExplainRequest(ctx, RouteRequest{Target: Target{Host: "web", Cluster: testCluster}, Cert: alice})
	require.NoError(t, err)
	require.NotContains(t, e.String(), "\x1b")
	require.NotContains(t, e.String(), "\x07")
	require.Contains(t, e.String(), `\x1b]0;owned\achosen: evil`)
}
