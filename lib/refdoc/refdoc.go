// Package refdoc holds docs/reference.md to the code. A package's test
// lists what the package defines that an operator can see (config keys,
// commands and flags, audit events, metrics, API routes) and asks refdoc
// whether the reference mentions each one; the test fails naming every
// missing item. So a new flag or event cannot ship undocumented: the change
// that adds it fails its own package's tests until the reference says what
// it is. Only tests import this package.
package refdoc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Path is the reference, relative to the repository root.
const Path = "docs/reference.md"

// Doc is the reference, or one section of it.
type Doc struct {
	// name says which part of the reference this is, for failures.
	name  string
	lines []string
}

// Load reads the reference from the repository root, found by walking up
// from the test's package directory (where go test runs it) to go.mod.
func Load(t testing.TB) *Doc {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("refdoc: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("refdoc: no go.mod above the test's directory, so no %s", Path)
		}
		dir = parent
	}
	data, err := os.ReadFile(filepath.Join(dir, Path))
	if err != nil {
		t.Fatalf("refdoc: %v", err)
	}
	return &Doc{name: Path, lines: strings.Split(string(data), "\n")}
}

// headingLevel is the number of leading '#' of a Markdown heading line, and
// its text; 0 for any other line.
func headingLevel(line string) (int, string) {
	n := 0
	for n < len(line) && line[n] == '#' {
		n++
	}
	if n == 0 || n >= len(line) || line[n] != ' ' {
		return 0, ""
	}
	return n, strings.TrimSpace(line[n:])
}

// Section is the part of d under the heading whose text is exactly
// heading (say "`psh login`"), up to the next heading of the same or a
// higher level. A missing heading fails the test: the section is where an
// operator looks the thing up.
func (d *Doc) Section(t testing.TB, heading string) *Doc {
	t.Helper()
	for i, line := range d.lines {
		level, text := headingLevel(line)
		if level == 0 || text != heading {
			continue
		}
		end := len(d.lines)
		for j := i + 1; j < len(d.lines); j++ {
			if l, _ := headingLevel(d.lines[j]); l != 0 && l <= level {
				end = j
				break
			}
		}
		return &Doc{name: Path + " section " + heading, lines: d.lines[i:end]}
	}
	t.Fatalf("%s has no heading %q (%s)", d.name, heading, strings.Repeat("#", 3)+" "+heading)
	return nil
}

// HasSection reports whether d has a heading whose text is heading.
func (d *Doc) HasSection(heading string) bool {
	for _, line := range d.lines {
		if _, text := headingLevel(line); text == heading {
			return true
		}
	}
	return false
}

// Contains reports whether s occurs in d.
func (d *Doc) Contains(s string) bool {
	for _, line := range d.lines {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// RequireCode fails the test unless every item appears in d as a code
// span of its own (`item`), listing all that do not; what says what the
// items are ("config keys").
func (d *Doc) RequireCode(t testing.TB, what string, items ...string) {
	t.Helper()
	var missing []string
	for _, it := range items {
		if !d.Contains("`" + it + "`") {
			missing = append(missing, it)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%s does not document these %s (each as a code span, `like_this`):\n  %s", d.name, what, strings.Join(missing, "\n  "))
	}
}

// RequireRow fails the test unless some line of d (a table row) holds
// every one of cells as a code span, and reports which row is missing.
func (d *Doc) RequireRow(t testing.TB, what string, cells ...string) {
	t.Helper()
	for _, line := range d.lines {
		ok := true
		for _, c := range cells {
			if !strings.Contains(line, "`"+c+"`") {
				ok = false
				break
			}
		}
		if ok {
			return
		}
	}
	quoted := make([]string, len(cells))
	for i, c := range cells {
		quoted[i] = "`" + c + "`"
	}
	t.Errorf("%s has no row for %s with %s", d.name, what, strings.Join(quoted, ", "))
}

// Line returns the first line of d holding code as a code span (`code`),
// failing the test when there is none: a table row looked up by its key.
func (d *Doc) Line(t testing.TB, code string) (string, bool) {
	t.Helper()
	for _, line := range d.lines {
		if strings.Contains(line, "`"+code+"`") {
			return line, true
		}
	}
	t.Errorf("%s does not document `%s`", d.name, code)
	return "", false
}

// CodeSpans returns the code spans (`x`) of a Markdown line, in order.
func CodeSpans(line string) []string {
	var out []string
	for {
		i := strings.IndexByte(line, '`')
		if i < 0 {
			return out
		}
		line = line[i+1:]
		j := strings.IndexByte(line, '`')
		if j < 0 {
			return out
		}
		out = append(out, line[:j])
		line = line[j+1:]
	}
}

// Spans returns every code span of d, in order.
func (d *Doc) Spans() []string {
	var out []string
	for _, line := range d.lines {
		out = append(out, CodeSpans(line)...)
	}
	return out
}
