package web

import (
	"go/ast"
	"go/token"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/refdoc"
)

// webRoutes reads every pattern this package registers on its mux
// (mux.HandleFunc("GET /webapi/...") or "GET "+SomeConst) from its
// non-test source: the routes are registered in several files, and only
// the source lists them all.
func webRoutes(t *testing.T) []string {
	fset, files := refdoc.ParseFiles(t, ".")
	consts := map[string]string{}
	var calls []*ast.CallExpr
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				for i, name := range n.Names {
					if i < len(n.Values) {
						if lit, ok := n.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							consts[name.Name], _ = strconv.Unquote(lit.Value)
						}
					}
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && (sel.Sel.Name == "HandleFunc" || sel.Sel.Name == "Handle") && len(n.Args) == 2 {
					calls = append(calls, n)
				}
			}
			return true
		})
	}
	var eval func(e ast.Expr) (string, bool)
	eval = func(e ast.Expr) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		case *ast.Ident:
			s, ok := consts[e.Name]
			return s, ok
		case *ast.BinaryExpr:
			l, lok := eval(e.X)
			r, rok := eval(e.Y)
			return l + r, lok && rok && e.Op == token.ADD
		}
		return "", false
	}
	var out []string
	for _, c := range calls {
		p, ok := eval(c.Args[0])
		if !ok {
			t.Errorf("%s: a route pattern this test cannot read", fset.Position(c.Pos()))
			continue
		}
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// TestReferenceDocumentsEveryRoute fails when the proxy's HTTPS port gains
// an endpoint that docs/reference.md's web API section does not list.
func TestReferenceDocumentsEveryRoute(t *testing.T) {
	routes := webRoutes(t)
	require.Contains(t, routes, "POST /webapi/sessions/token")
	require.Contains(t, routes, "GET "+JoinRelayPath)
	refdoc.Load(t).Section(t, "Web API (port 3080)").RequireCode(t, "web routes", routes...)
}
