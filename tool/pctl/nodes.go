package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

func (c *cli) registerNodes(app *kingpin.Application, add adder) {
	nodes := app.Command("nodes", "Inspect the node inventory.")
	var format string
	nl := nodes.Command("ls", "List nodes.")
	listFormatFlag(nl, &format)
	add(nl, func(ctx context.Context) error { return c.nodesLs(ctx, format) })

	var name string
	nr := nodes.Command("rm", "Remove a node from the inventory (a Postern node comes back if it still heartbeats).")
	nr.Arg("node", "Node UUID, or the hostname of exactly one node.").Required().StringVar(&name)
	add(nr, func(ctx context.Context) error { return c.nodesRm(ctx, name) })
	c.registerOpenSSH(nodes, add)

	var cluster, target, user string
	rt := app.Command("route", "Explain how the proxy routes HOST[:PORT]: the candidates, the choice and why. Dials nothing.")
	rt.Flag("cluster", "Cluster (default the local one).").StringVar(&cluster)
	rt.Flag("user", "Explain it as this user sees it, through a root proxy with a 1-minute certificate of theirs: needed for a leaf cluster, whose Router explains its part for that user only.").StringVar(&user)
	rt.Arg("target", "HOST[:PORT]").Required().StringVar(&target)
	add(rt, func(ctx context.Context) error { return c.route(ctx, cluster, user, target) })
}

func (c *cli) nodesLs(ctx context.Context, format string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	nodes, err := clt.GetNodes(ctx, "")
	if err != nil {
		return trace.Wrap(err)
	}
	proxies, err := clt.GetProxies(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	sort.Slice(nodes, func(i, j int) bool {
		if nodes[i].Hostname != nodes[j].Hostname {
			return nodes[i].Hostname < nodes[j].Hostname
		}
		return nodes[i].UUID < nodes[j].UUID
	})
	return trace.Wrap(writeList(c.stdout, format, nodes, func() error { return writeNodesTable(c.stdout, nodes, proxies) }))
}

// Node statuses in `pctl nodes ls`.
const (
	nodeOnline  = "online"
	nodeOffline = "offline"
	nodeUnknown = "unknown"
)

// nodeStatus is what the STATUS column says of n. A Postern node is in
// the inventory only while it heartbeats: online. An OpenSSH node sends
// nothing; the proxies check it and list the ones that do not answer in
// their own records (offline_openssh), so it is offline when every live
// proxy says so (a node that no proxy can reach is useless to everyone,
// one that some proxy reaches is up), and unknown when no proxy is live.
func nodeStatus(n services.Node, proxies []services.Proxy) string {
	if !n.IsOpenSSH() {
		return nodeOnline
	}
	if len(proxies) == 0 {
		return nodeUnknown
	}
	for _, p := range proxies {
		if !slices.Contains(p.OfflineOpenSSH, n.UUID) {
			return nodeOnline
		}
	}
	return nodeOffline
}

// writeNodesTable prints the text form of `pctl nodes ls`.
func writeNodesTable(w io.Writer, nodes []services.Node, proxies []services.Proxy) error {
	// Node-supplied text is escaped (by the table, and label by label by
	// FormatLabels): a label or hostname must not drive the admin's
	// terminal.
	tw := services.NewTable(w, "HOSTNAME", "UUID", "ADDRESS", "LABELS", "LAST HEARTBEAT", "KIND", "STATUS")
	for _, n := range nodes {
		kind, heartbeat := services.NodeKindPostern, n.LastHeartbeat.UTC().Format(time.RFC3339)
		if n.IsOpenSSH() {
			// A stock sshd never heartbeats: the proxies check it.
			kind, heartbeat = services.NodeKindOpenSSH, "-"
		}
		tw.Row(n.Hostname, n.UUID, services.NodeAddrText(n.Addr, n.Tunnel), services.FormatLabels(n.Labels), heartbeat, kind, nodeStatus(n, proxies))
	}
	return trace.Wrap(tw.Flush())
}

// nodesRm removes a node named by UUID or by its hostname: an OpenSSH
// node's UUID is one nobody types (auth made it up at add-openssh).
func (c *cli) nodesRm(ctx context.Context, name string) error {
	clt, id, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	node, err := findNode(ctx, clt, id.ClusterName, name, false)
	if err != nil {
		return trace.Wrap(err)
	}
	if err := clt.DeleteNode(ctx, id.ClusterName, node.UUID); err != nil {
		return trace.Wrap(err)
	}
	if node.UUID == name {
		fmt.Fprintf(c.stdout, "Node %s removed.\n", node.UUID)
	} else {
		fmt.Fprintf(c.stdout, "Node %s (%s) removed.\n", services.EscapeText(node.Hostname), node.UUID)
	}
	return nil
}
