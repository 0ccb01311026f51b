package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/services"
)

// defaultTokenTTL is long enough to copy a command to a new machine and run
// it, short enough that a leaked token is soon worthless.
const defaultTokenTTL = 30 * time.Minute

func (c *cli) registerTokens(app *kingpin.Application, add adder) {
	tokens := app.Command("tokens", "Manage join tokens.")
	var typ string
	var ttl time.Duration
	ta := tokens.Command("add", "Create a single-use join token and print the join command.")
	ta.Flag("type", "node, proxy or trusted_cluster (a leaf cluster's trust in this one).").Default(services.TokenTypeNode).EnumVar(&typ, services.TokenTypeNode, services.TokenTypeProxy, services.TokenTypeTrustedCluster)
	ta.Flag("ttl", "How long the token is valid.").Default(defaultTokenTTL.String()).DurationVar(&ttl)
	add(ta, func(ctx context.Context) error { return c.tokensAdd(ctx, typ, ttl) })

	var lsFormat string
	var withSecrets bool
	tl := tokens.Command("ls", "List join tokens: type, expiry and the first characters of each (the whole token with --with-secrets).")
	tl.Flag("with-secrets", "Print each whole token, which joins a host to the cluster.").BoolVar(&withSecrets)
	listFormatFlag(tl, &lsFormat)
	add(tl, func(ctx context.Context) error { return c.tokensLs(ctx, lsFormat, withSecrets) })

	var rmToken string
	tr := tokens.Command("rm", "Revoke a join token.")
	tr.Arg("token", "The token, or the prefix pctl tokens ls shows (at least 8 characters, matching one token).").Required().StringVar(&rmToken)
	add(tr, func(ctx context.Context) error { return c.tokensRm(ctx, rmToken) })
}

func (c *cli) tokensAdd(ctx context.Context, typ string, ttl time.Duration) error {
	if ttl <= 0 {
		return trace.BadParameter("--ttl must be positive")
	}
	clt, id, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	tok, err := clt.CreateToken(ctx, typ, ttl)
	if err != nil {
		return trace.Wrap(err)
	}
	pin, err := auth.CAPin(id.TLSCACertPEM())
	if err != nil {
		return trace.Wrap(err)
	}
	if typ == services.TokenTypeTrustedCluster {
		c.printTrustedClusterToken(tok, pin, id.ClusterName)
		return nil
	}
	fmt.Fprintf(c.stdout, "The %s join token %s expires at %s.\n\n", typ, tok.Name, tok.Expires.UTC().Format(time.RFC3339))
	fmt.Fprintf(c.stdout, "Run this on the new %s (replace the auth address if it is not reachable as shown):\n\n", typ)
	fmt.Fprintf(c.stdout, "postern start --roles %s --auth-server %s --token %s --ca-pin %s\n",
		typ, c.addr, tok.Name, pin)
	if typ == services.TokenTypeNode {
		// The proxy's web address is not known here: the auth host's
		// name on the default web port is the usual all-in-one answer.
		web := net.JoinHostPort(hostOf(c.addr), "3080")
		fmt.Fprintf(c.stdout, "\nOr, on a node that can reach only the proxy (behind NAT; replace the proxy's web address if needed):\n\n")
		fmt.Fprintf(c.stdout, "postern start --roles node --proxy-server %s --token %s --ca-pin %s\n", web, tok.Name, pin)
	}
	return nil
}

func hostOf(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// printTrustedClusterToken prints the token with the root's CA pin in it
// (services.TrustedClusterToken) and the resource the leaf's admin
// creates with it.
func (c *cli) printTrustedClusterToken(tok *services.Token, pin, clusterName string) {
	full := services.TrustedClusterToken(tok.Name, pin)
	fmt.Fprintf(c.stdout, "The trusted_cluster token %s expires at %s.\n\n", full, tok.Expires.UTC().Format(time.RFC3339))
	fmt.Fprintf(c.stdout, "On the leaf cluster, save this as trusted_cluster.yaml (replace the proxy address if it is\nnot reachable as shown, and map this cluster's roles to the leaf's) and run\n`pctl create -f trusted_cluster.yaml` there:\n\n")
	web := net.JoinHostPort(hostOf(c.addr), "3080")
	fmt.Fprintf(c.stdout, "kind: trusted_cluster\nmetadata: {name: %s}\nspec:\n  enabled: true\n  proxy_addr: %s\n  token: %s\n  role_map: [{remote: access, local: [access]}]\n", clusterName, web, full)
}
