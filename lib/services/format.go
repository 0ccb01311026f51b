package services

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// FormatLabels renders labels as "k=v,k2=v2" sorted by key ("-" when there
// are none): the one form of `pctl nodes ls`, `psh ls`, `pctl route` and
// the ambiguous-host error. Keys and values go through EscapeText, so a
// label cannot move the cursor, recolour or rewrite a user's terminal.
func FormatLabels(labels map[string]string) string {
	if len(labels) == 0 {
		return "-"
	}
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(labels)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(EscapeText(k))
		b.WriteByte('=')
		b.WriteString(EscapeText(labels[k]))
	}
	return b.String()
}

// EscapeText returns s unchanged when every rune of it is printable
// (strconv.IsPrint: no control characters such as ESC, CR or LF, no
// invisible format characters such as bidi overrides) and valid UTF-8;
// otherwise it returns s quoted with strconv.Quote, which spells those
// characters as escapes. Use it for any node-supplied text printed to a
// terminal (hostnames, labels, addresses). Joins and heartbeats validate
// these fields too; escaping on output still protects against records
// written before that validation existed.
func EscapeText(s string) string {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size <= 1) || !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
		i += size
	}
	return s
}

// TunnelAddrText is what listings print in the address column of a node
// behind NAT: it has no address, and a blank column reads like a record
// that lost one.
const TunnelAddrText = "(tunnel)"

// NodeAddrText is a node's address column: the address, escaped, or
// TunnelAddrText for a tunnel node without one.
func NodeAddrText(addr string, tunnel bool) string {
	if tunnel && addr == "" {
		return TunnelAddrText
	}
	return EscapeText(addr)
}
