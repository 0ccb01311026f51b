package recording

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"

	"github.com/gravitational/trace"
)

// Result is what Verify found in a recording that checks out.
type Result struct {
	Chunks    int
	FinalHash string
	// Complete is false when the recording has no final chunk (the node
	// died mid-session) and no final hash was given to check against.
	Complete bool
}

// Verify checks the hash chain of chunks (any order; sorted by index
// here). wantFinal, when not empty, is the final hash from the session.end
// audit event. The error names the first chunk that is wrong.
func Verify(chunks []Chunk, wantFinal string) (*Result, error) {
	sorted := append([]Chunk(nil), chunks...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Index < sorted[j].Index })
	var k Checker
	for _, c := range sorted {
		k.Add(c)
	}
	res := k.Result(wantFinal)
	if res.State == CheckTampered {
		switch res.Problem {
		case ProblemHashMismatch, ProblemUndecodable, ProblemAfterFinal:
			return nil, trace.BadParameter("chunk %d is wrong: %s", res.BrokenChunk, res.Reason)
		default:
			return nil, trace.BadParameter("%s", res.Reason)
		}
	}
	return &Result{Chunks: res.Chunks, FinalHash: res.FinalHash, Complete: res.State == CheckVerified}, nil
}

// Export writes the recording as one asciicast v2 file. A recording
// without its final chunk ends with IncompleteMarker (ExportTail).
func Export(w io.Writer, chunks []Chunk) error {
	sorted := append([]Chunk(nil), chunks...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Index < sorted[j].Index })
	var tail ExportTail
	for _, c := range sorted {
		b, err := DecodeChunk(c.Data)
		if err != nil {
			return trace.BadParameter("chunk %d: %v", c.Index, err)
		}
		if _, err := w.Write(b); err != nil {
			return trace.Wrap(err)
		}
		tail.Add(c, b)
	}
	return trace.Wrap(tail.Finish(w))
}

// IncompleteMarker labels the marker that ends the export of a recording
// without a final chunk: the session is still running, or its node
// stopped (killed, crashed) before it ended and what it had not yet
// written (at most DefaultFlushInterval) is lost. The stored chunks are
// not changed: the marker is added where a recording is exported or
// played (pctl recordings export, psh play, the web).
const IncompleteMarker = "recording incomplete: no final chunk (the session is still running, or its node stopped before the session ended)"

// ExportTail follows a recording being exported chunk by chunk and, if
// its last chunk is not final, writes the IncompleteMarker event at the
// time of its last event.
type ExportTail struct {
	seen  bool
	final bool
	last  float64
}

// Add notes chunk c, decoded as b.
func (t *ExportTail) Add(c Chunk, b []byte) {
	t.seen, t.final = true, c.Final
	if _, lines, err := ChunkLines(b, c.Index == 0); err == nil && len(lines) > 0 {
		t.last = lines[len(lines)-1].Time
	}
}

// Finish writes the marker when the recording is incomplete.
func (t *ExportTail) Finish(w io.Writer) error {
	if !t.seen || t.final {
		return nil
	}
	line, err := json.Marshal([]any{json.Number(strconv.FormatFloat(t.last, 'f', 6, 64)), "m", IncompleteMarker})
	if err != nil {
		return trace.Wrap(err)
	}
	_, err = w.Write(append(line, '\n'))
	return trace.Wrap(err)
}

// Event is one decoded asciicast event.
type Event struct {
	Time float64
	Code string // "o", "i", "r", "m"
	Data string
}

// Parse reads an asciicast v2 file: the header and its events.
func Parse(cast []byte) (*Header, []Event, error) {
	lines := bytes.Split(bytes.TrimRight(cast, "\n"), []byte("\n"))
	if len(lines) == 0 || len(lines[0]) == 0 {
		return nil, nil, trace.BadParameter("empty recording")
	}
	var h Header
	if err := json.Unmarshal(lines[0], &h); err != nil {
		return nil, nil, trace.BadParameter("recording header: %v", err)
	}
	if h.Version != 2 {
		return nil, nil, trace.BadParameter("recording header: version %d, want 2", h.Version)
	}
	evs := make([]Event, 0, len(lines)-1)
	for i, l := range lines[1:] {
		var raw []json.RawMessage
		if err := json.Unmarshal(l, &raw); err != nil || len(raw) != 3 {
			return nil, nil, trace.BadParameter("recording line %d: want [time, code, data]", i+2)
		}
		var e Event
		if json.Unmarshal(raw[0], &e.Time) != nil || json.Unmarshal(raw[1], &e.Code) != nil || json.Unmarshal(raw[2], &e.Data) != nil {
			return nil, nil, trace.BadParameter("recording line %d: want [number, string, string]", i+2)
		}
		evs = append(evs, e)
	}
	return &h, evs, nil
}

// String renders an event for logs and tests.
func (e Event) String() string { return fmt.Sprintf("%.3f %s %q", e.Time, e.Code, e.Data) }
