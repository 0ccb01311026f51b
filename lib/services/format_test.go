package services

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFormatLabels(t *testing.T) {
	require.Equal(t, "-", FormatLabels(nil))
	require.Equal(t, "a=1,b=2,env=prod", FormatLabels(map[string]string{"env": "prod", "b": "2", "a": "1"}))
	// Sorted by key, not by "k=v": "a.b" sorts after "a" although
	// "a.b=1" < "a=2" as strings.
	require.Equal(t, "a=2,a.b=1", FormatLabels(map[string]string{"a.b": "1", "a": "2"}))
	got := FormatLabels(map[string]string{"env": "\x1b[31m\r\n", "k\x07": "v"})
	require.Equal(t, `env="\x1b[31m\r\n","k\a"=v`, got)
	require.NotContains(t, got, "\x1b")
	require.NotContains(t, got, "\r")
	require.NotContains(t, got, "\n")
}

func TestEscapeText(t *testing.T) {
	for in, want := range map[string]string{
		"web-1":             "web-1",
		"":                  "",
		"héllo wörld":       "héllo wörld",
		"a\x1b[2Jb":         `"a\x1b[2Jb"`,
		"line\nbreak":       `"line\nbreak"`,
		"tab\there":         `"tab\there"`,
		"bidi\u202eevil":    `"bidi\u202eevil"`,
		"bad\xffutf8":       `"bad\xffutf8"`,
		"del\x7f":           `"del\x7f"`,
		"c1\u009bcontrol":   `"c1\u009bcontrol"`,
		`"quoted" is fine`:  `"quoted" is fine`,
		"zero\u200bwidth":   `"zero\u200bwidth"`,
		"line\u2028sep":     `"line\u2028sep"`,
		"emoji \U0001F600 ": "emoji \U0001F600 ",
	} {
		require.Equal(t, want, EscapeText(in), "%q", in)
	}
}
