package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// tokenPrefixLen is how much of a token `pctl tokens ls` shows, and the
// least `pctl tokens rm` accepts. A token is the credential that joins a
// host (16 random bytes, 32 hex digits): a listing ends up in terminals,
// scrollback, tickets and CI logs, so it shows only enough to tell tokens
// apart and to name one to rm. Eight hex digits leave 96 unknown bits,
// as unguessable as ever; --with-secrets prints the whole token for the
// admin who asks (as tctl tokens ls --with-secrets does).
const tokenPrefixLen = 8

// tokenListing is one row of `pctl tokens ls --format json`: Token is set
// only with --with-secrets.
type tokenListing struct {
	Prefix   string    `json:"prefix"`
	Token    string    `json:"token,omitempty"`
	Type     string    `json:"type"`
	Expires  time.Time `json:"expires"`
	MultiUse bool      `json:"multi_use,omitempty"`
}

func tokenPrefix(name string) string {
	if len(name) <= tokenPrefixLen {
		return name
	}
	return name[:tokenPrefixLen]
}

func (c *cli) tokensLs(ctx context.Context, format string, withSecrets bool) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	tokens, err := clt.GetTokens(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	sort.Slice(tokens, func(i, j int) bool { return tokens[i].Expires.Before(tokens[j].Expires) })
	now := time.Now()
	var rows []tokenListing
	for _, t := range tokens {
		if !t.Expires.IsZero() && !now.Before(t.Expires) {
			continue // expired: worthless, and gone at its TTL
		}
		row := tokenListing{Prefix: tokenPrefix(t.Name), Type: t.Type, Expires: t.Expires.UTC(), MultiUse: t.MultiUse}
		if withSecrets {
			row.Token = t.Name
		}
		rows = append(rows, row)
	}
	return trace.Wrap(writeList(c.stdout, format, rows, func() error {
		if len(rows) == 0 {
			fmt.Fprintln(c.stdout, "No join tokens.")
			return nil
		}
		header := "TOKEN"
		if !withSecrets {
			header = "TOKEN (PREFIX)"
		}
		tw := services.NewTable(c.stdout, header, "TYPE", "EXPIRES", "USES")
		for _, r := range rows {
			tok := r.Prefix + "..."
			if withSecrets {
				tok = r.Token
			}
			uses := "single"
			if r.MultiUse {
				uses = "multi"
			}
			tw.Row(tok, r.Type, fmt.Sprintf("%s (in %s)", r.Expires.Format(time.RFC3339), r.Expires.Sub(now).Round(time.Second)), uses)
		}
		return tw.Flush()
	}))
}

// resolveToken finds the one token named by ref: the whole token, or a
// prefix of at least tokenPrefixLen characters that no other token has.
func resolveToken(tokens []services.Token, ref string) (string, error) {
	var matches []string
	for _, t := range tokens {
		if t.Name == ref {
			return t.Name, nil
		}
		if strings.HasPrefix(t.Name, ref) {
			matches = append(matches, t.Name)
		}
	}
	if len(ref) < tokenPrefixLen {
		return "", trace.BadParameter("token %q is too short: give the whole token or at least the %d characters pctl tokens ls shows", ref, tokenPrefixLen)
	}
	switch len(matches) {
	case 0:
		return "", trace.NotFound("no join token is or starts with %q (see pctl tokens ls; a spent or expired token is gone)", ref)
	case 1:
		return matches[0], nil
	}
	// Show a little more of each, enough to pick one: still not the
	// secret.
	shown := make([]string, len(matches))
	for i, m := range matches {
		shown[i] = m[:min(len(m), len(ref)+4)] + "..."
	}
	sort.Strings(shown)
	return "", trace.BadParameter("%q is ambiguous: %d tokens start with it (%s); give more characters", ref, len(matches), strings.Join(shown, ", "))
}

func (c *cli) tokensRm(ctx context.Context, ref string) error {
	ref = strings.TrimSuffix(strings.TrimSpace(ref), "...")
	if ref == "" {
		return trace.BadParameter("missing token")
	}
	// A trusted_cluster token as `tokens add` printed it carries the CA
	// pin after the name.
	if name, _, err := services.ParseTrustedClusterToken(ref); err == nil {
		ref = name
	}
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	tokens, err := clt.GetTokens(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	name, err := resolveToken(tokens, ref)
	if err != nil {
		return trace.Wrap(err)
	}
	if err := clt.DeleteToken(ctx, name); err != nil {
		if trace.IsNotFound(err) {
			return trace.NotFound("join token %s... was spent or expired meanwhile", tokenPrefix(name))
		}
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "Join token %s... removed: no host can join with it.\n", tokenPrefix(name))
	return nil
}
