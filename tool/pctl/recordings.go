package main

import (
	"context"
	"fmt"
	"github.com/postern-dev/postern/lib/services"
	"io"
	"os"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/utils"
)

func (c *cli) registerRecordings(app *kingpin.Application, add adder) {
	rec := app.Command("recordings", "Session recordings.")
	var lsFormat string
	rl := rec.Command("ls", "List recordings, oldest first.")
	listFormatFlag(rl, &lsFormat)
	add(rl, func(ctx context.Context) error { return c.recordingsLs(ctx, lsFormat) })
	var id, out, dir, hash string
	ex := rec.Command("export", "Write a recording as an asciicast v2 file.")
	ex.Arg("id", "Session id.").Required().StringVar(&id)
	ex.Flag("out", "File to write (default: stdout).").StringVar(&out)
	add(ex, func(ctx context.Context) error { return c.recordingsExport(ctx, id, out) })
	ve := rec.Command("verify", "Check a recording's hash chain against the final hash in its session.end event.")
	ve.Arg("id", "Session id.").Required().StringVar(&id)
	ve.Flag("dir", "Verify offline: a recordings directory (the auth server's DATA_DIR/auth/recordings) instead of asking auth.").StringVar(&dir)
	ve.Flag("hash", "The expected final hash (default: read from the audit log; with --dir, none).").StringVar(&hash)
	add(ve, func(ctx context.Context) error { return c.recordingsVerify(ctx, id, dir, hash) })
}

func (c *cli) recordingsLs(ctx context.Context, format string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	list, err := clt.ListRecordings(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	// The command and the login are what the user typed: the table
	// escapes every cell.
	return trace.Wrap(writeList(c.stdout, format, list, func() error {
		tw := services.NewTable(c.stdout, "ID", "STARTED", "USER", "LOGIN", "NODE", "CHUNKS", "COMPLETE", "COMMAND")
		for _, m := range list {
			node := m.NodeHostname
			if node == "" {
				node = m.Node
			}
			tw.Row(m.SessionID, time.Unix(m.Timestamp, 0).UTC().Format(time.RFC3339), m.User, m.Login, node, m.Chunks, m.Complete, m.Command)
		}
		return tw.Flush()
	}))
}

// fetchChunks reads a recording from auth.
func (c *cli) fetchChunks(ctx context.Context, id string) ([]recording.Chunk, error) {
	if err := recording.CheckSessionID(id); err != nil {
		return nil, trace.Wrap(err)
	}
	clt, _, err := c.connect(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	defer clt.Close()
	var chunks []recording.Chunk
	err = clt.GetRecording(ctx, id, func(ch recording.Chunk) error {
		chunks = append(chunks, ch)
		return nil
	})
	return chunks, trace.Wrap(err)
}

func (c *cli) recordingsExport(ctx context.Context, id, out string) error {
	chunks, err := c.fetchChunks(ctx, id)
	if err != nil {
		return trace.Wrap(err)
	}
	var w io.Writer = c.stdout
	if out != "" {
		f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return trace.ConvertSystemError(err)
		}
		defer f.Close()
		w = f
	}
	return trace.Wrap(recording.Export(w, chunks))
}

// auditedHash finds the final hash session.end recorded for id ("" when
// there is none: the session has not ended, or the node died).
func (c *cli) auditedHash(ctx context.Context, id string) (string, error) {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return "", trace.Wrap(err)
	}
	defer clt.Close()
	found, err := clt.SearchEvents(ctx, time.Time{}, events.SessionEnd, 10000)
	if err != nil {
		return "", trace.Wrap(err)
	}
	for _, e := range found {
		if e.Fields[events.FieldSessionID] == id {
			h, _ := e.Fields[events.FieldRecordingHash].(string)
			return h, nil
		}
	}
	return "", nil
}

func (c *cli) recordingsVerify(ctx context.Context, id, dir, hash string) error {
	if err := recording.CheckSessionID(id); err != nil {
		return trace.Wrap(err)
	}
	var chunks []recording.Chunk
	var err error
	if dir != "" {
		chunks, err = recording.GetChunks(ctx, recording.DirStorage{Dir: dir}, id)
	} else {
		chunks, err = c.fetchChunks(ctx, id)
		if err == nil && hash == "" {
			hash, err = c.auditedHash(ctx, id)
		}
	}
	if err != nil {
		return trace.Wrap(err)
	}
	res, err := recording.Verify(chunks, hash)
	if err != nil {
		return trace.BadParameter("recording %s FAILED verification: %s", id, utils.UserMessage(err))
	}
	state := "complete"
	if !res.Complete {
		state = "INCOMPLETE (no final chunk: the session is still running or its node stopped)"
	}
	against := "against the audited final hash"
	if hash == "" {
		against = "(no audited final hash to check against)"
	}
	fmt.Fprintf(c.stdout, "recording %s OK: %d chunks, hash chain intact %s, %s\nfinal hash %s\n", id, res.Chunks, against, state, res.FinalHash)
	return nil
}
