package integration

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// nodeToken asks pctl for a node join token and returns it and the CA pin.
func nodeToken(t testing.TB, dataDir string) (token, pin string) {
	t.Helper()
	out := mustPctl(t, dataDir, "", "tokens", "add", "--type", "node")
	m := joinRe.FindStringSubmatch(out)
	require.NotNil(t, m, "join command in %q", out)
	return m[1], m[2]
}

// nodeByUUID returns the inventory record of uuid.
func nodeByUUID(t *testing.T, clt *auth.Client, id string) services.Node {
	t.Helper()
	nodes, err := clt.GetNodes(context.Background(), clusterName)
	require.NoError(t, err)
	for _, n := range nodes {
		if n.UUID == id {
			return n
		}
	}
	t.Fatalf("node %s not in the inventory: %+v", id, nodes)
	return services.Node{}
}

// reachVictim logs in to the victim node through the proxy by UUID and by
// hostname, with the host key checked against the host CA (principals
// included), and returns what the session says its host UUID is.
func (c *allInOne) reachVictim(t *testing.T) {
	t.Helper()
	port := strconv.Itoa(c.p.Addr(service.ListenerNode).(*net.TCPAddr).Port)
	for _, target := range []string{c.p.HostUUID() + ":" + port, c.hostname + ":" + port} {
		clt, err := c.viaJump(t, target)
		require.NoError(t, err, target)
		out, err := run(t, clt, "echo $SSH_POSTERN_HOST_UUID")
		require.NoError(t, err, target)
		require.Equal(t, c.p.HostUUID(), strings.TrimSpace(out), target)
		clt.Close()
	}
}

// TestJoinCannotTakeANodesIdentity is issue 10 item 1 as the attack: a
// host holding an ordinary node token joins with the victim's UUID planted
// in its data dir. It must come out with a UUID the auth server minted, the
// victim's record must not move, users must still land on the victim, and
// nothing the intruder sends afterwards may make it the victim.
func TestJoinCannotTakeANodesIdentity(t *testing.T) {
	c := newAllInOne(t)
	clt := adminClient(t, c.dataDir, c.p)
	victimUUID := c.p.HostUUID()
	victimAddr := c.p.Addr(service.ListenerNode).String()
	token, pin := nodeToken(t, c.dataDir)

	dir := t.TempDir()
	cfg := procConfig(dir, config.RoleNode)
	cfg.AuthServer, cfg.Token, cfg.CAPin, cfg.NodeName = c.p.Addr(service.ListenerAuth).String(), token, pin, "intruder"
	require.NoError(t, os.WriteFile(cfg.HostUUIDPath(), []byte(victimUUID+"\n"), 0o600))
	intruder := startProcess(t, cfg)

	minted := intruder.HostUUID()
	require.NotEqual(t, victimUUID, minted, "the join must not hand out the victim's identity")
	_, err := uuid.Parse(minted)
	require.NoError(t, err, "a minted UUID: %q", minted)
	id, err := auth.ReadIdentity(cfg.IdentityDir(auth.RoleNode))
	require.NoError(t, err)
	require.Equal(t, minted, id.ID)
	require.NotContains(t, id.SSHCert.ValidPrincipals, victimUUID)
	require.NotContains(t, id.SSHCert.ValidPrincipals, victimUUID+"."+clusterName)
	// The data dir now remembers the minted UUID, not the planted one.
	data, err := os.ReadFile(cfg.HostUUIDPath())
	require.NoError(t, err)
	require.Equal(t, minted, strings.TrimSpace(string(data)))

	waitNodes(t, clt, 2)
	v := nodeByUUID(t, clt, victimUUID)
	require.Equal(t, victimAddr, v.Addr)
	require.Equal(t, c.hostname, v.Hostname)
	require.Equal(t, "intruder", nodeByUUID(t, clt, minted).Hostname)
	c.reachVictim(t)

	// With its real identity the intruder cannot announce the victim.
	iclt, err := auth.NewClient(auth.ClientConfig{Addr: cfg.AuthServer, Identity: id})
	require.NoError(t, err)
	defer iclt.Close()
	now := time.Now().UTC()
	err = iclt.UpsertNode(context.Background(), services.Node{
		UUID: victimUUID, Hostname: c.hostname, Addr: intruder.Addr(service.ListenerNode).String(),
		LastHeartbeat: now, Expires: now.Add(30 * time.Second),
	})
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	require.Contains(t, err.Error(), `may not announce node "`+victimUUID+`"`)
	require.Equal(t, victimAddr, nodeByUUID(t, clt, victimUUID).Addr)

	// A restart reuses the minted identity (the token is spent).
	stopProcess(t, intruder)
	cfg2 := procConfig(dir, config.RoleNode)
	cfg2.AuthServer, cfg2.NodeName = cfg.AuthServer, "intruder"
	again := startProcess(t, cfg2)
	require.Equal(t, minted, again.HostUUID())
	c.reachVictim(t)
}

