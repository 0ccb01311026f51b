package refdoc

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps failures instead of failing, so the
// checks' own failures can be asserted.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...) }

const sample = "# Ref\n## `tool`: a CLI\nGlobal: `--home`.\n### `tool login`\n`--user` and `--ttl`.\n### `tool ls`\n`--format`\n## Other\n`--ttl-less` `--orphan`\n"

func doc() *Doc { return &Doc{name: "sample", lines: strings.Split(sample, "\n")} }

func TestSectionEndsAtItsLevel(t *testing.T) {
	r := &recorder{TB: t}
	sec := doc().Section(r, "`tool`: a CLI")
	if !sec.Contains("`--format`") || sec.Contains("`--orphan`") {
		t.Fatalf("section bounds wrong: %q", sec.lines)
	}
	login := sec.Section(r, "`tool login`")
	if login.Contains("`--format`") {
		t.Fatalf("subsection runs into the next one: %q", login.lines)
	}
	if len(r.errors) != 0 {
		t.Fatal(r.errors)
	}
	doc().Section(r, "missing")
	if len(r.errors) != 1 {
		t.Fatalf("a missing heading did not fail: %v", r.errors)
	}
}

func TestRequireCLIFailsOnWhatIsMissing(t *testing.T) {
	r := &recorder{TB: t}
	cmds := []Command{{Name: "login", Flags: []string{"user", "ttl"}}, {Name: "ls", Flags: []string{"format"}}}
	doc().RequireCLI(r, "tool", "`tool`: a CLI", []string{"home"}, cmds)
	if len(r.errors) != 0 {
		t.Fatalf("a documented CLI failed: %v", r.errors)
	}
	// A flag documented only in another command's section, one not at
	// all (`--ttl-less` does not count for `--ttl`), and a command with
	// no heading each fail.
	cmds = []Command{{Name: "login", Flags: []string{"format"}}, {Name: "ls", Flags: []string{"orphan"}}, {Name: "rm"}}
	doc().RequireCLI(r, "tool", "`tool`: a CLI", []string{"debug"}, cmds)
	if len(r.errors) != 4 {
		t.Fatalf("want 4 failures (global, login, ls, rm), got %d: %v", len(r.errors), r.errors)
	}
}

func TestFromHelpLong(t *testing.T) {
	out := `usage: tool [<flags>] <command> [<args> ...]

Flags:
  -h, --[no-]help   Show context-sensitive help (also try --help-long and
                    --help-man).
      --home=HOME   Home.

Commands:
help [<command>...]
    Show help.

proxy ssh [<flags>] <target>
    Stdio tunnel.

    --cluster=CLUSTER  Cluster of the node (default: the proxy's).
    -L, --local=LOCAL ...  Forwards, see
                           --cluster above.
    -A, --[no-]forward-agent  Agent.

usage: tool [<flags>] <command> [<args> ...]
Commands:
bogus
`
	global, cmds := FromHelpLong(out)
	if fmt.Sprint(global) != "[home]" {
		t.Fatalf("global flags %v", global)
	}
	if len(cmds) != 1 || cmds[0].Name != "proxy ssh" || fmt.Sprint(cmds[0].Flags) != "[cluster local forward-agent]" {
		t.Fatalf("commands %+v", cmds)
	}
}
