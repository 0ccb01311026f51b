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

	"github.com/postern-dev/postern/lib/events"
)

func (c *cli) registerEvents(app *kingpin.Application, add adder) {
	ev := app.Command("events", "Read the audit log.")
	var since, typ, format string
	var limit int
	ls := ev.Command("ls", "List audit events, oldest first.")
	ls.Flag("since", "A duration back from now (24h) or an RFC 3339 time.").Default("24h").StringVar(&since)
	ls.Flag("type", "Only this event type, e.g. session.start or auth.failed.").StringVar(&typ)
	ls.Flag("limit", "At most this many (the most recent).").Default("1000").IntVar(&limit)
	ls.Flag("format", "text or json (one object per line).").Default("text").EnumVar(&format, "text", "json")
	add(ls, func(ctx context.Context) error { return c.eventsLs(ctx, since, typ, limit, format) })
}

// parseSince accepts "24h" (back from now) or an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, trace.BadParameter("--since %q: want a positive duration", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, trace.BadParameter("--since %q: want a duration like 24h or an RFC 3339 time", s)
	}
	return t, nil
}

func (c *cli) eventsLs(ctx context.Context, since, typ string, limit int, format string) error {
	from, err := parseSince(since, time.Now())
	if err != nil {
		return trace.Wrap(err)
	}
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	found, err := clt.SearchEvents(ctx, from, typ, limit)
	if err != nil {
		return trace.Wrap(err)
	}
	if format == "json" {
		for _, e := range found {
			line, err := json.Marshal(e)
			if err != nil {
				return trace.Wrap(err)
			}
			fmt.Fprintln(c.stdout, string(line))
		}
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tEVENT\tUSER\tDETAILS")
	for _, e := range found {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Time.UTC().Format(time.RFC3339), e.Type, e.User, formatFields(e.Fields))
	}
	return trace.Wrap(tw.Flush())
}

func formatFields(f events.Fields) string {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%v", k, f[k]))
	}
	return strings.Join(parts, " ")
}
