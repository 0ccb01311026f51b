package web

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"regexp"
	"strings"
)

// uiFiles holds the UI: ui/dist is what `npm run build` in web/ writes
// (not committed), ui/placeholder.html the page served when the binary was
// built without it, so `go build` and `go test` never need npm.
//
//go:embed ui
var uiFiles embed.FS

// uiCSP is the policy of the UI's pages. Scripts and connections are
// same-origin only: no inline script, no eval, no third-party host, so an
// injected string cannot run code. Styles allow 'unsafe-inline' because
// xterm.js sizes its character grid with <style> elements it creates at
// run time (it has no nonce option); a style cannot run script.
// 'wasm-unsafe-eval' lets the recording player compile its terminal
// emulator (WebAssembly shipped inside our own bundle); it allows
// compiling WebAssembly, not eval of JavaScript.
const uiCSP = "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self' 'unsafe-inline'; " +
	"img-src 'self' data:; font-src 'self'; connect-src 'self'; manifest-src 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

// uiRoot returns the built UI, or nil when only the placeholder exists.
func uiRoot() fs.FS {
	dist, err := fs.Sub(uiFiles, "ui/dist")
	if err != nil {
		return nil
	}
	if _, err := fs.Stat(dist, "index.html"); err != nil {
		return nil
	}
	return dist
}

// registerUI serves the UI at every path the API does not claim. Paths
// without a file extension are the single-page app's own routes and get
// index.html.
func (s *Server) registerUI(mux *http.ServeMux) {
	root := uiRoot()
	files := http.FileServerFS(root)
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/webapi/") {
			writeError(w, http.StatusNotFound, "no such endpoint")
			return
		}
		w.Header().Set("Content-Security-Policy", uiCSP)
		p := path.Clean(r.URL.Path)
		if root == nil {
			data, err := uiFiles.ReadFile("ui/placeholder.html")
			if err != nil {
				http.Error(w, "no UI", http.StatusNotFound)
				return
			}
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			if !isAppRoute(p) {
				w.WriteHeader(http.StatusNotFound)
			}
			_, _ = w.Write(data)
			return
		}
		// Under /web/ every path is the app's (a terminal's deep link
		// /web/cluster/C/node/UUID/LOGIN may end in a login with a dot).
		// One the app has no page for gets the app too, which says so,
		// with 404: a mistyped link must not look like a page that exists.
		if p == "/" || path.Ext(p) == "" || strings.HasPrefix(p, "/web/") {
			w.Header().Set("Cache-Control", "no-cache")
			if !isAppRoute(p) {
				serveIndexNotFound(w, root)
				return
			}
			http.ServeFileFS(w, r, root, "index.html")
			return
		}
		files.ServeHTTP(w, r)
	})
}

// appRoutes are the pages web/src/main.js's route() has.
var appRoutes = []*regexp.Regexp{
	regexp.MustCompile(`^/$`),
	regexp.MustCompile(`^/web/?$`),
	regexp.MustCompile(`^/web/(sessions|recordings|account|cli-login)$`),
	regexp.MustCompile(`^/web/recordings/[0-9a-f-]{36}$`),
	regexp.MustCompile(`^/web/cluster/[^/]+/node/[^/]+/[^/]+$`),
}

// isAppRoute reports whether the app has a page at the cleaned path p.
func isAppRoute(p string) bool {
	for _, re := range appRoutes {
		if re.MatchString(p) {
			return true
		}
	}
	return false
}

// serveIndexNotFound answers 404 with the app, which shows its not-found
// page for the path.
func serveIndexNotFound(w http.ResponseWriter, root fs.FS) {
	data, err := fs.ReadFile(root, "index.html")
	if err != nil {
		http.Error(w, "page not found", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write(data)
}
