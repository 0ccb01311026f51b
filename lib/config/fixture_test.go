package config

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFixtureShowsEveryKey fails when postern.yaml gains a key that the
// commented sample, fixtures/postern.yaml, does not show: the sample is
// where an operator starts a config file, and a key missing there is a
// key nobody finds. A key counts when its line is there, set or
// commented out, at its nesting (top-level keys at the start of a line).
func TestFixtureShowsEveryKey(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "fixtures", "postern.yaml"))
	require.NoError(t, err)
	text := string(b)
	var missing []string
	for _, key := range yamlKeys(reflect.TypeOf(FileConfig{}), "") {
		parts := strings.Split(key, ".")
		leaf := regexp.QuoteMeta(parts[len(parts)-1])
		// Nested: indented, set or commented, or a commented block
		// ("#   key:"); top level: at the start of the line.
		at := `(?:[ \t]+(?:#\s*)?|#\s+)`
		if len(parts) == 1 {
			at = `(?:# ?)?`
		}
		if !regexp.MustCompile(`(?m)^` + at + leaf + `:`).MatchString(text) {
			missing = append(missing, key)
		}
	}
	require.Empty(t, missing, "fixtures/postern.yaml does not show these keys (set or as `# key: value`)")
}
