package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// netNS is a network namespace joined to the host by a veth pair on a
// private /30: hostIP on the host side, nsIP inside. Its firewall (nft,
// inside the namespace) drops every new inbound connection, so the
// namespace is a machine behind NAT: what runs in it can reach hostIP,
// nothing can reach it.
type netNS struct {
	name           string
	hostIf, nsIf   string
	hostIP, nsIP   string
	blackholeTable string
}

// ipCmd runs ip/nft with args and fails the test with its output.
func ipCmd(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %s: %s", name, strings.Join(args, " "), out)
}

// newNetNS creates the namespace (a unique name, removed in Cleanup).
// Creating one needs root: without it the test fails under CI=true (CI
// runs as root and must run these tests) and is skipped elsewhere.
func newNetNS(t *testing.T) *netNS {
	t.Helper()
	for _, b := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(b); err != nil {
			netnsUnavailable(t, fmt.Sprintf("%s is not installed (apt-get install iproute2 nftables)", b))
		}
	}
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	id := hex.EncodeToString(rnd[:])
	n := &netNS{
		name:   "pt-" + id,
		hostIf: "vh" + id,
		nsIf:   "vn" + id,
		// 10.201-250.X.Y/30 from the random bytes: unlikely to collide
		// with another test's pair on this machine.
		hostIP:         fmt.Sprintf("10.%d.%d.%d", 201+int(rnd[0])%50, rnd[1], (int(rnd[2])%63)*4+1),
		blackholeTable: "postern_blackhole",
	}
	n.nsIP = n.hostIP[:strings.LastIndex(n.hostIP, ".")+1] + fmt.Sprint((int(rnd[2])%63)*4+2)
	if out, err := exec.Command("ip", "netns", "add", n.name).CombinedOutput(); err != nil {
		netnsUnavailable(t, fmt.Sprintf("ip netns add: %v: %s", err, bytes.TrimSpace(out)))
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", n.hostIf).Run()
		if out, err := exec.Command("ip", "netns", "del", n.name).CombinedOutput(); err != nil {
			t.Errorf("removing network namespace %s: %v: %s", n.name, err, out)
		}
	})
	ipCmd(t, "ip", "link", "add", n.hostIf, "type", "veth", "peer", "name", n.nsIf)
	ipCmd(t, "ip", "link", "set", n.nsIf, "netns", n.name)
	ipCmd(t, "ip", "addr", "add", n.hostIP+"/30", "dev", n.hostIf)
	ipCmd(t, "ip", "link", "set", n.hostIf, "up")
	ipCmd(t, "ip", "-n", n.name, "addr", "add", n.nsIP+"/30", "dev", n.nsIf)
	ipCmd(t, "ip", "-n", n.name, "link", "set", n.nsIf, "up")
	ipCmd(t, "ip", "-n", n.name, "link", "set", "lo", "up")
	// Behind NAT: replies to what the namespace opened pass, new inbound
	// connections are dropped (not refused: a NAT gives no answer).
	n.nft(t, `table inet postern_nat {
  chain input {
    type filter hook input priority 0; policy drop;
    iif lo accept
    ct state established,related accept
  }
}`)
	return n
}

func netnsUnavailable(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("cannot create a network namespace (%s): CI runs as root with iproute2 and nftables and must run this test", why)
	}
	t.Skipf("cannot create a network namespace (%s); run as root (CI does)", why)
}

// nft loads a ruleset inside the namespace.
func (n *netNS) nft(t *testing.T, ruleset string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", n.name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "nft in %s: %s", n.name, out)
}

// command runs name inside the namespace.
func (n *netNS) command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.name, name}, args...)...)
}

// blackhole silently drops everything between the namespace and the
// host, both ways (a half-open path: no RST, no ICMP); unblackhole lets
// it through again.
func (n *netNS) blackhole(t *testing.T) {
	t.Helper()
	n.nft(t, fmt.Sprintf(`table inet %s {
  chain input {
    type filter hook input priority -10; policy accept;
    iifname %q drop
  }
  chain output {
    type filter hook output priority -10; policy accept;
    oifname %q drop
  }
}`, n.blackholeTable, n.nsIf, n.nsIf))
}

func (n *netNS) unblackhole(t *testing.T) {
	t.Helper()
	n.nft(t, "delete table inet "+n.blackholeTable)
}

// requireUnreachable: a TCP dial from the host to addr inside the
// namespace gets no answer.
func requireUnreachable(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		c.Close()
	}
	require.Error(t, err, "%s must not be reachable from outside the namespace", addr)
}
