package promreg

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/refdoc"
)

// metricNames finds every metric the code declares: each
// prometheus.*Opts{Namespace, Subsystem, Name} literal in the non-test Go
// files under root. Postern's packages register their collectors where
// they are used, so the source is the one complete list.
func metricNames(t *testing.T, root string) []string {
	var names []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			sel, ok := lit.Type.(*ast.SelectorExpr)
			if !ok || !strings.HasSuffix(sel.Sel.Name, "Opts") {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "prometheus" || sel.Sel.Name == "HistogramVecOpts" {
				return true
			}
			parts := map[string]string{}
			for _, e := range lit.Elts {
				kv, ok := e.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				key, _ := kv.Key.(*ast.Ident)
				if key == nil || (key.Name != "Namespace" && key.Name != "Subsystem" && key.Name != "Name") {
					continue
				}
				v, ok := kv.Value.(*ast.BasicLit)
				if !ok || v.Kind != token.STRING {
					t.Errorf("%s: metric %s is not a string literal: this test cannot read it", fset.Position(kv.Pos()), key.Name)
					continue
				}
				parts[key.Name], _ = strconv.Unquote(v.Value)
			}
			var full []string
			for _, k := range []string{"Namespace", "Subsystem", "Name"} {
				if parts[k] != "" {
					full = append(full, parts[k])
				}
			}
			names = append(names, strings.Join(full, "_"))
			return true
		})
		return nil
	})
	require.NoError(t, err)
	slices.Sort(names)
	return slices.Compact(names)
}

// TestReferenceDocumentsEveryMetric fails when a metric is declared that
// docs/reference.md's metrics section does not list.
func TestReferenceDocumentsEveryMetric(t *testing.T) {
	names := metricNames(t, "..")
	// The scan must find what is known to be there.
	require.Contains(t, names, "postern_limiter_descriptor_budget")
	require.Contains(t, names, "postern_memory_trims_total")
	refdoc.Load(t).Section(t, "Metrics").RequireCode(t, "metrics", names...)
}
