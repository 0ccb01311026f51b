package recording

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
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
	return trace.Wrap(ReplayMarked(ctx, w, cast, speed, clock, nil))
}

// ReplayMarked is Replay calling onMarker (when set) at each marker event
// as playback reaches it: psh says there, outside the replayed output,
// that the hash chain breaks.
func ReplayMarked(ctx context.Context, w io.Writer, cast []byte, speed float64, clock clockwork.Clock, onMarker func(Event) error) error {
	if speed <= 0 {
		return trace.BadParameter("--speed %v: want a positive number", speed)
	}
	_, evs, err := Parse(cast)
	if err != nil {
		return trace.Wrap(err)
	}
	start := clock.Now()
	for _, e := range evs {
		if e.Code == "m" && onMarker != nil {
			// A marker is due when the output before it has been shown.
			if err := onMarker(e); err != nil {
				return trace.Wrap(err)
			}
			continue
		}
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

// InsertMarker returns cast with a marker event, at time t, inserted at
// byte offset at (a line boundary: the end of a chunk). It is how a
// player marks the point a recording's hash chain stops vouching for,
// in every format (a .cast file written with it carries the mark to
// whoever plays it next).
func InsertMarker(cast []byte, at int64, t float64, label string) ([]byte, error) {
	if at <= 0 || at > int64(len(cast)) || cast[at-1] != '\n' {
		return nil, trace.BadParameter("marker offset %d is not the end of a line of a %d-byte recording", at, len(cast))
	}
	line, err := json.Marshal([]any{json.Number(strconv.FormatFloat(t, 'f', 6, 64)), "m", label})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	out := make([]byte, 0, len(cast)+len(line)+1)
	out = append(out, cast[:at]...)
	out = append(out, line...)
	out = append(out, '\n')
	return append(out, cast[at:]...), nil
}
