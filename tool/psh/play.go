package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/recording"
)

// psh play checks a recording's hash chain before it plays it, from the
// stored chunks themselves (the recording-chunks subsystem), and says the
// verdict on stderr first: verified, INCOMPLETE (no final chunk: a
// session still running or a node that died; not tampering) or NOT
// VERIFIED, TAMPERED, naming the chunk, byte and time where the chain
// breaks and how.
//
// A tampered recording is not played unless --force is given. A warning
// line before a replay is not enough: a tty replay clears and repaints
// the screen over it, and `--format text > file` or `| grep` hands the
// output on without it, to someone who never saw stderr. Refusing makes
// the operator acknowledge the break; with --force the output carries
// a marker at the break (a line in the text rendering, a marker event in
// the asciicast file, a stderr line the moment a tty replay reaches it),
// and psh still exits 1, so that a script never takes it for a good one.

// brokenMarkerPrefix starts the marker psh puts where the chain breaks.
const brokenMarkerPrefix = "NOT VERIFIED from here on: "

// checkedPlay collects a recording as it streams in: the chain checked
// chunk by chunk, and the asciicast bytes of every chunk that decodes,
// those after the break included (--force plays them).
type checkedPlay struct {
	check recording.Checker
	cast  bytes.Buffer
	tail  recording.ExportTail
	// skipped counts the chunks after the break that do not decode.
	skipped int
}

func newCheckedPlay() *checkedPlay { return &checkedPlay{} }

func (p *checkedPlay) add(c recording.Chunk) error {
	b := p.check.Add(c)
	if b == nil {
		var err error
		if b, err = recording.DecodeChunk(c.Data); err != nil {
			p.skipped++
			return nil
		}
	}
	p.tail.Add(c, b)
	p.cast.Write(b)
	return nil
}

// play says the verdict and plays (or refuses to).
func (c *cli) play(ctx context.Context, id string, p *checkedPlay, opts playOptions) error {
	res := p.check.Result("")
	summary := "psh: recording " + id + " " + res.Summary()
	fmt.Fprintln(c.stderr, summary)
	tampered := res.Err()
	if tampered != nil && !opts.force {
		return trace.BadParameter("recording %s FAILED verification (chunk %d: %s); not playing it (psh play --force plays it anyway, marked where the chain breaks)", id, res.BrokenChunk, res.Problem)
	}
	if err := p.tail.Finish(&p.cast); err != nil {
		return trace.Wrap(err)
	}
	cast := p.cast.Bytes()
	breakLine := ""
	if tampered != nil {
		label := fmt.Sprintf("%sthe hash chain breaks at chunk %d (%s): %s", brokenMarkerPrefix, res.BrokenChunk, res.Problem, res.Reason)
		if p.skipped > 0 {
			label += fmt.Sprintf("; %d chunks after it do not decode and are left out", p.skipped)
		}
		breakLine = fmt.Sprintf("psh: playback reached chunk %d of recording %s, where the hash chain breaks (%s): what follows is NOT VERIFIED", res.BrokenChunk, id, res.Problem)
		at := res.Bytes
		if at == 0 {
			// Chunk 0 itself is wrong: mark right after the header, the
			// first place a marker can go.
			at = int64(bytes.IndexByte(cast, '\n') + 1)
		}
		if at > 0 && at <= int64(len(cast)) {
			marked, err := recording.InsertMarker(cast, at, res.Until, label)
			if err != nil {
				return trace.Wrap(err)
			}
			cast = marked
		}
	}
	var err error
	switch opts.format {
	case "asciicast":
		_, err = c.stdout.Write(cast)
	case "text":
		err = recording.RenderText(c.stdout, cast)
	default:
		err = recording.ReplayMarked(ctx, c.stdout, cast, opts.speed, clockwork.NewRealClock(), func(e recording.Event) error {
			var line string
			switch {
			case strings.HasPrefix(e.Data, brokenMarkerPrefix):
				line = breakLine
			case e.Data == recording.IncompleteMarker:
				line = "psh: playback reached the end of what was recorded: the recording is INCOMPLETE (no final chunk)"
			default:
				return nil
			}
			// The replayed output may have left colours or a hidden
			// cursor behind: reset them so the line is readable.
			if _, err := fmt.Fprint(c.stdout, terminalReset); err != nil {
				return trace.Wrap(err)
			}
			fmt.Fprintln(c.stderr, line)
			return nil
		})
		if err == nil {
			// The replay painted over the first line: say it again.
			fmt.Fprint(c.stdout, terminalReset)
			fmt.Fprintln(c.stderr, summary)
		}
	}
	if err != nil {
		return trace.Wrap(err)
	}
	if tampered != nil {
		return trace.BadParameter("recording %s FAILED verification: chunk %d: %s (played because of --force)", id, res.BrokenChunk, res.Reason)
	}
	return nil
}

// terminalReset resets colours and attributes, shows the cursor and ends
// the line: what a line printed mid-replay needs to be read.
const terminalReset = "\x1b[0m\x1b[?25h\r\n"
