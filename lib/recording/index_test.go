package recording

import (
	"bytes"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

// An export of a recording without its final chunk ends with the
// incomplete marker at its last event's time; a complete one does not.
func TestExportMarksIncomplete(t *testing.T) {
	chunks, _ := threeChunks(t)
	_, evs := castOf(t, chunks)
	require.NotEqual(t, IncompleteMarker, evs[len(evs)-1].Data)

	cut := chunks[:len(chunks)-1]
	var all bytes.Buffer
	for _, c := range cut {
		b, err := DecodeChunk(c.Data)
		require.NoError(t, err)
		all.Write(b)
	}
	_, want, err := Parse(all.Bytes())
	require.NoError(t, err)
	_, got := castOf(t, cut)
	require.Equal(t, want, got[:len(got)-1])
	last := got[len(got)-1]
	require.Equal(t, Event{want[len(want)-1].Time, "m", IncompleteMarker}, last)
}

// Chunks closed within one instant (a burst) share a segment, so that
// segment starts strictly increase; every chunk is in exactly one
// segment; sizes follow resizes.
func TestSeekIndexSegments(t *testing.T) {
	clock := clockwork.NewFakeClock()
	sink := newMemSink()
	w := newTestWriter(t, clock, sink, func(c *Config) { c.ChunkBytes = 512; c.FlushInterval = time.Hour })
	for i := 0; i < 20; i++ {
		w.Output(bytes.Repeat([]byte("z"), 600)) // a chunk each, at the same instant
	}
	clock.Advance(time.Second)
	w.Resize(120, 40)
	for i := 0; i < 5; i++ {
		clock.Advance(time.Second)
		w.Output(bytes.Repeat([]byte("q"), 600))
	}
	_, err := w.Close("exit-status 0")
	require.NoError(t, err)
	var sums []ChunkSummary
	var h *Header
	for _, c := range sink.all() {
		s, hh, err := SummarizeChunk(c)
		require.NoError(t, err)
		if hh != nil {
			h = hh
		}
		sums = append(sums, s)
	}
	ix, err := BuildSeekIndex(*h, sums)
	require.NoError(t, err)
	require.InDelta(t, 6.0, ix.Duration, 1e-9)
	require.Equal(t, 0, ix.Segments[0].FirstChunk)
	require.Equal(t, len(sums)-1, ix.Segments[len(ix.Segments)-1].LastChunk)
	for i := 1; i < len(ix.Segments); i++ {
		require.Greater(t, ix.Segments[i].Start, ix.Segments[i-1].Start)
		require.Equal(t, ix.Segments[i-1].LastChunk+1, ix.Segments[i].FirstChunk)
		require.Less(t, ix.Segments[i].Start, ix.Duration)
	}
	require.GreaterOrEqual(t, ix.Segments[0].LastChunk, 19, "the burst at t=0 is one segment")
	last := ix.Segments[len(ix.Segments)-1]
	require.Equal(t, [2]uint32{120, 40}, [2]uint32{last.Cols, last.Rows})
	require.Equal(t, len(ix.Segments)-1, ix.Find(ix.Duration))
	require.Equal(t, 0, ix.Find(0))
	require.Equal(t, []Marker{{Time: 6, Label: "exit-status 0"}}, ix.Markers)
}

// appendEvent writes JSON that decodes to what was recorded, for every
// byte a terminal may send.
func TestAppendEventRoundTrips(t *testing.T) {
	var all []byte
	for i := 0; i < 256; i++ {
		all = append(all, byte(i))
	}
	for _, s := range []string{"", "plain", "\x1b[1;31mred\x1b[0m\r\n", `quote " and \ backslash`, "tab\tbell\a<>&\u2028é漢", toValidUTF8(string(all))} {
		line := appendEvent(nil, 12.5, "o", s)
		require.Equal(t, byte('\n'), line[len(line)-1])
		_, evs, err := Parse(append([]byte("{\"version\":2}\n"), line...))
		require.NoError(t, err, "%q", line)
		require.Equal(t, []Event{{12.5, "o", s}}, evs)
	}
}

func FuzzAppendEvent(f *testing.F) {
	f.Add([]byte("\x1b[0m\r\n\"\\"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := toValidUTF8(string(data))
		_, evs, err := Parse(append([]byte("{\"version\":2}\n"), appendEvent(nil, 1, "o", s)...))
		require.NoError(t, err)
		require.Equal(t, s, evs[0].Data)
	})
}
