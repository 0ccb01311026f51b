// Command oidcop runs a real OpenID provider (lib/ssotest: zitadel/oidc's
// example OP on 127.0.0.1 over TLS) for the web UI's single sign-on step
// (e2e/run.mjs), which must run a browser through a provider's own login
// page. It prints one JSON line, {"issuer","ca_file","client_id",
// "client_secret"}, what an oidc_connector needs, then serves until
// SIGTERM or SIGINT. Its users are ssotest.DefaultUsers.
//
//	oidcop --dir DIR --redirect https://PROXY/webapi/oidc/callback
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/postern-dev/postern/lib/ssotest"
)

type redirects []string

func (r *redirects) String() string     { return fmt.Sprint(*r) }
func (r *redirects) Set(v string) error { *r = append(*r, v); return nil }

func main() {
	dir := flag.String("dir", "", "where the provider's CA file is written")
	var redirect redirects
	flag.Var(&redirect, "redirect", "a registered redirect URI (repeatable)")
	flag.Parse()
	if *dir == "" || len(redirect) == 0 {
		fmt.Fprintln(os.Stderr, "oidcop: --dir and --redirect are required")
		os.Exit(2)
	}
	op, err := ssotest.Start(ssotest.Config{Dir: *dir, RedirectURLs: redirect})
	if err != nil {
		fmt.Fprintln(os.Stderr, "oidcop:", err)
		os.Exit(1)
	}
	defer op.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	if err := json.NewEncoder(os.Stdout).Encode(map[string]string{
		"issuer": op.Issuer, "ca_file": op.CAFile, "client_id": op.ClientID, "client_secret": op.ClientSecret,
	}); err != nil {
		fmt.Fprintln(os.Stderr, "oidcop:", err)
		os.Exit(1)
	}
	<-sig
}
