package auth

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// plainSigner is a fresh SSH key with no certificate.
func plainSigner(t *testing.T) ssh.Signer {
	t.Helper()
	priv, _, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	s, err := ssh.ParsePrivateKey(priv)
	require.NoError(t, err)
	return s
}

// silentListener accepts connections and never says a word: a black hole
// a node could point its address at. accepted receives one value per
// connection (dropped when nobody listens).
func silentListener(t *testing.T) (addr string, accepted <-chan struct{}) {
	t.Helper()
	l, err := netListen()
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	acc := make(chan struct{}, 1)
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case acc <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String(), acc
}

// TestHeartbeatAddressMustAnswerWithOwnCert is issue 10 item 4: a node
// announcing an address that does not answer with its own host
// certificate is refused, naming the address, and its verified record
// stays as it was. Every target is a real server on loopback.
func TestHeartbeatAddressMustAnswerWithOwnCert(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	victim := env.newHostNode(t, "node-a", RoleNode)
	other := env.newHostNode(t, "node-b", RoleNode)
	clt := env.client(t, victim.id)
	beat := func(addr string) error {
		now := env.clock.Now()
		return clt.UpsertNode(ctx, services.Node{UUID: "node-a", Hostname: "a", Addr: addr, LastHeartbeat: now, Expires: now.Add(30 * time.Second)})
	}
	require.NoError(t, beat(victim.addr))

	web := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	defer web.Close()
	plain := serveHostKey(t, plainSigner(t))
	foreignEnv := newTestAuth(t)
	foreign := serveHostKey(t, foreignEnv.identity(t, "node-a", RoleNode).SSHSigner)
	closed, err := netListen()
	require.NoError(t, err)
	closedAddr := closed.Addr().String()
	closed.Close()
	env.auth.addrs.timeout = 300 * time.Millisecond
	silent, _ := silentListener(t)

	for _, tc := range []struct {
		name, addr, reason string
	}{
		{"the auth API", env.addr, "no SSH host certificate from"},
		{"an HTTPS port", strings.TrimPrefix(web.URL, "https://"), "no SSH host certificate from"},
		{"another node's SSH port", other.addr, `the host certificate of "node-b", not of "node-a"`},
		{"a plain host key", plain.addr, "no common algorithm for host key"},
		{"another cluster's certificate", foreign.addr, "not signed by a trusted host CA"},
		{"a closed port", closedAddr, "dialing"},
		{"a port that never answers", silent, "within 300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := beat(tc.addr)
			requireKind(t, err, trace.IsAccessDenied, "may not announce address "+tc.addr)
			got, err := env.store.GetNode(ctx, testCluster, "node-a")
			require.NoError(t, err)
			require.Equal(t, victim.addr, got.Addr, "the verified record is kept")
			// The reason, as the auth log has it.
			require.ErrorContains(t, env.auth.addrs.check(ctx, "node-a", tc.addr), tc.reason)
		})
	}

	// Steady state: a verified pair is not dialed again until
	// verifiedAddrTTL has passed; then it is re-checked.
	dials := victim.srv.conns.Load()
	for range 3 {
		require.NoError(t, beat(victim.addr))
	}
	require.Equal(t, dials, victim.srv.conns.Load(), "cached: no new dial")
	env.clock.Advance(verifiedAddrTTL)
	require.NoError(t, beat(victim.addr))
	require.Equal(t, dials+1, victim.srv.conns.Load(), "re-checked after the cache TTL")
	// The node stops answering there: the next re-check refuses it.
	victim.srv.close()
	env.clock.Advance(verifiedAddrTTL)
	requireKind(t, beat(victim.addr), trace.IsAccessDenied, "may not announce address "+victim.addr)

	// A node that moves is verified at its new address.
	moved := serveHostKey(t, victim.id.SSHSigner)
	require.NoError(t, beat(moved.addr))
	got, err := env.store.GetNode(ctx, testCluster, "node-a")
	require.NoError(t, err)
	require.Equal(t, moved.addr, got.Addr)
}