// joinRequest is the JSON a joining host sends, built by hand so a test
// can send what the real client never would.
type joinRequest struct {
	Token                string   `json:"token"`
	Role                 string   `json:"role"`
	UUID                 string   `json:"uuid,omitempty"`
	Hostname             string   `json:"hostname,omitempty"`
	Addr                 string   `json:"addr,omitempty"`
	AdditionalPrincipals []string `json:"additional_principals,omitempty"`
	SSHPublicKey         []byte   `json:"ssh_public_key"`
	TLSPublicKey         []byte   `json:"tls_public_key"`
}

// rawJoin posts req to the auth server's join endpoint (fresh keys filled
// in) and returns the HTTP status, the error message (if any) and the
// SSH certificate (on success).
func rawJoin(t *testing.T, authAddr string, req joinRequest) (int, string, *ssh.Certificate) {
	t.Helper()
	_, sshPub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	tlsPub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(tlsPub)
	require.NoError(t, err)
	req.SSHPublicKey, req.TLSPublicKey = sshPub, der
	body, err := json.Marshal(req)
	require.NoError(t, err)
	// The attacker does not care who answers; the join name selects the
	// endpoint that needs no client certificate.
	tr := &http.Transport{TLSClientConfig: &tls.Config{ServerName: auth.JoinServerName, InsecureSkipVerify: true}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Post("https://"+authAddr+"/v1/join", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(raw, &e), "%s", raw)
		return resp.StatusCode, e.Error.Message, nil
	}
	var rr struct {
		SSHCert []byte `json:"ssh_cert"`
	}
	require.NoError(t, json.Unmarshal(raw, &rr))
	pub, _, _, _, err := ssh.ParseAuthorizedKey(rr.SSHCert)
	require.NoError(t, err)
	return resp.StatusCode, "", pub.(*ssh.Certificate)
}

