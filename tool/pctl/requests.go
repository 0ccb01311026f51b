package main

import (
	"context"
	"fmt"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// registerRequests adds pctl requests: an admin lists, shows and reviews
// every access request (a user reviews with psh request or the web UI,
// within their review_requests).
func (c *cli) registerRequests(app *kingpin.Application, add adder) {
	reqs := app.Command("requests", "Access requests: list, show, approve, deny.")
	var format, id, reason string
	ls := reqs.Command("ls", "List every access request.")
	listFormatFlag(ls, &format)
	add(ls, func(ctx context.Context) error { return c.requestsLs(ctx, format) })
	show := reqs.Command("show", "Show one access request and its reviews.")
	listFormatFlag(show, &format)
	show.Arg("id", "Request id.").Required().StringVar(&id)
	add(show, func(ctx context.Context) error { return c.requestsShow(ctx, id, format) })
	for _, verdict := range []string{"approve", "deny"} {
		state := services.RequestApproved
		help := "Approve an access request (it is granted once it has its thresholds of approvals)."
		if verdict == "deny" {
			state = services.RequestDenied
			help = "Deny an access request; denying an approved one ends its roles on open connections within seconds."
		}
		cc := reqs.Command(verdict, help)
		cc.Flag("reason", "Why, for the requester.").StringVar(&reason)
		cc.Arg("id", "Request id.").Required().StringVar(&id)
		add(cc, func(ctx context.Context) error { return c.requestsReview(ctx, id, state, reason) })
	}
}

func (c *cli) requestsLs(ctx context.Context, format string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	list, err := clt.ListAccessRequests(ctx, nil)
	if err != nil {
		return trace.Wrap(err)
	}
	if format == formatJSON {
		return trace.Wrap(writeJSON(c.stdout, nonNilRequests(list)))
	}
	return trace.Wrap(services.WriteAccessRequests(c.stdout, list, time.Now()))
}

func nonNilRequests(l []services.AccessRequest) []services.AccessRequest {
	if l == nil {
		return []services.AccessRequest{}
	}
	return l
}

func (c *cli) requestsShow(ctx context.Context, id, format string) error {
	if err := services.CheckRequestID(id); err != nil {
		return trace.Wrap(err)
	}
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	r, err := clt.GetAccessRequest(ctx, nil, id)
	if err != nil {
		return trace.Wrap(err)
	}
	if format == formatJSON {
		return trace.Wrap(writeJSON(c.stdout, r))
	}
	return trace.Wrap(services.WriteAccessRequest(c.stdout, r, time.Now()))
}

func (c *cli) requestsReview(ctx context.Context, id, state, reason string) error {
	if err := services.CheckRequestID(id); err != nil {
		return trace.Wrap(err)
	}
	if err := services.CheckRequestReason(reason); err != nil {
		return trace.Wrap(err)
	}
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	r, err := clt.ReviewAccessRequest(ctx, authapi.AccessRequestReview{ID: id, State: state, Reason: reason})
	if err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "Access request %s is %s.\n", r.ID, r.State)
	return nil
}
