package refdoc

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// ParseFiles parses the non-test Go files of dir (all of them, whatever
// their build tags: a constant or route behind a tag is still documented).
func ParseFiles(t testing.TB, dir string) (*token.FileSet, []*ast.File) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("refdoc: %v", err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		if err != nil {
			t.Fatalf("refdoc: %v", err)
		}
		files = append(files, f)
	}
	return fset, files
}

// StringConsts returns the exported string and character constants
// declared in the non-test Go files of dir, name to value (a character as
// a one-character string). Tests read constants from the
// source because Go cannot list a package's constants otherwise, and a
// list kept by hand beside them is exactly what goes stale.
func StringConsts(t testing.TB, dir string) map[string]string {
	t.Helper()
	_, files := ParseFiles(t, dir)
	out := map[string]string{}
	for _, f := range files {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i >= len(vs.Values) || !name.IsExported() {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || (lit.Kind != token.STRING && lit.Kind != token.CHAR) {
						continue
					}
					if lit.Kind == token.CHAR {
						if r, _, _, err := strconv.UnquoteChar(lit.Value[1:len(lit.Value)-1], '\''); err == nil {
							out[name.Name] = string(r)
						}
					} else if v, err := strconv.Unquote(lit.Value); err == nil {
						out[name.Name] = v
					}
				}
			}
		}
	}
	return out
}

// Routes reads every pattern the non-test files of dir register on a mux
// (mux.HandleFunc("GET /webapi/...", ...), or "GET "+SomeConst), sorted. A
// pattern it cannot evaluate fails the test rather than going unchecked.
func Routes(t testing.TB, dir string) []string {
	t.Helper()
	fset, files := ParseFiles(t, dir)
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
