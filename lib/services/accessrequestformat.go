package services

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gravitational/trace"
)

// WriteAccessRequests prints requests as the table psh request ls and
// pctl requests ls show. Reasons are the requester's text: the table
// escapes every cell.
func WriteAccessRequests(w io.Writer, list []AccessRequest, now time.Time) error {
	tw := NewTable(w, "ID", "USER", "ROLES", "STATE", "APPROVALS", "CREATED", "EXPIRES", "REASON")
	for _, r := range list {
		tw.Row(r.ID, r.User, strings.Join(r.Roles, ","), r.StateAt(now), fmt.Sprintf("%d/%d", r.Approvals(), max(r.Thresholds, 1)),
			r.Created.UTC().Format(time.RFC3339), r.Expires.UTC().Format(time.RFC3339), r.Reason)
	}
	return trace.Wrap(tw.Flush())
}

// WriteAccessRequest prints one request with its reviews.
func WriteAccessRequest(w io.Writer, r *AccessRequest, now time.Time) error {
	tw := NewTable(w, "FIELD", "VALUE")
	tw.Row("id", r.ID)
	tw.Row("user", r.User)
	tw.Row("roles", strings.Join(r.Roles, ","))
	tw.Row("state", r.StateAt(now))
	tw.Row("approvals", fmt.Sprintf("%d/%d", r.Approvals(), max(r.Thresholds, 1)))
	tw.Row("reason", r.Reason)
	tw.Row("created", r.Created.UTC().Format(time.RFC3339))
	tw.Row("expires", r.Expires.UTC().Format(time.RFC3339))
	for _, rv := range r.Reviews {
		tw.Row("review", fmt.Sprintf("%s %s at %s: %s", rv.Reviewer, rv.State, rv.Time.UTC().Format(time.RFC3339), rv.Reason))
	}
	return trace.Wrap(tw.Flush())
}

// StateAt is the state as of now: a pending or approved request past its
// expiry is expired even before auth's sweep marks it.
func (r *AccessRequest) StateAt(now time.Time) string {
	if (r.State == RequestPending || r.State == RequestApproved) && !now.Before(r.Expires) {
		return RequestExpired
	}
	return r.State
}
