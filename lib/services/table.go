package services

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/gravitational/trace"
)

// Table is the text form of every listing psh and pctl print: columns
// aligned with a tabwriter, and every cell passed through EscapeText.
// Cells hold text that users, nodes and clients chose (an exec command, a
// login an attacker typed, a lock message, a label): printed raw, a CR,
// an `ESC[2K` or an OSC sequence in one of them erases or forges lines on
// the terminal of whoever lists it. Escaping in the one place every row
// goes through means a new column cannot forget it. EscapeText leaves
// printable text alone, so a cell that is already escaped (FormatLabels)
// passes unchanged.
type Table struct {
	tw *tabwriter.Writer
}

// NewTable starts a table on w with the given column headers.
func NewTable(w io.Writer, headers ...string) *Table {
	t := &Table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	fmt.Fprintln(t.tw, strings.Join(headers, "\t"))
	return t
}

// Row adds a row; each cell is formatted with fmt.Sprint and escaped.
func (t *Table) Row(cells ...any) {
	out := make([]string, len(cells))
	for i, c := range cells {
		out[i] = EscapeText(fmt.Sprint(c))
	}
	fmt.Fprintln(t.tw, strings.Join(out, "\t"))
}

// Flush writes the table out.
func (t *Table) Flush() error { return trace.Wrap(t.tw.Flush()) }

// EscapeList escapes each item and joins them with sep: a list column
// (roles, logins) whose items are user-controlled.
func EscapeList(items []string, sep string) string {
	out := make([]string, len(items))
	for i, s := range items {
		out[i] = EscapeText(s)
	}
	return strings.Join(out, sep)
}

// SafeJSON makes encoding/json output safe for a terminal. The encoder
// already escapes C0 controls (ESC, CR, LF, BEL) inside strings, but not
// DEL, the C1 controls (U+0080..U+009F, which some terminals act on: U+009B
// is CSI) or the invisible bidi overrides that reorder what is shown; they
// can only occur inside strings, where \uXXXX is the same value, so they
// are rewritten as that.
func SafeJSON(data []byte) []byte {
	var b []byte
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == 0x7f || (r >= 0x80 && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0x200e || r == 0x200f || r == 0x061c {
			if b == nil {
				b = append(make([]byte, 0, len(data)+16), data[:i]...)
			}
			b = fmt.Appendf(b, `\u%04x`, r)
		} else if b != nil {
			b = append(b, data[i:i+size]...)
		}
		i += size
	}
	if b == nil {
		return data
	}
	return b
}