// TestHeartbeatTimesAreTheServers: the auth server dates a remote
// heartbeat and bounds its TTL; a node can shorten its TTL, never extend
// it, and a record dated 2099 is stored with the server's time.
func TestHeartbeatTimesAreTheServers(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	hn := env.newHostNode(t, "node-t", RoleNode)
	clt := env.client(t, hn.id)
	future := time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name          string
		last, expires time.Time
		wantTTL       time.Duration
	}{
		{"dated 2099", future, future.Add(30 * time.Second), 30 * time.Second},
		{"expires in 2099", env.clock.Now(), future, MaxHeartbeatTTL},
		{"asks for less", env.clock.Now(), env.clock.Now().Add(12 * time.Second), 12 * time.Second},
		{"asks for more", env.clock.Now(), env.clock.Now().Add(MaxHeartbeatTTL + time.Second), MaxHeartbeatTTL},
		{"no times", time.Time{}, time.Time{}, MaxHeartbeatTTL},
		{"expired already", env.clock.Now(), env.clock.Now().Add(-time.Hour), MaxHeartbeatTTL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, clt.UpsertNode(ctx, services.Node{UUID: "node-t", Hostname: "t", Addr: hn.addr, LastHeartbeat: tc.last, Expires: tc.expires}))
			got, err := env.store.GetNode(ctx, testCluster, "node-t")
			require.NoError(t, err)
			now := env.clock.Now().UTC()
			require.True(t, now.Equal(got.LastHeartbeat), "last_heartbeat %v, want the server's %v", got.LastHeartbeat, now)
			require.True(t, now.Add(tc.wantTTL).Equal(got.Expires), "expires %v, want %v", got.Expires, now.Add(tc.wantTTL))
		})
	}
	// And the record really dies at the server's expiry.
	require.NoError(t, clt.UpsertNode(ctx, services.Node{UUID: "node-t", Hostname: "t", Addr: hn.addr, LastHeartbeat: future, Expires: future.Add(time.Hour)}))
	env.clock.Advance(MaxHeartbeatTTL)
	_, err := env.store.GetNode(ctx, testCluster, "node-t")
	require.True(t, trace.IsNotFound(err), "%v", err)

	// An admin's write is taken as sent (operators repair the inventory).
	admin := env.adminClient(t)
	require.NoError(t, admin.UpsertNode(ctx, services.Node{UUID: "manual", Hostname: "m", Addr: "127.0.0.1:1", LastHeartbeat: future, Expires: env.clock.Now().Add(time.Hour)}))
	got, err := env.store.GetNode(ctx, testCluster, "manual")
	require.NoError(t, err)
	require.True(t, future.Equal(got.LastHeartbeat))
}

