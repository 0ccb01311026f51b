package services

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
)

// Access requests give a user a role for a while, after someone else said
// yes: standing access to production is what auditors object to first.
// A role's `request` option says which roles its holders may ask for, and
// for how long at most; `review_requests` says whose requests a holder may
// approve or deny. The auth server keeps the requests (lib/auth), issues
// certificates carrying an approved request's roles and id, and ends
// those roles on open connections through the lock machinery: a request
// that stops being approved gets a lock on its id (LockTarget.AccessRequest).

// KindAccessRequest is the kind of an access request.
const KindAccessRequest = "access_request"

const accessRequestsPrefix = "access_requests"

// Access request states.
const (
	RequestPending  = "pending"
	RequestApproved = "approved"
	RequestDenied   = "denied"
	RequestExpired  = "expired"
)

// CertExtensionRequestID names, in a user certificate, the access request
// whose roles it carries: servers end connections of a certificate whose
// request is no longer approved (a lock on the id).
const CertExtensionRequestID = "postern-request-id@postern.dev"

// Request limits.
const (
	// DefaultRequestMaxTTL caps a request whose role option names no
	// max_ttl: an hour is a task, not a shift.
	DefaultRequestMaxTTL = time.Hour
	// MaxRequestMaxTTL bounds max_ttl: longer than a week is standing
	// access by another name.
	MaxRequestMaxTTL = 7 * 24 * time.Hour
	// RequestRetention is how long a finished request's record stays
	// readable after its expiry (pctl requests ls shows what happened).
	RequestRetention = 24 * time.Hour
	// maxRequestReasonLen bounds a reason: one line for a reviewer.
	maxRequestReasonLen = 512
	// maxRequestThresholds bounds thresholds.
	maxRequestThresholds = 10
)

// RequestOption is a role's `request` option: the roles its holders may ask
// for, the longest a grant may last and how many approvals it needs.
type RequestOption struct {
	Roles      []string `json:"roles"`
	MaxTTL     Duration `json:"max_ttl,omitempty"`
	Thresholds int      `json:"thresholds,omitempty"`
}

// ReviewRequestsOption is a role's `review_requests` option.
type ReviewRequestsOption struct {
	Roles []string `json:"roles"`
}

// AccessRequestReview is one reviewer's verdict.
type AccessRequestReview struct {
	Reviewer string    `json:"reviewer"`
	State    string    `json:"state"`
	Reason   string    `json:"reason,omitempty"`
	Time     time.Time `json:"time"`
}

// AccessRequest is one user's request for roles.
type AccessRequest struct {
	ID      string                `json:"id"`
	User    string                `json:"user"`
	Roles   []string              `json:"roles"`
	Reason  string                `json:"reason,omitempty"`
	State   string                `json:"state"`
	Reviews []AccessRequestReview `json:"reviews,omitempty"`
	// Thresholds is the number of approvals the request needs, fixed at
	// creation from the requester's roles.
	Thresholds int       `json:"thresholds"`
	Created    time.Time `json:"created"`
	// Expires is when the request (pending) and its grant (approved)
	// end.
	Expires time.Time `json:"expires"`
}

// Approvals counts the approving reviews.
func (r *AccessRequest) Approvals() int {
	n := 0
	for _, rv := range r.Reviews {
		if rv.State == RequestApproved {
			n++
		}
	}
	return n
}

// ReviewedBy reports whether reviewer already reviewed r.
func (r *AccessRequest) ReviewedBy(reviewer string) bool {
	return slices.ContainsFunc(r.Reviews, func(rv AccessRequestReview) bool { return rv.Reviewer == reviewer })
}

// CheckRequestID validates a request id as typed by a user: a UUID.
func CheckRequestID(id string) error {
	if _, err := uuid.Parse(id); err != nil || len(id) != 36 {
		return trace.BadParameter("access request id %q: want a UUID like 3f2a...-....", id)
	}
	return nil
}

// CheckRequestReason validates a requester's or reviewer's reason: shown
// on terminals and in the web UI, so no control characters.
func CheckRequestReason(reason string) error {
	if len(reason) > maxRequestReasonLen {
		return trace.BadParameter("reason is longer than %d characters", maxRequestReasonLen)
	}
	for _, r := range reason {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return trace.BadParameter("reason contains the control character %q", r)
		}
	}
	return nil
}

// CheckAndSetDefaults validates a stored request.
func (r *AccessRequest) CheckAndSetDefaults() error {
	if err := CheckRequestID(r.ID); err != nil {
		return trace.Wrap(err)
	}
	if err := CheckUserName(r.User); err != nil {
		return trace.Wrap(err)
	}
	if len(r.Roles) == 0 {
		return trace.BadParameter("access request names no roles: want --roles ROLE[,ROLE]")
	}
	for _, role := range r.Roles {
		if err := CheckRoleName(role); err != nil {
			return trace.BadParameter("access request: roles: %v", err)
		}
	}
	if err := CheckRequestReason(r.Reason); err != nil {
		return trace.Wrap(err)
	}
	switch r.State {
	case RequestPending, RequestApproved, RequestDenied, RequestExpired:
	default:
		return trace.BadParameter("access request state %q: want %s, %s, %s or %s", r.State, RequestPending, RequestApproved, RequestDenied, RequestExpired)
	}
	if r.Thresholds < 1 {
		r.Thresholds = 1
	}
	return nil
}

