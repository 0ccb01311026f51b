package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

func (c *cli) registerEvents(app *kingpin.Application, add adder) {
	ev := app.Command("events", "Read the audit log.")
	var since, typ, format string
	var limit int
	ls := ev.Command("ls", "List audit events, oldest first.")
	ls.Flag("since", "A duration back from now (24h) or an RFC 3339 time.").Default("24h").StringVar(&since)
	ls.Flag("type", "Only this event type, e.g. session.start or auth.failed.").StringVar(&typ)
	ls.Flag("limit", "At most this many (the most recent).").Default("1000").IntVar(&limit)
	formatFlag(ls, &format, "text or json (one object per line).", formatText, formatJSON)
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
	if format == formatJSON {
		for _, e := range found {
			line, err := json.Marshal(e)
			if err != nil {
				return trace.Wrap(err)
			}
			fmt.Fprintln(c.stdout, string(services.SafeJSON(line)))
		}
		return nil
	}
	// Events carry what clients sent (an exec command, the user name of a
	// failed login): the table escapes every cell.
	tw := services.NewTable(c.stdout, "TIME", "EVENT", "USER", "DETAILS")
	for _, e := range found {
		tw.Row(e.Time.UTC().Format(time.RFC3339), e.Type, e.User, formatFields(e.Fields))
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
		// Each key and value escaped on its own, so that a value cannot
		// pass for more key=value pairs with a space or an "=" either.
		parts = append(parts, fieldText(k)+"="+fieldText(fmt.Sprint(f[k])))
	}
	return strings.Join(parts, " ")
}

// fieldText is a key or value of the DETAILS column: escaped, and quoted
// when it holds a space, an "=" or a quote, so that a value cannot pass
// for more key=value pairs either (a command `x user=admin`).
func fieldText(s string) string {
	if e := services.EscapeText(s); e != s || strings.ContainsAny(s, " =\"") {
		return strconv.Quote(s)
	}
	return s
}