// TestHeartbeatRefusesNamesAndLabels is the heartbeat half of issue 10
// items 5 and 11: the names and labels a join would refuse are refused on
// every heartbeat too, with a BadParameter naming them, and the record
// keeps its last good value.
func TestHeartbeatRefusesNamesAndLabels(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	const own = "0b6a8a8e-9f0c-4c4e-9a55-0d7b1f0c1a2b"
	hn := env.newHostNode(t, own, RoleNode)
	clt := env.client(t, hn.id)
	host, _, err := net.SplitHostPort(hn.addr)
	require.NoError(t, err)
	beat := func(hostname string, labels map[string]string) error {
		return clt.UpsertNode(ctx, services.Node{UUID: own, Hostname: hostname, Addr: hn.addr, Labels: labels})
	}
	require.NoError(t, beat("good", map[string]string{"env": "prod"}))
	// Allowed shapes: its own UUID (any case), its own address's IP.
	require.NoError(t, beat(strings.ToUpper(own), nil))
	require.NoError(t, beat(host, nil))
	require.NoError(t, beat("good", map[string]string{"env": "prod"}))

	for _, tc := range []struct {
		name     string
		hostname string
		labels   map[string]string
		want     string
	}{
		{"NAME.CLUSTER", "web1." + testCluster, nil, `"web1.example.test" ends in .example.test`},
		{"NAME.CLUSTER any case", "web1.Example.TEST", nil, `"web1.Example.TEST" ends in .example.test`},
		{"the cluster name", testCluster, nil, `is the name of cluster`},
		{"another UUID", "00000000-0000-4000-8000-000000000001", nil, `"00000000-0000-4000-8000-000000000001" is a UUID that is not this node's`},
		{"a UUID without dashes", "000000000000400080000000000000ab", nil, "is a UUID"},
		{"an IP not its own", "10.0.0.9", nil, `"10.0.0.9" is an IP address that is not this node's address`},
		{"wildcard", "web*", nil, `contains '*'`},
		{"ESC in hostname", "web\x1b[2J", nil, `"web\x1b[2J" contains the control character U+001B`},
		{"localhost", "localhost", nil, "names the local machine"},
		{"ESC in a label key", "good", map[string]string{"e\x1bnv": "x"}, `label key "e\x1bnv" contains the control character U+001B`},
		{"CR LF in a value", "good", map[string]string{"env": "prod\r\nfake=1"}, `label "env": value "prod\r\nfake=1" contains the control character U+000D`},
		{"DEL", "good", map[string]string{"env": "a\x7f"}, `U+007F`},
		{"C1 CSI", "good", map[string]string{"env": "a\u009b31m"}, `U+009B`},
		{"bidi override", "good", map[string]string{"env": "a\u202eb"}, `U+202E`},
		{"too long", "good", map[string]string{"env": strings.Repeat("x", services.MaxLabelValueLen+1)}, `longer than 253`},
		{"too many", "good", manyLabels(services.MaxNodeLabels + 1), `at most 64`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := beat(tc.hostname, tc.labels)
			requireKind(t, err, trace.IsBadParameter, tc.want)
			got, err := env.store.GetNode(ctx, testCluster, own)
			require.NoError(t, err)
			require.Equal(t, "good", got.Hostname)
			require.Equal(t, map[string]string{"env": "prod"}, got.Labels)
		})
	}
}

func manyLabels(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m["k"+strings.Repeat("x", i)] = "v"
	}
	return m
}

// TestAddressChecksAreBounded: one node gets one address check at a time,
// so a node announcing black holes cannot hold more than one of auth's
// dial slots, and a check never outlives its timeout.
func TestAddressChecksAreBounded(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	hn := env.newHostNode(t, "node-s", RoleNode)
	clt := env.client(t, hn.id)
	env.auth.addrs.timeout = 2 * time.Second
	silent, accepted := silentListener(t)
	first := make(chan error, 1)
	go func() {
		first <- clt.UpsertNode(ctx, services.Node{UUID: "node-s", Hostname: "s", Addr: silent})
	}()
	<-accepted // auth is dialing on the node's behalf
	err := clt.UpsertNode(ctx, services.Node{UUID: "node-s", Hostname: "s", Addr: hn.addr})
	requireKind(t, err, trace.IsLimitExceeded, `an address check for node "node-s" is already running`)
	// Another node is not held up by it.
	other := env.newHostNode(t, "node-o", RoleNode)
	require.NoError(t, env.client(t, other.id).UpsertNode(ctx, services.Node{UUID: "node-o", Hostname: "o", Addr: other.addr}))
	select {
	case err := <-first:
		requireKind(t, err, trace.IsAccessDenied, "may not announce address "+silent)
	case <-time.After(20 * time.Second):
		t.Fatal("the address check did not end at its timeout")
	}
	require.NoError(t, clt.UpsertNode(ctx, services.Node{UUID: "node-s", Hostname: "s", Addr: hn.addr}))
}