// checkRequestOptions validates a role's request and review_requests.
func (r *Role) checkRequestOptions() error {
	name := r.Metadata.Name
	if o := r.Spec.Request; o != nil {
		if len(o.Roles) == 0 {
			return trace.BadParameter("role %q: spec.request.roles: name at least one role that may be requested", name)
		}
		for _, role := range o.Roles {
			if err := CheckRoleName(role); err != nil {
				return trace.BadParameter("role %q: spec.request.roles: %v", name, err)
			}
		}
		if o.MaxTTL < 0 || o.MaxTTL.Value() > MaxRequestMaxTTL {
			return trace.BadParameter("role %q: spec.request.max_ttl %v: want a positive duration up to %v", name, o.MaxTTL.Value(), MaxRequestMaxTTL)
		}
		if o.MaxTTL == 0 {
			o.MaxTTL = Duration(DefaultRequestMaxTTL)
		}
		if o.Thresholds < 0 || o.Thresholds > maxRequestThresholds {
			return trace.BadParameter("role %q: spec.request.thresholds %d: want 1 to %d", name, o.Thresholds, maxRequestThresholds)
		}
		if o.Thresholds == 0 {
			o.Thresholds = 1
		}
	}
	if o := r.Spec.ReviewRequests; o != nil {
		if len(o.Roles) == 0 {
			return trace.BadParameter("role %q: spec.review_requests.roles: name at least one role whose requests may be reviewed", name)
		}
		for _, role := range o.Roles {
			if err := CheckRoleName(role); err != nil {
				return trace.BadParameter("role %q: spec.review_requests.roles: %v", name, err)
			}
		}
	}
	return nil
}

// RequestPolicy is what a requester's roles allow them to ask for.
type RequestPolicy struct {
	// MaxTTL is the longest grant; Thresholds the approvals needed.
	MaxTTL     time.Duration
	Thresholds int
}

// RequestPolicyFor decides whether the holder of roles may request want:
// every wanted role must be named by some role's request option. The cap
// is the smallest max_ttl of the options that allow a wanted role (the
// strictest word wins), the thresholds the largest.
func RequestPolicyFor(roles []*Role, want []string) (RequestPolicy, error) {
	var p RequestPolicy
	var refused []string
	for _, w := range want {
		allowed := false
		for _, r := range roles {
			o := r.Spec.Request
			if o == nil || !slices.Contains(o.Roles, w) {
				continue
			}
			allowed = true
			ttl := o.MaxTTL.Value()
			if ttl <= 0 {
				ttl = DefaultRequestMaxTTL
			}
			if p.MaxTTL == 0 || ttl < p.MaxTTL {
				p.MaxTTL = ttl
			}
			p.Thresholds = max(p.Thresholds, o.Thresholds, 1)
		}
		if !allowed {
			refused = append(refused, w)
		}
	}
	if len(refused) > 0 {
		return p, trace.AccessDenied("your roles do not allow requesting role(s) %s: a role's request option must name them", strings.Join(refused, ", "))
	}
	return p, nil
}

// CanReviewRequest reports whether the holder of roles may review a request
// for want: every wanted role must be in some role's review_requests.
func CanReviewRequest(roles []*Role, want []string) bool {
	if len(want) == 0 {
		return false
	}
	for _, w := range want {
		ok := slices.ContainsFunc(roles, func(r *Role) bool {
			return r.Spec.ReviewRequests != nil && slices.Contains(r.Spec.ReviewRequests.Roles, w)
		})
		if !ok {
			return false
		}
	}
	return true
}

// NewAccessRequestID is a fresh, unguessable request id.
func NewAccessRequestID() string { return uuid.NewString() }

// AccessRequestKey is the backend key of request id.
func AccessRequestKey(id string) string { return backend.Key(accessRequestsPrefix, id) }

// AccessRequestsPrefix is the prefix of every request's key.
func AccessRequestsPrefix() string { return backend.Prefix(accessRequestsPrefix) }

// recordExpiry is when the backend drops r's record.
func (r *AccessRequest) recordExpiry() time.Time {
	return r.Expires.Add(RequestRetention)
}

// CreateAccessRequest writes a new request; an existing id is refused.
func (s *Store) CreateAccessRequest(ctx context.Context, r AccessRequest) error {
	if err := r.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(s.create(ctx, AccessRequestKey(r.ID), r, r.recordExpiry()))
}

// UpdateAccessRequest rewrites a request only if it is still as read
// (prev): two reviewers answering at once must not lose a review.
func (s *Store) UpdateAccessRequest(ctx context.Context, prev backend.Item, r AccessRequest) error {
	if err := r.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return trace.Wrap(err)
	}
	_, err = s.b.CompareAndSwap(ctx, prev, backend.Item{Key: AccessRequestKey(r.ID), Value: data, Expires: r.recordExpiry()})
	return trace.Wrap(err)
}

// GetAccessRequest returns the request and the item it was read from (for
// UpdateAccessRequest).
func (s *Store) GetAccessRequest(ctx context.Context, id string) (*AccessRequest, backend.Item, error) {
	notFound := trace.NotFound("access request %q not found", id)
	if CheckRequestID(id) != nil {
		return nil, backend.Item{}, notFound
	}
	item, err := s.b.Get(ctx, AccessRequestKey(id))
	if trace.IsNotFound(err) {
		return nil, backend.Item{}, notFound
	}
	if err != nil {
		return nil, backend.Item{}, trace.Wrap(err)
	}
	var r AccessRequest
	if err := json.Unmarshal(item.Value, &r); err != nil {
		return nil, backend.Item{}, trace.BadParameter("corrupt access request at %q: %v", item.Key, err)
	}
	return &r, *item, nil
}

// GetAccessRequests returns every stored request, oldest first.
func (s *Store) GetAccessRequests(ctx context.Context) ([]AccessRequest, error) {
	out, err := getAllSkipping[AccessRequest](ctx, s, AccessRequestsPrefix(), true)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}
