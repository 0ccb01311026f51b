package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"

	"github.com/postern-dev/postern/lib/version"
)

func sortStrings(s []string) { sort.Strings(s) }

func (c *cli) version(context.Context) error {
	fmt.Fprintln(c.stdout, "pctl "+version.Version)
	return nil
}

// writeJSON prints v as indented JSON, made safe for a terminal
// (services.SafeJSON): the --format json of every listing.
func writeJSON(w io.Writer, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return trace.Wrap(err)
	}
	_, err = w.Write(append(services.SafeJSON(data), '\n'))
	return trace.Wrap(err)
}
