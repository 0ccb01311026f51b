package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webterm"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
)

// startHAProxy joins an in-process proxy to the auth servers in list
// (comma-separated, failover) with a proxy token from authDir; mutate
// may move its listeners.
func startHAProxy(t *testing.T, authDir, list, name string, mutate func(*config.Config)) (*service.Process, string) {
	t.Helper()
	m := joinRe.FindStringSubmatch(mustPctl(t, authDir, "", "tokens", "add", "--type", "proxy"))
	require.NotNil(t, m)
	dir := t.TempDir()
	cfg := procConfig(dir, config.RoleProxy)
	cfg.AuthServer, cfg.Token, cfg.CAPin, cfg.NodeName = list, m[1], m[2], name
	if mutate != nil {
		mutate(cfg)
	}
	return startProcess(t, cfg), dir
}

// TestHATwoAuthThreeProxiesEveryPair is issue 13's headline: two auth
// processes and three proxy processes on a three-member etcd, a node
// with an address ("plain") and a node in a network namespace whose only
// tunnel is on proxy A ("natted": only A's web and tunnel ports face the
// namespace). Every proxy x node pair works over OpenSSH's ssh -J with
// strict host key checking against the host CA, and over the web
// terminal of one browser session logged in through A; B and C reach
// the natted node only by peering with A. Every client takes both auth
// servers and the proxies and nodes are spread over them.
func TestHATwoAuthThreeProxiesEveryPair(t *testing.T) {
	requireOpenSSH(t, "ssh")
	ns := newNetNS(t)
	h := startHAAuth(t)
	authDir := h.a.dataDir
	list := h.addrs(t)
	// The reverse order for half the clients: both auth servers serve.
	rlist := h.b.authAddr(t) + "," + h.a.authAddr(t)
	clt := clientOf(t, h.b, h.b.authAddr(t))

	u, err := user.Current()
	require.NoError(t, err)
	mustPctl(t, authDir, alicePassword+"\n", "users", "add", "alice", "--logins", u.Username)
	keyPath := filepath.Join(t.TempDir(), "alice")
	mustPctl(t, authDir, "", "auth", "sign", "--user", "alice", "--ttl", "10m", "--out", keyPath)

	pa, dirA := startHAProxy(t, authDir, list, "edge-a", func(cfg *config.Config) {
		cfg.WebAddr = net.JoinHostPort(ns.hostIP, "0")
		cfg.TunnelAddr = net.JoinHostPort(ns.hostIP, "0")
		cfg.PublicAddrs = []string{ns.hostIP}
	})
	pb, dirB := startHAProxy(t, authDir, rlist, "edge-b", nil)
	pc, dirC := startHAProxy(t, authDir, list, "edge-c", nil)
	waitProxies(t, clt, 3)

	token, pin := nodeToken(t, authDir)
	ncfg := procConfig(t.TempDir(), config.RoleNode)
	ncfg.AuthServer, ncfg.Token, ncfg.CAPin, ncfg.NodeName = rlist, token, pin, "plain"
	plain := startProcess(t, ncfg)
	rec, nn := startNSNodeVia(t, ns, authDir, pa.Addr(service.ListenerWeb).String(), clt, "natted")
	waitNodes(t, clt, 2)
	waitLease(t, clt, rec.UUID, pa.HostUUID())
	// The precondition, checked again at the end: the natted node's only
	// tunnel is on A, so B and C can reach it only through A's peer port.
	onlyOnA := func() {
		require.Equal(t, []string{pa.HostUUID()}, leaseHolders(t, clt, rec.UUID), "the natted node's only tunnel is on A; its log:\n%s", nn.stderr)
	}
	onlyOnA()
	defer onlyOnA()

	type proxy struct {
		name string
		p    *service.Process
		dir  string
	}
	proxies := []proxy{{"A", pa, dirA}, {"B", pb, dirB}, {"C", pc, dirC}}
	nodes := []string{"plain", "natted"}
	// A session proves which node it is on by the host UUID it reports.
	uuids := map[string]string{"plain": plain.HostUUID(), "natted": rec.UUID}

	// One browser session, logged in through A, used on every proxy.
	login := webTermLogin(t, &allInOne{p: pa, dataDir: dirA})
	browsers := map[string]*webTermClient{}
	for _, px := range proxies {
		b := browserAt(t, login, px.p.Addr(service.ListenerWeb).String(), px.dir)
		browsers[px.name] = b
		// Each proxy's inventory (its NodeWatcher, fed from the auth
		// servers) must know both nodes before they are routed to.
		require.Eventually(t, func() bool {
			code, body := webNodes(t, b.hc, b.addr, b.cookie, b.token)
			return code == http.StatusOK && strings.Contains(body, `"plain"`) && strings.Contains(body, `"natted"`)
		}, 20*time.Second, 50*time.Millisecond, "proxy %s lists both nodes", px.name)
	}

	for i, px := range proxies {
		for j, node := range nodes {
			t.Run(fmt.Sprintf("ssh -J via %s to %s", px.name, node), func(t *testing.T) {
				cfg := (&allInOne{login: u.Username, keyPath: keyPath}).opensshConfigVia(t, px.p.Addr(service.ListenerProxySSH), node)
				want := fmt.Sprintf("pair-%d%d", i, j)
				out, err := exec.Command("ssh", "-F", cfg, node, "echo "+want+"; echo $SSH_POSTERN_HOST_UUID; echo $SSH_POSTERN_USER").CombinedOutput()
				require.NoError(t, err, string(out))
				require.Equal(t, want+"\n"+uuids[node]+"\nalice\n", string(out))
			})
			t.Run(fmt.Sprintf("web terminal via %s to %s", px.name, node), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				target := &allInOne{login: u.Username, hostname: node}
				// The shell computes the marker, so the echo of the typed
				// line cannot match it.
				ws, info, _ := browsers[px.name].open(t, ctx, target, "",
					fmt.Sprintf("echo WT-$((%d+1))-$SSH_POSTERN_HOST_UUID\n", 100*i+j),
					regexp.MustCompile(fmt.Sprintf(`WT-%d-%s`, 100*i+j+1, regexp.QuoteMeta(uuids[node]))))
				require.NotEmpty(t, info.ID, "the terminal announced its session")
				// The shell exits, so the terminal ends rather than waits
				// for a resume.
				require.NoError(t, ws.Write(ctx, websocket.MessageBinary, webterm.EncodeFrame(webterm.FrameData, []byte("exit\n"))))
				requireTerminalEnds(t, ws, "the terminal via "+px.name+" after exit")
			})
		}
	}
}
