package recording

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/gravitational/trace"
)

// Seeking. A player that jumps to 90% of a long recording must not read
// the 90% before it. Each chunk is summarised once (SummarizeChunk: the
// times of its first and last event, its markers, the terminal size it
// ends with, how much output it holds), and the summaries are the seek
// index: the chunk holding a time is found from the index alone, and only
// that chunk and a bounded stretch before it (the warm-up that rebuilds
// the screen) are read.

// Marker is one "m" event: its time and label.
type Marker struct {
	Time  float64
	Label string
}

// ChunkSummary is what the seek index knows of one chunk.
type ChunkSummary struct {
	Index int
	// Events counts the event lines (the header is not one).
	Events int
	// First and Last are the times of the first and last event; zero
	// without events.
	First, Last float64
	Markers     []Marker
	// Cols and Rows are the terminal size after the chunk's last resize;
	// zero when the chunk has none.
	Cols, Rows uint32
	// OutputBytes is the size of the chunk's "o" lines as stored.
	OutputBytes int
}

// EventLine is one event line as stored, with its time and code read.
type EventLine struct {
	Time float64
	Code string
	// Raw is the whole JSON line without its newline: [time, code, data].
	Raw []byte
}

// ChunkLines splits a decoded chunk into its event lines. The first
// chunk's first line is the header; it is returned separately (nil for
// other chunks). Only the time and code of each line are parsed: the data
// stays as stored, so a segment is served without re-encoding it.
func ChunkLines(decoded []byte, first bool) (header []byte, lines []EventLine, err error) {
	rest := decoded
	if first {
		h, r, ok := bytes.Cut(rest, []byte("\n"))
		if !ok {
			return nil, nil, trace.BadParameter("first chunk has no header line")
		}
		header, rest = h, r
	}
	for n := 1; len(rest) > 0; n++ {
		line, r, _ := bytes.Cut(rest, []byte("\n"))
		rest = r
		if len(line) == 0 {
			continue
		}
		t, code, err := eventHead(line)
		if err != nil {
			return nil, nil, trace.BadParameter("event line %d: %v", n, err)
		}
		lines = append(lines, EventLine{Time: t, Code: code, Raw: line})
	}
	return header, lines, nil
}

// eventHead reads `[TIME,"C",` from the front of an event line, as the
// Writer writes it (json.Marshal: no spaces).
func eventHead(line []byte) (float64, string, error) {
	if len(line) < 2 || line[0] != '[' {
		return 0, "", fmt.Errorf("not an asciicast event")
	}
	comma := bytes.IndexByte(line, ',')
	if comma < 0 {
		return 0, "", fmt.Errorf("not an asciicast event")
	}
	t, err := strconv.ParseFloat(string(bytes.TrimSpace(line[1:comma])), 64)
	if err != nil || t < 0 {
		return 0, "", fmt.Errorf("bad event time %q", line[1:comma])
	}
	rest := bytes.TrimLeft(line[comma+1:], " ")
	if len(rest) < 4 || rest[0] != '"' || rest[2] != '"' {
		return 0, "", fmt.Errorf("bad event code")
	}
	return t, string(rest[1:2]), nil
}

// EventData decodes an event line's data string.
func EventData(raw []byte) (string, error) {
	var ev [3]json.RawMessage
	if err := json.Unmarshal(raw, &ev); err != nil {
		return "", trace.BadParameter("event line: %v", err)
	}
	var s string
	if err := json.Unmarshal(ev[2], &s); err != nil {
		return "", trace.BadParameter("event data: %v", err)
	}
	return s, nil
}

// ParseSize reads a resize event's "COLSxROWS".
func ParseSize(s string) (uint32, uint32, error) {
	var c, r uint32
	if _, err := fmt.Sscanf(s, "%dx%d", &c, &r); err != nil || c == 0 || r == 0 {
		return 0, 0, trace.BadParameter("resize %q: want COLSxROWS", s)
	}
	return c, r, nil
}