// TestJoinCannotChooseItsNames is issue 10 item 2 (and the join half of
// items 5 and 11) against a running cluster: a join naming another node's
// UUID or hostname, the cluster, NAME.CLUSTER, a wildcard, localhost or a
// control character is refused with the offending name, the token
// survives, and a clean join gets exactly the derived principals plus the
// allowed extras.
func TestJoinCannotChooseItsNames(t *testing.T) {
	c := newAllInOne(t)
	authAddr := c.p.Addr(service.ListenerAuth).String()
	victim := c.p.HostUUID()
	token, _ := nodeToken(t, c.dataDir)

	for _, tc := range []struct {
		name string
		req  joinRequest
		want string
	}{
		{"victim uuid sent", joinRequest{UUID: victim, Hostname: "h1"}, "uuid"},
		{"victim uuid principal", joinRequest{Hostname: "h1", AdditionalPrincipals: []string{victim}}, victim},
		{"victim uuid.cluster principal", joinRequest{Hostname: "h1", AdditionalPrincipals: []string{victim + "." + clusterName}}, victim},
		{"victim hostname principal", joinRequest{Hostname: "h1", AdditionalPrincipals: []string{c.hostname}}, `"` + c.hostname + `"`},
		{"cluster name principal", joinRequest{Hostname: "h1", AdditionalPrincipals: []string{clusterName}}, `"` + clusterName + `"`},
		{"NAME.CLUSTER principal", joinRequest{Hostname: "h1", AdditionalPrincipals: []string{"web.IT"}}, `"web.IT"`},
		{"wildcard principal", joinRequest{Hostname: "h1", AdditionalPrincipals: []string{"*"}}, `"*"`},
		{"pattern principal", joinRequest{Hostname: "h1", AdditionalPrincipals: []string{"10.0.0.?"}}, `"10.0.0.?"`},
		{"localhost principal", joinRequest{Hostname: "h1", AdditionalPrincipals: []string{"localhost"}}, `"localhost"`},
		{"control char principal", joinRequest{Hostname: "h1", AdditionalPrincipals: []string{"a\x1b[31mb"}}, `a\x1b[31mb`},
		{"hostname NAME.CLUSTER", joinRequest{Hostname: "web1." + clusterName}, `"web1.it"`},
		{"hostname NAME.CLUSTER any case", joinRequest{Hostname: "web1.It"}, `"web1.It"`},
		{"hostname is the victim's uuid", joinRequest{Hostname: victim}, victim},
		{"hostname is another uuid", joinRequest{Hostname: "00000000-0000-4000-8000-00000000abcd"}, "00000000-0000-4000-8000-00000000abcd"},
		{"hostname is an IP not its own", joinRequest{Hostname: "10.9.9.9", Addr: "127.0.0.1:3022"}, `"10.9.9.9"`},
		{"hostname with ESC", joinRequest{Hostname: "evil\x1b]0;pwned\x07"}, `evil\x1b]0;pwned\a`},
		{"hostname wildcard", joinRequest{Hostname: "*"}, `"*"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Token, tc.req.Role = token, auth.RoleNode
			status, msg, _ := rawJoin(t, authAddr, tc.req)
			require.Equal(t, http.StatusBadRequest, status, msg)
			require.Contains(t, msg, tc.want)
		})
	}

	// None of those spent the token: a clean join with it works, and its
	// certificate carries exactly the derived names and the allowed extras.
	status, msg, cert := rawJoin(t, authAddr, joinRequest{
		Token: token, Role: auth.RoleNode, Hostname: "fresh", Addr: "127.0.0.1:3022",
		AdditionalPrincipals: []string{"10.1.2.3", "fresh.example.com", "::1"},
	})
	require.Equal(t, http.StatusOK, status, msg)
	minted := cert.KeyId
	_, err := uuid.Parse(minted)
	require.NoError(t, err, "minted UUID %q", minted)
	require.NotEqual(t, victim, minted)
	require.Equal(t, []string{minted, "fresh", minted + "." + clusterName, "fresh." + clusterName,
		"10.1.2.3", "fresh.example.com", "::1", "127.0.0.1"}, cert.ValidPrincipals)
	c.reachVictim(t)
}

// TestHeartbeatCannotRedirectOrOutlive is issue 10 item 4 (and the
// heartbeat half of items 5 and 11) as the attack: a node that joined with
// a real token, holding its real identity, heartbeats with an address of
// the auth API, the web port or the victim node's SSH port, a date in
// 2099, an endless TTL, a NAME.CLUSTER hostname and an ESC in a label.
// Every address is refused naming it, the times are the server's, and
// users still land on the victim.
func TestHeartbeatCannotRedirectOrOutlive(t *testing.T) {
	c := newAllInOne(t)
	clt := adminClient(t, c.dataDir, c.p)
	token, pin := nodeToken(t, c.dataDir)
	dir := t.TempDir()
	cfg := procConfig(dir, config.RoleNode)
	cfg.AuthServer, cfg.Token, cfg.CAPin, cfg.NodeName = c.p.Addr(service.ListenerAuth).String(), token, pin, "rogue"
	rogue := startProcess(t, cfg)
	waitNodes(t, clt, 2)
	realAddr := rogue.Addr(service.ListenerNode).String()
	// Its own, real heartbeat went through the address check.
	require.Equal(t, realAddr, nodeByUUID(t, clt, rogue.HostUUID()).Addr)

	id, err := auth.ReadIdentity(cfg.IdentityDir(auth.RoleNode))
	require.NoError(t, err)
	rclt, err := auth.NewClient(auth.ClientConfig{Addr: cfg.AuthServer, Identity: id})
	require.NoError(t, err)
	defer rclt.Close()
	ctx := context.Background()
	beat := func(n services.Node) error {
		n.UUID = rogue.HostUUID()
		if n.Hostname == "" {
			n.Hostname = "rogue"
		}
		if n.Addr == "" {
			n.Addr = realAddr
		}
		return rclt.UpsertNode(ctx, n)
	}

	for name, addr := range map[string]string{
		"auth API":         c.p.Addr(service.ListenerAuth).String(),
		"web port":         c.p.Addr(service.ListenerWeb).String(),
		"victim node":      c.p.Addr(service.ListenerNode).String(),
		"proxy SSH":        c.p.Addr(service.ListenerProxySSH).String(),
		"diagnostics":      c.p.Addr(service.ListenerDiag).String(),
		"unresolvable":     "no-such-host.invalid:22",
		"victim's by name": c.hostname + ":" + strconv.Itoa(c.p.Addr(service.ListenerNode).(*net.TCPAddr).Port),
	} {
		t.Run(name, func(t *testing.T) {
			err := beat(services.Node{Addr: addr})
			require.True(t, trace.IsAccessDenied(err), "%v", err)
			require.Contains(t, err.Error(), "may not announce address "+addr)
			require.Equal(t, realAddr, nodeByUUID(t, clt, rogue.HostUUID()).Addr)
		})
	}

	// Times: whatever the node says, the record carries the server's.
	future := time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)
	before := time.Now()
	require.NoError(t, beat(services.Node{LastHeartbeat: future, Expires: future.Add(24 * time.Hour)}))
	got := nodeByUUID(t, clt, rogue.HostUUID())
	require.WithinRange(t, got.LastHeartbeat, before.Add(-time.Second), time.Now().Add(time.Second))
	require.False(t, got.Expires.After(got.LastHeartbeat.Add(auth.MaxHeartbeatTTL)), "expires %v: a node cannot extend its TTL", got.Expires)

	// Names and labels a join would refuse, refused on the heartbeat too.
	for _, n := range []services.Node{
		{Hostname: c.hostname + "." + clusterName},
		{Hostname: c.p.HostUUID()},
		{Hostname: "10.20.30.40"},
		{Labels: map[string]string{"env": "it\x1b[2J\x1b[H"}},
	} {
		err := beat(n)
		require.True(t, trace.IsBadParameter(err), "%+v: %v", n, err)
	}
	require.Equal(t, "rogue", nodeByUUID(t, clt, rogue.HostUUID()).Hostname)
	c.reachVictim(t)
}

// TestRemoteProxyJoins: a proxy on another machine joins with a proxy
// token and keeps the names a proxy certificate carries (the cluster
// name, localhost, loopback) under a UUID the auth server minted, kept in
// its data dir across a restart.
func TestRemoteProxyJoins(t *testing.T) {
	authDir := t.TempDir()
	a := startProcess(t, procConfig(authDir, config.RoleAuth))
	out := mustPctl(t, authDir, "", "tokens", "add", "--type", "proxy")
	m := joinRe.FindStringSubmatch(out)
	require.NotNil(t, m, "join command in %q", out)

	dir := t.TempDir()
	cfg := procConfig(dir, config.RoleProxy)
	cfg.AuthServer, cfg.Token, cfg.CAPin, cfg.NodeName = a.Addr(service.ListenerAuth).String(), m[1], m[2], "edge-1"
	p := startProcess(t, cfg)
	id, err := auth.ReadIdentity(cfg.IdentityDir(auth.RoleProxy))
	require.NoError(t, err)
	require.Equal(t, p.HostUUID(), id.ID)
	require.NotEqual(t, a.HostUUID(), id.ID)
	for _, want := range []string{id.ID, "edge-1", "edge-1." + clusterName, clusterName, "localhost", "127.0.0.1", "::1"} {
		require.Contains(t, id.SSHCert.ValidPrincipals, want)
	}
	stopProcess(t, p)
	cfg2 := procConfig(dir, config.RoleProxy)
	cfg2.AuthServer, cfg2.NodeName = cfg.AuthServer, "edge-1"
	require.Equal(t, id.ID, startProcess(t, cfg2).HostUUID())
}

// TestNodeRecordRefusedAtStart: a node whose own heartbeat would be
// refused (issue 10 items 5 and 11) does not start, with one line naming
// the problem.
func TestNodeRecordRefusedAtStart(t *testing.T) {
	cfg := procConfig(t.TempDir(), config.RoleAuth, config.RoleNode)
	cfg.Labels = map[string]string{"env": "it\x1b[2J"}
	p, err := service.New(cfg, testOptions())
	require.NoError(t, err)
	err = p.Start(context.Background())
	stopProcess(t, p)
	require.Error(t, err)
	require.Contains(t, err.Error(), `label "env": value "it\x1b[2J" contains the control character U+001B`)
}
