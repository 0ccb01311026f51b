package main

import (
	"context"
	"fmt"
	"sort"

	"github.com/postern-dev/postern/lib/version"
)

func sortStrings(s []string) { sort.Strings(s) }

func (c *cli) version(context.Context) error {
	fmt.Fprintln(c.stdout, "pctl "+version.Version)
	return nil
}