// SummarizeChunk summarises chunk c (DecodeChunk checks it first); the
// header is returned for chunk 0.
func SummarizeChunk(c Chunk) (ChunkSummary, *Header, error) {
	b, err := DecodeChunk(c.Data)
	if err != nil {
		return ChunkSummary{}, nil, trace.Wrap(err, "chunk %d", c.Index)
	}
	hline, lines, err := ChunkLines(b, c.Index == 0)
	if err != nil {
		return ChunkSummary{}, nil, trace.Wrap(err, "chunk %d", c.Index)
	}
	var h *Header
	if hline != nil {
		h = new(Header)
		if err := json.Unmarshal(hline, h); err != nil {
			return ChunkSummary{}, nil, trace.BadParameter("recording header: %v", err)
		}
	}
	s := ChunkSummary{Index: c.Index, Events: len(lines)}
	for i, l := range lines {
		if i == 0 {
			s.First = l.Time
		}
		s.Last = l.Time
		switch l.Code {
		case "o":
			s.OutputBytes += len(l.Raw)
		case "m", "r":
			data, err := EventData(l.Raw)
			if err != nil {
				return ChunkSummary{}, nil, trace.Wrap(err, "chunk %d", c.Index)
			}
			if l.Code == "m" {
				s.Markers = append(s.Markers, Marker{Time: l.Time, Label: data})
				continue
			}
			if cols, rows, err := ParseSize(data); err == nil {
				s.Cols, s.Rows = cols, rows
			}
		}
	}
	return s, h, nil
}

// Segment is a run of chunks that a player loads as one piece. A segment
// starts at a chunk whose first event is later than the previous chunk's
// last (chunks closed within one instant of a burst stay together), so
// that segment start times strictly increase.
type Segment struct {
	// Start is the time of its first event (0 for the first segment).
	Start float64
	// FirstChunk and LastChunk are its chunk indexes, inclusive.
	FirstChunk, LastChunk int
	// Cols and Rows are the terminal size when it starts.
	Cols, Rows uint32
}

// SeekIndex is a recording's seek index.
type SeekIndex struct {
	Header Header
	// Duration is the time of the last event.
	Duration float64
	Segments []Segment
	Markers  []Marker
	// Chunks are the summaries it was built from, in index order.
	Chunks []ChunkSummary
}

// BuildSeekIndex builds the index from the summaries of chunks 0..n-1, in
// order with no gaps. A recording without events has no segments.
func BuildSeekIndex(h Header, sums []ChunkSummary) (*SeekIndex, error) {
	ix := &SeekIndex{Header: h, Chunks: sums}
	cols, rows := h.Width, h.Height
	for i, s := range sums {
		if s.Index != i {
			return nil, trace.BadParameter("chunk %d is missing from the index", i)
		}
		ix.Markers = append(ix.Markers, s.Markers...)
		if s.Events > 0 {
			ix.Duration = s.Last
		}
	}
	prevLast := -1.0
	for i, s := range sums {
		if s.Events > 0 {
			n := len(ix.Segments)
			switch {
			case n == 0:
				ix.Segments = append(ix.Segments, Segment{Start: 0, FirstChunk: i, LastChunk: i, Cols: cols, Rows: rows})
			case s.First > prevLast && s.First < ix.Duration:
				ix.Segments = append(ix.Segments, Segment{Start: s.First, FirstChunk: i, LastChunk: i, Cols: cols, Rows: rows})
			default:
				ix.Segments[n-1].LastChunk = i
			}
			prevLast = s.Last
		} else if n := len(ix.Segments); n > 0 {
			ix.Segments[n-1].LastChunk = i
		}
		if s.Cols != 0 {
			cols, rows = s.Cols, s.Rows
		}
	}
	if len(ix.Segments) > 0 {
		// Chunks without events before the first one with events (a
		// header-only first chunk) belong to the first segment.
		ix.Segments[0].FirstChunk = 0
	}
	return ix, nil
}

// DefaultWarmupBytes bounds the output replayed to rebuild the screen at a
// segment's start: everything before it when there is less (the screen is
// then exact), else the last this many bytes of output since the last
// resize, which rebuilds any screen drawn within that much output.
const DefaultWarmupBytes = 2 << 20

// WarmupStart is the first chunk whose output rebuilds the screen at the
// start of segment seg: going back from the chunk before it while the
// output stays under budget, stopping at a chunk with a resize (output
// before a resize was drawn at another size).
func (ix *SeekIndex) WarmupStart(seg, budget int) int {
	first := ix.Segments[seg].FirstChunk
	start := first
	total := 0
	for i := first - 1; i >= 0; i-- {
		s := ix.Chunks[i]
		if total+s.OutputBytes > budget && start < first {
			break
		}
		total += s.OutputBytes
		start = i
		if s.Cols != 0 {
			break
		}
	}
	return start
}

// Find returns the segment that holds time t (seconds).
func (ix *SeekIndex) Find(t float64) int {
	i := 0
	for j, s := range ix.Segments {
		if s.Start <= t {
			i = j
		}
	}
	return i
}
