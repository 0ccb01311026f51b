package main

import (
	"context"
	"io"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

func (c *cli) registerProxies(app *kingpin.Application, add adder) {
	proxies := app.Command("proxies", "Inspect the cluster's proxies.")
	var format string
	pl := proxies.Command("ls", "List the proxies that heartbeat.")
	listFormatFlag(pl, &format)
	add(pl, func(ctx context.Context) error { return c.proxiesLs(ctx, format) })
}

func (c *cli) proxiesLs(ctx context.Context, format string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	proxies, err := clt.GetProxies(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(writeList(c.stdout, format, proxies, func() error { return writeProxiesTable(c.stdout, proxies) }))
}

// writeProxiesTable prints the text form of `pctl proxies ls`.
func writeProxiesTable(w io.Writer, proxies []services.Proxy) error {
	tw := services.NewTable(w, "HOSTNAME", "UUID", "SSH", "WEB", "TUNNEL", "PEER", "VERSION", "LAST HEARTBEAT")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, p := range proxies {
		tw.Row(p.Hostname, p.UUID, dash(p.SSHAddr), dash(p.WebAddr), dash(p.TunnelAddr), dash(p.PeerAddr), dash(p.Version),
			p.LastHeartbeat.UTC().Format(time.RFC3339))
	}
	return trace.Wrap(tw.Flush())
}
