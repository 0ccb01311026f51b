package main

import (
	"context"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/sessionapi"
	"github.com/postern-dev/postern/lib/client"
	"github.com/postern-dev/postern/lib/services"
)

// listSessionsTimeout bounds asking every node for its joinable sessions.
const listSessionsTimeout = 30 * time.Second

func (c *cli) addSessions(app *kingpin.Application, add func(*kingpin.CmdClause, func(context.Context) error)) {
	sessions := app.Command("sessions", "Live sessions you may join.")
	var format, cluster string
	ls := sessions.Command("ls", "List the live interactive sessions your roles may join (join_sessions), oldest first.")
	ls.Flag("format", "Output format: text or json.").Default("text").EnumVar(&format, "text", "json")
	ls.Flag("cluster", "Cluster whose sessions to list (default: the proxy's).").StringVar(&cluster)
	add(ls, func(ctx context.Context) error { return c.doSessionsLs(ctx, format, cluster) })

	var id, mode, joinCluster string
	join := app.Command("join", "Join a live session: observer sees it, peer may type, moderator may type and end it (Ctrl-] t). Ctrl-] . leaves.")
	join.Flag("mode", "observer, peer or moderator.").Default("observer").EnumVar(&mode, "observer", "peer", "moderator")
	join.Flag("cluster", "Cluster of the session's node (default: the proxy's).").StringVar(&joinCluster)
	join.Arg("id", "Session id (psh sessions ls; SSH_SESSION_ID in the session).").Required().StringVar(&id)
	add(join, func(ctx context.Context) error { return c.doJoin(ctx, id, mode, joinCluster) })
}

func (c *cli) doSessionsLs(ctx context.Context, format, cluster string) error {
	_, creds, err := c.credentials()
	if err != nil {
		return trace.Wrap(err)
	}
	ctx, cancel := context.WithTimeout(ctx, listSessionsTimeout)
	defer cancel()
	list, err := client.ListSessions(ctx, creds, cluster)
	if err != nil {
		return trace.Wrap(err)
	}
	if format == "json" {
		if list == nil {
			list = []client.SessionEntry{}
		}
		return trace.Wrap(writeJSON(c, list))
	}
	tw := services.NewTable(c.stdout, "ID", "USER", "LOGIN", "NODE", "STARTED", "PARTICIPANTS")
	for _, s := range list {
		tw.Row(s.ID, s.User, s.Login, s.Node, s.Started.Format(time.RFC3339), strings.Join(s.Participants, ", "))
	}
	return trace.Wrap(tw.Flush())
}

func (c *cli) doJoin(ctx context.Context, id, mode, cluster string) error {
	_, creds, err := c.credentials()
	if err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(client.JoinSession(ctx, creds, client.JoinConfig{
		SessionID: id, Mode: sessionapi.Mode(mode), Cluster: cluster,
		Stdin: c.stdin, Stdout: c.stdout, Stderr: c.stderr,
	}))
}