// TestHeartbeatDialsOnlyWhereTheNodeIs is the canary of issue 24 item 8:
// a node announcing an address on another host (a listener on 127.0.0.2,
// while the node's heartbeat comes from 127.0.0.1) is refused without
// auth ever connecting there, naming the setting that would allow it;
// with the network in cluster_networking_config spec.node_address_networks
// the address is checked and accepted. A DNS name must resolve only to
// allowed addresses, and the check dials the resolved IP.
func TestHeartbeatDialsOnlyWhereTheNodeIs(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	const own = "6d1f1d7e-2b9a-4c43-8e0e-4f1b7b9f7a10"
	id := env.identity(t, own, RoleNode)
	clt := env.client(t, id)
	beat := func(addr string) error {
		return clt.UpsertNode(ctx, services.Node{UUID: own, Hostname: "n", Addr: addr})
	}

	// The canary counts every connection accepted before the test's own
	// probe (which says "probe" first): the backlog is FIFO, so a dial by
	// auth, done before its answer, is accepted before the probe.
	canary, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	probed := make(chan int, 1)
	canaryDone := make(chan struct{})
	go func() {
		defer close(canaryDone)
		others := 0
		for {
			c, err := canary.Accept()
			if err != nil {
				return
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 5)
			_, err = io.ReadFull(c, buf)
			c.Close()
			if err == nil && string(buf) == "probe" {
				probed <- others
				continue
			}
			others++
		}
	}()
	t.Cleanup(func() { canary.Close(); <-canaryDone })

	err = beat(canary.Addr().String())
	requireKind(t, err, trace.IsAccessDenied, "may not announce address "+canary.Addr().String())
	require.Contains(t, err.Error(), "the one the node connects from (127.0.0.1)")
	require.Contains(t, err.Error(), "spec.node_address_networks (empty)")
	probe, err := net.Dial("tcp", canary.Addr().String())
	require.NoError(t, err)
	_, err = probe.Write([]byte("probe"))
	require.NoError(t, err)
	select {
	case n := <-probed:
		require.Zero(t, n, "auth connected to the canary")
	case <-time.After(10 * time.Second):
		t.Fatal("the canary never saw the probe")
	}
	probe.Close()
	_, err = env.store.GetNode(ctx, testCluster, own)
	require.True(t, trace.IsNotFound(err), "%v", err)

	// At its own source address the node's server is checked and stored.
	local := serveHostKey(t, id.SSHSigner)
	require.NoError(t, beat(local.addr))

	// The admin allows 127.0.0.2/32: now the node's server there is
	// checked (and accepted).
	nc := services.DefaultClusterNetworkingConfig()
	nc.Spec.NodeAddressNetworks = []string{"127.0.0.2/32"}
	require.NoError(t, env.adminClient(t).SetClusterNetworkingConfig(ctx, nc))
	other := serveHostKeyOn(t, id.SSHSigner, "127.0.0.2:0")
	require.NoError(t, beat(other.addr))
	require.Equal(t, int64(1), other.conns.Load())
	// 127.0.0.3 is still outside.
	err = beat("127.0.0.3:22")
	requireKind(t, err, trace.IsAccessDenied, "spec.node_address_networks (127.0.0.2/32)")

	// A heartbeat from loopback is from this machine: the machine's own
	// interface addresses count as the node's (here 127.0.0.4 stands for
	// the LAN address a node listening on 0.0.0.0 announces).
	env.auth.addrs.localAddrs = func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("127.0.0.4")} }
	lan := serveHostKeyOn(t, id.SSHSigner, "127.0.0.4:0")
	require.NoError(t, beat(lan.addr))
	require.Equal(t, int64(1), lan.conns.Load())

	// A bad network is refused naming the entry.
	nc.Spec.NodeAddressNetworks = []string{"127.0.0.2/32", "10.0.0.1/8"}
	requireKind(t, env.adminClient(t).SetClusterNetworkingConfig(ctx, nc), trace.IsBadParameter, `entry 1 "10.0.0.1/8" has host bits set`)
	nc.Spec.NodeAddressNetworks = []string{"lan"}
	requireKind(t, env.adminClient(t).SetClusterNetworkingConfig(ctx, nc), trace.IsBadParameter, `entry 0 "lan" is not a network`)

	// DNS names: every address must be allowed; the IP is dialed.
	_, port, _ := net.SplitHostPort(local.addr)
	env.auth.addrs.lookup = func(_ context.Context, host string) ([]netip.Addr, error) {
		switch host {
		case "good.node.test":
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		case "mixed.node.test":
			return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.9")}, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	before := local.conns.Load()
	require.NoError(t, beat(net.JoinHostPort("good.node.test", port)))
	require.Equal(t, before+1, local.conns.Load())
	err = beat(net.JoinHostPort("mixed.node.test", port))
	requireKind(t, err, trace.IsAccessDenied, "mixed.node.test resolves to 127.0.0.9")
}
