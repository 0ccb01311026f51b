package main

import (
	"context"
	"fmt"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// registerClusters adds the root side of trust: the leaves that spent a
// trusted_cluster token here.
func (c *cli) registerClusters(app *kingpin.Application, add adder) {
	cl := app.Command("clusters", "Leaf clusters of this (root) cluster.")
	var format string
	ls := cl.Command("ls", "List leaf clusters with their status (online while a proxy of this cluster holds a tunnel from the leaf) and last connection.")
	listFormatFlag(ls, &format)
	add(ls, func(ctx context.Context) error { return c.clustersLs(ctx, format) })
	var name string
	rm := cl.Command("rm", "Remove a leaf cluster: its CAs are no longer trusted here.")
	rm.Arg("name", "Leaf cluster name.").Required().StringVar(&name)
	add(rm, func(ctx context.Context) error { return c.clustersRm(ctx, name) })
}

func (c *cli) clustersLs(ctx context.Context, format string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	rcs, err := clt.GetRemoteClusters(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(writeList(c.stdout, format, rcs, func() error {
		tw := services.NewTable(c.stdout, "NAME", "STATUS", "LAST CONNECTED", "TRUSTED SINCE")
		for _, rc := range rcs {
			last := "never"
			if !rc.LastConnected.IsZero() {
				last = rc.LastConnected.UTC().Format(time.RFC3339)
			}
			tw.Row(rc.Name, rc.StatusNow, last, rc.Created.UTC().Format(time.RFC3339))
		}
		return tw.Flush()
	}))
}

func (c *cli) clustersRm(ctx context.Context, name string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	if err := clt.DeleteRemoteCluster(ctx, name); err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "leaf cluster %q removed\n", name)
	return nil
}
