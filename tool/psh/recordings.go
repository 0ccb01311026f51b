package main

import (
	"bytes"
	"context"
	"fmt"
	"github.com/postern-dev/postern/lib/services"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/client"
	"github.com/postern-dev/postern/lib/recording"
)

// playTimeout bounds fetching one recording: generous, a recording may be
// hundreds of MiB.
const playTimeout = 10 * time.Minute

func (c *cli) addRecordings(app *kingpin.Application, add func(*kingpin.CmdClause, func(context.Context) error)) {
	rec := app.Command("recordings", "Session recordings you may see (your own; all with review_recordings).")
	var format string
	var f recordingFilter
	ls := rec.Command("ls", "List recordings, oldest first.")
	ls.Flag("format", "Output format: text or json.").Default("text").EnumVar(&format, "text", "json")
	ls.Flag("since", "Only recordings started within this long, e.g. 24h.").DurationVar(&f.since)
	ls.Flag("user", "Only this user's recordings.").StringVar(&f.user)
	ls.Flag("node", "Only recordings on this node (hostname or UUID).").StringVar(&f.node)
	add(ls, func(ctx context.Context) error { return c.doRecordingsLs(ctx, format, f) })

	var id, playFormat string
	var speed float64
	var force bool
	var rest []string
	play := app.Command("play", "Play a session recording: psh play ID [--speed N] [--format tty|text|asciicast] [--force]. "+
		"The hash chain is checked first and the result printed to stderr; a tampered recording is not played without --force.")
	addPlayFlags := func(cc interface {
		Flag(name, help string) *kingpin.FlagClause
	}) {
		cc.Flag("speed", "Replay this many times faster (tty format).").Default("1").Float64Var(&speed)
		cc.Flag("format", "tty (replay with timing), text (output with control sequences rendered away, for grep) or asciicast (the v2 file).").
			Default("tty").EnumVar(&playFormat, "tty", "text", "asciicast")
		cc.Flag("force", "Play a recording whose hash chain is broken (tampered) anyway, marked where the chain breaks; psh still exits 1.").BoolVar(&force)
	}
	addPlayFlags(play)
	play.Arg("id", "Session id (psh recordings ls).").Required().StringVar(&id)
	// psh parses without interspersed flags (what follows `psh ssh HOST`
	// is the remote command's), so flags after the id arrive here and are
	// parsed by a parser of their own.
	play.Arg("flags", "--speed, --format and --force may also follow the id.").StringsVar(&rest)
	add(play, func(ctx context.Context) error {
		if len(rest) > 0 {
			sub := kingpin.New("psh play", "")
			addPlayFlags(sub)
			if _, err := sub.Parse(rest); err != nil {
				return trace.BadParameter("psh play: %v", err)
			}
		}
		return c.doPlay(ctx, id, playOptions{format: playFormat, speed: speed, force: force})
	})
}

// recordingFilter narrows psh recordings ls (the proxy has already
// applied RBAC: these only narrow what the user may see).
type recordingFilter struct {
	since      time.Duration
	user, node string
}

func (f recordingFilter) keep(r proxyapi.RecordingEntry, now time.Time) bool {
	if f.since > 0 && r.Started.Before(now.Add(-f.since)) {
		return false
	}
	if f.user != "" && r.User != f.user {
		return false
	}
	return f.node == "" || r.Node == f.node
}

func (c *cli) doRecordingsLs(ctx context.Context, format string, f recordingFilter) error {
	if f.since < 0 {
		return trace.BadParameter("--since %v: want a positive duration such as 24h", f.since)
	}
	_, creds, err := c.credentials()
	if err != nil {
		return trace.Wrap(err)
	}
	ctx, cancel := context.WithTimeout(ctx, client.DialTimeout*2)
	defer cancel()
	all, err := client.ListRecordings(ctx, creds)
	if err != nil {
		return trace.Wrap(err)
	}
	list := all[:0]
	now := timeNow()
	for _, r := range all {
		if f.keep(r, now) {
			list = append(list, r)
		}
	}
	if format == "json" {
		return trace.Wrap(writeJSON(c, list))
	}
	// The command and the login are what a user typed: the table
	// escapes every cell.
	tw := services.NewTable(c.stdout, "ID", "STARTED", "USER", "LOGIN", "NODE", "COMPLETE", "COMMAND")
	for _, r := range list {
		tw.Row(r.SessionID, r.Started.Format(time.RFC3339), r.User, r.Login, r.Node, r.Complete, r.Command)
	}
	return trace.Wrap(tw.Flush())
}

// playOptions are psh play's flags.
type playOptions struct {
	format string
	speed  float64
	force  bool
}

func (c *cli) doPlay(ctx context.Context, id string, opts playOptions) error {
	if err := recording.CheckSessionID(id); err != nil {
		return trace.Wrap(err)
	}
	if opts.speed <= 0 {
		return trace.BadParameter("--speed %v: want a positive number", opts.speed)
	}
	_, creds, err := c.credentials()
	if err != nil {
		return trace.Wrap(err)
	}
	fetchCtx, cancel := context.WithTimeout(ctx, playTimeout)
	defer cancel()
	p := newCheckedPlay()
	err = client.FetchRecordingChunks(fetchCtx, creds, id, p.add)
	if client.ChunksUnsupported(err) {
		return trace.Wrap(c.playUnchecked(ctx, fetchCtx, creds, id, opts))
	}
	if err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(c.play(ctx, id, p, opts))
}

// playUnchecked plays through a proxy older than psh, which serves the
// cast only: it plays as it always did, saying first that nothing was
// checked (the proxy is trusted; the store is what the chain guards).
func (c *cli) playUnchecked(ctx, fetchCtx context.Context, creds *client.Credentials, id string, opts playOptions) error {
	fmt.Fprintf(c.stderr, "psh: recording %s NOT VERIFIED: the proxy is older than psh and does not serve a recording's chunks, so its hash chain could not be checked (pctl recordings verify can)\n", id)
	if opts.format == "asciicast" {
		return trace.Wrap(client.FetchRecording(fetchCtx, creds, id, c.stdout))
	}
	var cast bytes.Buffer
	if err := client.FetchRecording(fetchCtx, creds, id, &cast); err != nil {
		return trace.Wrap(err)
	}
	if opts.format == "text" {
		return trace.Wrap(recording.RenderText(c.stdout, cast.Bytes()))
	}
	return trace.Wrap(recording.Replay(ctx, c.stdout, cast.Bytes(), opts.speed, clockwork.NewRealClock()))
}
