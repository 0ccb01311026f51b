package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

func (c *cli) registerProxies(app *kingpin.Application, add adder) {
	proxies := app.Command("proxies", "Inspect the cluster's proxies.")
	var format string
	pl := proxies.Command("ls", "List the proxies that heartbeat.")
	pl.Flag("format", "text or json.").Default("text").EnumVar(&format, "text", "json")
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
	if format == "json" {
		if proxies == nil {
			proxies = []services.Proxy{}
		}
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		return trace.Wrap(enc.Encode(proxies))
	}
	return trace.Wrap(writeProxiesTable(c.stdout, proxies))
}

// writeProxiesTable prints the text form of `pctl proxies ls`.
func writeProxiesTable(w io.Writer, proxies []services.Proxy) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOSTNAME\tUUID\tSSH\tWEB\tTUNNEL\tPEER\tVERSION\tLAST HEARTBEAT")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return services.EscapeText(s)
	}
	for _, p := range proxies {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", services.EscapeText(p.Hostname), services.EscapeText(p.UUID),
			dash(p.SSHAddr), dash(p.WebAddr), dash(p.TunnelAddr), dash(p.PeerAddr), dash(p.Version),
			p.LastHeartbeat.UTC().Format(time.RFC3339))
	}
	return trace.Wrap(tw.Flush())
}
