package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// Output formats of --format.
const (
	formatText = "text"
	formatJSON = "json"
	formatYAML = "yaml"
)

// formatFlag declares --format on cmd, taking values (the first is the
// default). Every listing declares it through here, so that the flag reads
// and validates the same on each (an unknown value is kingpin's enum error,
// naming the values).
func formatFlag(cmd *kingpin.CmdClause, dst *string, help string, values ...string) {
	cmd.Flag("format", help).Default(values[0]).EnumVar(dst, values...)
}

// listFormatFlag is --format text|json on an `ls` command.
func listFormatFlag(cmd *kingpin.CmdClause, dst *string) {
	formatFlag(cmd, dst, "text or json.", formatText, formatJSON)
}

// writeJSON prints v as indented JSON, made safe for a terminal
// (services.SafeJSON): encoding/json escapes the C0 controls, SafeJSON the
// rest that a terminal acts on.
func writeJSON(w io.Writer, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return trace.Wrap(err)
	}
	_, err = w.Write(append(services.SafeJSON(data), '\n'))
	return trace.Wrap(err)
}

// writeList prints a listing: items as a JSON array ([] when there are
// none, never null, so that `| jq length` works on an empty cluster) for
// --format json, else the text form from text.
func writeList[T any](w io.Writer, format string, items []T, text func() error) error {
	switch format {
	case formatJSON:
		if items == nil {
			items = []T{}
		}
		return trace.Wrap(writeJSON(w, items))
	case formatText, "":
		return trace.Wrap(text())
	}
	return trace.BadParameter("unknown --format %q", format)
}

// writeResources prints what `pctl get` found: YAML documents separated by
// "---" (what `pctl create -f` reads back), or one JSON array.
func writeResources(w io.Writer, format string, out []any) error {
	if format == formatJSON {
		if out == nil {
			out = []any{}
		}
		return trace.Wrap(writeJSON(w, out))
	}
	for i, v := range out {
		data, err := services.MarshalResourceYAML(v)
		if err != nil {
			return trace.Wrap(err)
		}
		if i > 0 {
			fmt.Fprintln(w, "---")
		}
		if _, err := w.Write(data); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}
