package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
)

// explainRequests adds to `pctl route --user NAME HOST` the access NAME
// has from approved access requests: the proxy explains the user's own
// roles (the certificate pctl signs carries no request), so for each
// approved request in force this names the request id, its roles and
// which of the target's nodes they reach, with which logins. It reports
// whether any request reaches the target.
func (c *cli) explainRequests(ctx context.Context, clt *auth.Client, user string, t proxy.Target) (bool, error) {
	if t.Cluster != "" {
		return false, nil // a leaf's part is the leaf's; requests are this cluster's
	}
	reqs, err := clt.ListAccessRequests(ctx, nil)
	if err != nil {
		return false, trace.Wrap(err, "listing access requests")
	}
	now := time.Now()
	var active []services.AccessRequest
	for _, r := range reqs {
		if r.User == user && r.StateAt(now) == services.RequestApproved {
			active = append(active, r)
		}
	}
	if len(active) == 0 {
		return false, nil
	}
	users, err := clt.GetUsers(ctx)
	if err != nil {
		return false, trace.Wrap(err)
	}
	var traits map[string][]string
	for _, u := range users {
		if u.Name == user {
			traits = u.Traits
		}
	}
	nodes, err := clt.GetNodes(ctx, "")
	if err != nil {
		return false, trace.Wrap(err)
	}
	var targets []services.Node
	for _, n := range nodes {
		if strings.EqualFold(n.Hostname, t.Host) || n.UUID == t.Host {
			targets = append(targets, n)
		}
	}
	reached := false
	for _, r := range active {
		var roles []*services.Role
		for _, name := range r.Roles {
			role, err := clt.GetRole(ctx, name)
			if trace.IsNotFound(err) {
				continue
			}
			if err != nil {
				return false, trace.Wrap(err)
			}
			roles = append(roles, role)
		}
		checker := services.NewAccessChecker(roles, traits)
		fmt.Fprintf(c.stdout, "request:    %s (roles %s, approved, until %s)\n", r.ID, services.EscapeText(strings.Join(r.Roles, ",")), r.Expires.UTC().Format(time.RFC3339))
		grants := false
		for _, n := range targets {
			var logins []string
			for _, l := range checker.Logins() {
				if checker.CheckAccessToNode(&n, l) == nil {
					logins = append(logins, l)
				}
			}
			if len(logins) > 0 {
				grants = true
				fmt.Fprintf(c.stdout, "  grants %s (%s) as %s: psh login --request-id %s\n", services.EscapeText(n.Hostname), n.UUID, services.EscapeText(strings.Join(logins, ",")), r.ID)
			}
		}
		if !grants {
			fmt.Fprintf(c.stdout, "  grants nothing on %s\n", services.EscapeText(t.Host))
		}
		reached = reached || grants
	}
	return reached, nil
}
