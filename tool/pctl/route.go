package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
)

// route explains a routing decision with the very code the proxy runs: a
// NodeWatcher fed by the auth API's node watch, and a proxy.Router over it
// reading the live networking config. Same data, same code, so `pctl route`
// gives the answer the SSH subsystem, ssh -J and the web terminal get.
func (c *cli) route(ctx context.Context, cluster, target string) error {
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
		Logger:      quiet.WithField("component", "router"),
		Peers:       leaseView(leases),
		// A leaf whose tunnel a proxy leases resolves as a cluster; pctl
		// holds no tunnel of its own.
		Leaves: noLeafTunnels{},
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
