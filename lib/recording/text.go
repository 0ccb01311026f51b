package recording

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/charmbracelet/x/ansi"
	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
)

// RenderText writes a recording's output with the terminal control
// sequences parsed away (charmbracelet/x/ansi's state machine, not a
// regular expression: it knows CSI, OSC, DCS and their terminators), so
// that the result can be grepped. Resizes and markers become lines of
// their own in brackets.
func RenderText(w io.Writer, cast []byte) error {
	_, evs, err := Parse(cast)
	if err != nil {
		return trace.Wrap(err)
	}
	var out strings.Builder
	flush := func() {
		s := ansi.Strip(out.String())
		s = strings.ReplaceAll(s, "\r\n", "\n")
		s = strings.ReplaceAll(s, "\r", "")
		_, _ = io.WriteString(w, s)
		out.Reset()
	}
	for _, e := range evs {
		switch e.Code {
		case "o":
			out.WriteString(e.Data)
		case "r", "m":
			flush()
			kind := "marker"
			if e.Code == "r" {
				kind = "resize"
			}
			fmt.Fprintf(w, "\n[%s %.3fs] %s\n", kind, e.Time, e.Data)
		}
	}
	flush()
	return nil
}

// Replay writes a recording's output to a terminal with its timing,
// speed times faster (speed must be positive).
func Replay(ctx context.Context, w io.Writer, cast []byte, speed float64, clock clockwork.Clock) error {
	if speed <= 0 {
		return trace.BadParameter("--speed %v: want a positive number", speed)
	}
	_, evs, err := Parse(cast)
	if err != nil {
		return trace.Wrap(err)
	}
	start := clock.Now()
	for _, e := range evs {
		if e.Code != "o" {
			continue
		}
		due := start.Add(time.Duration(e.Time / speed * float64(time.Second)))
		if d := due.Sub(clock.Now()); d > 0 {
			select {
			case <-ctx.Done():
				return trace.Wrap(ctx.Err())
			case <-clock.After(d):
			}
		}
		if _, err := io.WriteString(w, e.Data); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}
