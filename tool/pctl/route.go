package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/client"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// route explains a routing decision with the very code the proxy runs: a
// NodeWatcher fed by the auth API's node watch, and a proxy.Router over it
// reading the live networking config. Same data, same code, so `pctl route`
// gives the answer the SSH subsystem, ssh -J and the web terminal get.
//
// With user set it is that user's view instead, asked of a proxy (see
// routeAsUser): the only way to explain a leaf cluster's part, since the
// leaf answers a root user, never the root's admin.
func (c *cli) route(ctx context.Context, cluster, user, target string) error {
	t, err := proxy.ParseTarget(target)
	if err != nil {
		return trace.Wrap(err)
	}
	t.Cluster = cluster
	clt, id, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	if user != "" {
		return c.routeAsUser(ctx, clt, id.ClusterName, user, t)
	}
	quiet := logrus.New()
	quiet.SetLevel(logrus.WarnLevel)
	quiet.SetOutput(c.stdout)
	nw, err := services.NewNodeWatcher(services.NodeWatcherConfig{Events: clt, Logger: quiet.WithField("component", "nodewatcher")})
	if err != nil {
		return trace.Wrap(err)
	}
	defer nw.Close()
	if err := nw.WaitSynced(ctx); err != nil {
		return trace.Wrap(err, "loading the node inventory")
	}
	// Where tunnels live, so that a tunnel node reads "via peer PROXY":
	// pctl holds no tunnel, so every proxy holding one is such a peer.
	leases, err := clt.GetTunnelConnections(ctx)
	if err != nil {
		return trace.Wrap(err, "reading tunnel locations")
	}
	router, err := proxy.NewRouter(proxy.RouterConfig{
		ClusterName: id.ClusterName,
		NodeWatcher: nw,
		Networking:  clt,
		Peers:       leaseView(leases),
		// A leaf whose tunnel a proxy leases resolves as a cluster; pctl
		// holds no tunnel of its own.
		Leaves: noLeafTunnels{},
		Deps:   observe.Deps{Logger: quiet.WithField("component", "router")},
	})
	if err != nil {
		return trace.Wrap(err)
	}
	e := router.ExplainTarget(ctx, t)
	fmt.Fprint(c.stdout, e.String())
	// What the root knows of a leaf: its record (an offline leaf, whose
	// tunnel no proxy holds, is not routed to at all).
	cluster = e.Cluster
	if e.Error != "" && t.Cluster != "" && t.Cluster != id.ClusterName {
		cluster = t.Cluster
	}
	if cluster != id.ClusterName {
		if rcs, err := clt.GetRemoteClusters(ctx); err == nil {
			for _, rc := range rcs {
				if strings.EqualFold(rc.Name, cluster) {
					last := "never"
					if !rc.LastConnected.IsZero() {
						last = rc.LastConnected.UTC().Format(time.RFC3339)
					}
					fmt.Fprintf(c.stdout, "leaf:       %s is a leaf cluster of %s, %s (last connected %s)\n", rc.Name, id.ClusterName, rc.StatusNow, last)
				}
			}
		}
	}
	if e.Error != "" {
		return trace.NotFound("no route to %s", t.String())
	}
	if e.Leaf {
		// The root's part is all an admin of the root may see: the leaf
		// decides what a root user sees there, through its role_map.
		return trace.BadParameter("cluster %q is a leaf cluster: its Router picks the node, and it explains that only to a root user; add --user NAME to see it as NAME does", e.Cluster)
	}
	return nil
}

// routeCertTTL is the lifetime of the certificate routeAsUser has signed
// for the user: one explanation, then useless.
const routeCertTTL = time.Minute

// maxRouteAnswer bounds the `route:` subsystem answer read (a leaf's part
// is bounded by proxyapi.MaxLeafExplanation).
const maxRouteAnswer = 8 << 20

