package recording

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"strconv"
	"strings"
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
	for _, s := range []string{"", "plain", "\x1b[1;31mred\x1b[0m\r\n", `quote " and \ backslash`, "tab\tbell\a<>&\u2028é漢", refValidUTF8(string(all))} {
		line := appendEvent(nil, 12.5, "o", []byte(s))
		require.Equal(t, byte('\n'), line[len(line)-1])
		_, evs, err := Parse(append([]byte("{\"version\":2}\n"), line...))
		require.NoError(t, err, "%q", line)
		require.Equal(t, []Event{{12.5, "o", s}}, evs)
	}
}

// The word-at-a-time fast path writes exactly what the byte-at-a-time
// encoder of earlier releases wrote (refAppendEvent), at every alignment
// of every byte that needs escaping or replacing, so a recording's bytes
// and hashes do not depend on the Postern version that made it.
func TestAppendEventMatchesEarlierEncoder(t *testing.T) {
	special := []string{"\r\n", "\r\r\n", "\x00", "\x1b", "\x1f", " ", "\"", "\\", "\n", "\r", "\t", "\x7f", "\x80", "\xff", "é", "漢", "\U0001F600", "\xe6\xbc", "\uFFFD", "\u2028"}
	for _, sp := range special {
		for pre := 0; pre < 17; pre++ {
			for post := 0; post < 10; post++ {
				p := []byte(strings.Repeat("a", pre) + sp + strings.Repeat("b", post))
				require.Equal(t, string(refAppendEvent(nil, 3.25, "o", refValidUTF8(string(p)))), string(appendEvent(nil, 3.25, "o", p)), "%q", p)
			}
		}
	}
	// unsafeBytes' first flag is the first byte that is not safeASCII,
	// wherever it is and whatever follows it (a borrow only flags bytes
	// above a real one).
	first := func(w []byte) int {
		m := unsafeBytes(binary.LittleEndian.Uint64(w))
		if m == 0 {
			return 8
		}
		return bits.TrailingZeros64(m) >> 3
	}
	for c := 0; c < 256; c++ {
		want := 8
		if !safeASCII[c] {
			want = 0
		}
		require.Equal(t, want, first(bytes.Repeat([]byte{byte(c)}, 8)), "byte %#x", c)
		for i := 0; i < 8; i++ {
			for d := 0; d < 256; d++ {
				for j := i + 1; j < 8; j++ {
					w := []byte("abcdefgh")
					w[i], w[j] = byte(c), byte(d)
					want := 8
					switch {
					case !safeASCII[c]:
						want = i
					case !safeASCII[d]:
						want = j
					}
					if got := first(w); got != want {
						t.Fatalf("%q: first unsafe byte at %d, flagged %d", w, want, got)
					}
				}
			}
		}
	}
}

func FuzzAppendEvent(f *testing.F) {
	f.Add([]byte("\x1b[0m\r\n\"\\"))
	f.Add([]byte("plain ASCII text, longer than a word \xe6\xbc\xa2 and \xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		line := appendEvent(nil, 1, "o", data)
		require.Equal(t, string(refAppendEvent(nil, 1, "o", refValidUTF8(string(data)))), string(line))
		_, evs, err := Parse(append([]byte("{\"version\":2}\n"), line...))
		require.NoError(t, err)
		require.Equal(t, refValidUTF8(string(data)), evs[0].Data)
	})
}

// refAppendEvent and refValidUTF8 are the event encoder as it was before
// the fast path, kept as the reference the fast path must match.
func refAppendEvent(dst []byte, t float64, code, s string) []byte {
	dst = append(dst, '[')
	dst = strconv.AppendFloat(dst, t, 'f', 6, 64)
	dst = append(dst, ',', '"')
	dst = append(dst, code...)
	dst = append(dst, '"', ',', '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"', ']', '\n')
}

func refValidUTF8(s string) string {
	out := make([]rune, 0, len(s))
	for _, r := range s {
		out = append(out, r)
	}
	return string(out)
}
