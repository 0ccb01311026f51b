package refdoc

import (
	"regexp"
	"strings"
	"testing"

	"github.com/alecthomas/kingpin/v2"
)

// Command is one runnable command of a CLI: its full name ("users add")
// and the long names of its flags ("logins", without the dashes).
type Command struct {
	Name  string
	Flags []string
}

// RequireCLI fails the test unless the section under heading documents
// prog: global flags anywhere in it, and for each command a heading
// "`PROG NAME`" whose section names each of the command's flags as
// `--flag`.
func (d *Doc) RequireCLI(t testing.TB, prog, heading string, global []string, cmds []Command) {
	t.Helper()
	sec := d.Section(t, heading)
	sec.RequireCode(t, prog+" global flags", dashed(global)...)
	var missing []string
	for _, c := range cmds {
		h := "`" + prog + " " + c.Name + "`"
		if !sec.HasSection(h) {
			missing = append(missing, h)
			continue
		}
		sec.Section(t, h).RequireCode(t, prog+" "+c.Name+" flags", dashed(c.Flags)...)
	}
	if len(missing) > 0 {
		t.Errorf("%s has no heading for these commands:\n  %s", sec.name, strings.Join(missing, "\n  "))
	}
}

func dashed(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = "--" + n
	}
	return out
}

// FromKingpin lists app's global flags and runnable commands, skipping
// what kingpin adds itself (help) and what is hidden.
func FromKingpin(app *kingpin.Application) (global []string, cmds []Command) {
	m := app.Model()
	global = visibleFlags(m.Flags)
	var walk func(cs []*kingpin.CmdModel)
	walk = func(cs []*kingpin.CmdModel) {
		for _, c := range cs {
			if c.Hidden || c.FullCommand == "help" {
				continue
			}
			if len(c.Commands) > 0 {
				walk(c.Commands)
				continue
			}
			cmds = append(cmds, Command{Name: c.FullCommand, Flags: visibleFlags(c.Flags)})
		}
	}
	walk(m.Commands)
	return global, cmds
}

func visibleFlags(fs []*kingpin.FlagModel) []string {
	var out []string
	for _, f := range fs {
		if !f.Hidden && f.Name != "help" {
			out = append(out, f.Name)
		}
	}
	return out
}

// flagLine is a flag line of kingpin's --help-long:
// "  -A, --[no-]forward-agent  Forward ..." or "  --ttl=8h  Certificate ...";
// a wrapped help line that happens to start with a flag's name is not one
// (the name is not followed by a value placeholder or a column gap).
var flagLine = regexp.MustCompile(`^\s+(?:-\w, )?--(?:\[no-\])?([a-z0-9][a-z0-9-]*)(?:=\S+)?(?: \.\.\.)?(?:\s{2,}|$)`)

// FromHelpLong parses the output of `PROG --help-long` into what
// FromKingpin returns, for a CLI whose kingpin application a test cannot
// reach (it lives inside the command's run function).
func FromHelpLong(out string) (global []string, cmds []Command) {
	var cur *Command
	inCommands := false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case line == "Commands:":
			inCommands = true
		case strings.HasPrefix(line, "usage: "):
			// kingpin may print the short usage after the long one (when
			// the application's terminate does not exit): the tree is
			// already read.
			if inCommands {
				return global, cmds
			}
		case inCommands && line != "" && line[0] != ' ':
			var words []string
			for _, w := range strings.Fields(line) {
				if strings.ContainsAny(w[:1], "[<-") {
					break
				}
				words = append(words, w)
			}
			cur = nil
			if name := strings.Join(words, " "); name != "help" {
				cmds = append(cmds, Command{Name: name})
				cur = &cmds[len(cmds)-1]
			}
		default:
			m := flagLine.FindStringSubmatch(line)
			if m == nil || m[1] == "help" {
				continue
			}
			switch {
			case !inCommands:
				global = append(global, m[1])
			case cur != nil:
				cur.Flags = append(cur.Flags, m[1])
			}
		}
	}
	return global, cmds
}