// routeAsUser explains t as user sees it: the root auth signs a
// routeCertTTL certificate of user for a fresh key (audited like any
// certificate issued; the admin may sign one with `pctl auth sign`
// anyway), and with it pctl opens the `route:` subsystem on a proxy of
// this cluster whose host certificate the cluster's host CA signed. The
// proxy explains its part and, for a leaf, relays the leaf's own
// explanation for the user's mapped roles (only nodes they may see). A
// cluster the user may not reach is `cluster "X" not found`, as for an
// unknown one.
func (c *cli) routeAsUser(ctx context.Context, clt *auth.Client, local, user string, t proxy.Target) error {
	priv, pub, err := utils.GenerateKeyPair()
	if err != nil {
		return trace.Wrap(err)
	}
	certBytes, err := clt.GenerateUserCert(ctx, authapi.UserCertRequest{User: user, PublicKey: pub, TTL: routeCertTTL})
	if err != nil {
		return trace.Wrap(err, "signing a certificate of user %q", user)
	}
	signer, err := ssh.ParsePrivateKey(priv)
	if err != nil {
		return trace.Wrap(err)
	}
	k, _, _, _, err := ssh.ParseAuthorizedKey(certBytes)
	if err != nil {
		return trace.BadParameter("the auth server sent an unreadable certificate: %v", err)
	}
	cert, ok := k.(*ssh.Certificate)
	if !ok {
		return trace.BadParameter("the auth server sent a plain key, not a certificate")
	}
	certSigner, err := ssh.NewCertSigner(cert, signer)
	if err != nil {
		return trace.Wrap(err)
	}
	hostCA, err := clt.GetCertAuthority(ctx, local, services.HostCA, false)
	if err != nil {
		return trace.Wrap(err)
	}
	var cas []ssh.PublicKey
	for _, line := range hostCA.SSHPublicKeys {
		ca, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			return trace.BadParameter("the cluster's host CA holds an unreadable key: %v", err)
		}
		cas = append(cas, ca)
	}
	proxies, err := clt.GetProxies(ctx)
	if err != nil {
		return trace.Wrap(err, "listing proxies")
	}
	// The freshest heartbeat first: the likeliest to answer.
	slices.SortFunc(proxies, func(a, b services.Proxy) int { return b.LastHeartbeat.Compare(a.LastHeartbeat) })
	var pc *ssh.Client
	var via services.Proxy
	var errs []error
	for _, p := range proxies {
		if p.SSHAddr == "" {
			continue
		}
		creds := &client.Credentials{
			Profile: &client.Profile{ProxySSH: p.SSHAddr, Cluster: local}, Signer: certSigner, Cert: cert,
			// The proxy must prove it is one of this cluster's.
			HostKeyCallback: authz.HostKeyCallback(cas, nil),
		}
		if pc, err = client.DialProxy(ctx, creds); err == nil {
			via = p
			break
		}
		errs = append(errs, trace.Wrap(err, "proxy %s", p.Hostname))
	}
	if pc == nil {
		if len(errs) == 0 {
			return trace.NotFound("no proxy of cluster %q serves an SSH port to ask", local)
		}
		return trace.NewAggregate(errs...)
	}
	defer pc.Close()
	sub := t
	if sub.Cluster != "" && sub.Port == "" {
		sub.Port = "0" // the grammar wants a port with @CLUSTER; 0 is any
	}
	ch, err := client.OpenSubsystem(ctx, pc, client.SubsystemConfig{Name: proxyapi.SubsystemRoutePrefix + sub.String()})
	if err != nil {
		return trace.Wrap(err)
	}
	defer ch.Close()
	stop := context.AfterFunc(ctx, func() { ch.Close() })
	defer stop()
	out, err := io.ReadAll(io.LimitReader(ch, maxRouteAnswer))
	if err != nil {
		return trace.ConnectionProblem(err, "reading the explanation: %v", err)
	}
	if len(out) == 0 {
		// Refused before anything was explained: an unknown cluster, one
		// the user may not reach, a malformed target.
		msg := ch.Explain()
		if msg == "" {
			msg = "the proxy explained nothing"
		}
		return trace.NotFound("as user %q: %s", user, msg)
	}
	fmt.Fprintf(c.stdout, "as user:    %s (a %s certificate, asked of proxy %s)\n", services.EscapeText(user), routeCertTTL, services.EscapeText(via.Hostname))
	// The proxy's text escapes node and leaf text already; escape
	// again whatever would still drive a terminal.
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		fmt.Fprintln(c.stdout, services.EscapeText(line))
	}
	byRequest, err := c.explainRequests(ctx, clt, user, t)
	if err != nil {
		return trace.Wrap(err)
	}
	if ch.ExitStatus() > 0 && !byRequest {
		return trace.NotFound("no route to %s as user %q", t.String(), user)
	}
	return nil
}

// noLeafTunnels: pctl holds no leaf tunnel; leases say where they are.
type noLeafTunnels struct{}

func (noLeafTunnels) LeafName(string) (string, bool) { return "", false }

func (noLeafTunnels) DialLeaf(context.Context, string, string, string) (net.Conn, error) {
	return nil, trace.NotImplemented("pctl route explains routes; it does not dial")
}

// leaseView answers the Router's PeerHolders from a snapshot of the
// tunnel leases; pctl explains routes and never dials through a peer.
type leaseView []services.TunnelConnection

func (l leaseView) PeerHolders(node string) []string {
	var out []string
	for _, tc := range l {
		if tc.NodeUUID == node {
			out = append(out, tc.ProxyUUID)
		}
	}
	return out
}

func (leaseView) PeerLocated(string) <-chan struct{} { return nil }

func (leaseView) DialPeer(context.Context, string, string, string, string) (net.Conn, error) {
	return nil, trace.NotImplemented("pctl route explains routes; it does not dial")
}
