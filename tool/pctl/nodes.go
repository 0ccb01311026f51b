package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

func (c *cli) registerNodes(app *kingpin.Application, add adder) {
	nodes := app.Command("nodes", "Inspect the node inventory.")
	var format string
	nl := nodes.Command("ls", "List nodes.")
	nl.Flag("format", "text or json.").Default("text").EnumVar(&format, "text", "json")
	add(nl, func(ctx context.Context) error { return c.nodesLs(ctx, format) })

	var uuid string
	nr := nodes.Command("rm", "Remove a node from the inventory (it comes back if it still heartbeats).")
	nr.Arg("uuid", "Node UUID.").Required().StringVar(&uuid)
	add(nr, func(ctx context.Context) error { return c.nodesRm(ctx, uuid) })

	var cluster, target string
	rt := app.Command("route", "Explain how the proxy routes HOST[:PORT]: the candidates, the choice and why. Dials nothing.")
	rt.Flag("cluster", "Cluster (default the local one).").StringVar(&cluster)
	rt.Arg("target", "HOST[:PORT]").Required().StringVar(&target)
	add(rt, func(ctx context.Context) error { return c.route(ctx, cluster, target) })
}

// FormatLabels renders labels as k=v,k2=v2, sorted, as SPEC.md fixes for
// `pctl nodes ls`.
func FormatLabels(labels map[string]string) string {
	parts := make([]string, 0, len(labels))
	for k, v := range labels {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
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
	sort.Slice(nodes, func(i, j int) bool {
		if nodes[i].Hostname != nodes[j].Hostname {
			return nodes[i].Hostname < nodes[j].Hostname
		}
		return nodes[i].UUID < nodes[j].UUID
	})
	if format == "json" {
		if nodes == nil {
			nodes = []services.Node{}
		}
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		return trace.Wrap(enc.Encode(nodes))
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOSTNAME\tUUID\tADDRESS\tLABELS\tLAST HEARTBEAT")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Hostname, n.UUID, n.Addr, FormatLabels(n.Labels), n.LastHeartbeat.UTC().Format(time.RFC3339))
	}
	return trace.Wrap(tw.Flush())
}

func (c *cli) nodesRm(ctx context.Context, uuid string) error {
	clt, id, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	if err := clt.DeleteNode(ctx, id.ClusterName, uuid); err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "Node %s removed.\n", uuid)
	return nil
}
