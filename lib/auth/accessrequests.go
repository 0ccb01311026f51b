package auth

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// Access requests live here: created by a user, reviewed by others, turned
// into certificates carrying the granted roles and the request id, and
// ended by a lock on the id when a grant stops (a deny of an approved
// request, its expiry). Every proxy and node already ends, within
// seconds, the connections a new lock covers, so a grant's end needs no
// mechanism of its own.

// requestViewer is who asks: a user (through the proxy, proven by the
// user's certificate) or an admin identity (pctl), which sees and reviews
// every request.
type requestViewer struct {
	// User is the Postern user; empty for an admin identity.
	User string
	// Admin names the admin identity (for reviews and audit).
	Admin string
	// Roles are the user's roles, as stored now (not as the certificate
	// says: a role taken away since must not keep its review rights).
	Roles []*services.Role
	// Cert is the user's verified certificate.
	Cert *ssh.Certificate
}

// name is how reviews and audit name the viewer.
func (v *requestViewer) name() string {
	if v.User != "" {
		return v.User
	}
	return v.Admin
}

// canReview reports whether v may review r: an admin identity always, a
// user only another user's request whose roles review_requests all name.
func (v *requestViewer) canReview(r *services.AccessRequest) bool {
	if v.User == "" {
		return true
	}
	return r.User != v.User && services.CanReviewRequest(v.Roles, r.Roles)
}

// canSee reports whether v may see r at all: its own, or reviewable.
func (v *requestViewer) canSee(r *services.AccessRequest) bool {
	return v.User == "" || r.User == v.User || v.canReview(r)
}

// requestViewerFor builds the viewer of an API call: an admin identity as
// itself, a proxy only for the user whose valid certificate it passes.
func (s *Server) requestViewerFor(ctx context.Context, p *peer, userCert []byte) (*requestViewer, error) {
	if p.Role == RoleAdmin {
		return &requestViewer{Admin: p.Role + ":" + p.ID}, nil
	}
	cert, err := s.verifyUserCert(userCert)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	user, err := s.store.GetUser(ctx, cert.KeyId)
	if err != nil {
		return nil, trace.AccessDenied("the certificate's user %q does not exist", cert.KeyId)
	}
	if err := s.checkUserLock(ctx, user.Name); err != nil {
		return nil, trace.Wrap(err)
	}
	if id := cert.Permissions.Extensions[services.CertExtensionRequestID]; id != "" {
		// A certificate of an ended grant speaks for nobody, as it
		// reaches no server.
		if l, err := s.store.GetLock(ctx, services.LockTarget{AccessRequest: id}); err == nil && !l.IsExpired(s.clock.Now()) {
			return nil, trace.AccessDenied("%s", l.Refusal())
		}
	}
	roles, err := s.userRoles(ctx, user.Roles)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &requestViewer{User: user.Name, Roles: roles, Cert: cert}, nil
}

// verifyUserCert checks that data is a user certificate of this cluster's
// user CA, valid now (auth's clock), naming a user.
func (s *Server) verifyUserCert(data []byte) (*ssh.Certificate, error) {
	if len(data) == 0 {
		return nil, trace.AccessDenied("missing the user's certificate")
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey(data)
	if err != nil {
		return nil, trace.AccessDenied("user certificate: %v", err)
	}
	cert, ok := pub.(*ssh.Certificate)
	if !ok || cert.CertType != ssh.UserCert {
		return nil, trace.AccessDenied("user certificate: not an SSH user certificate")
	}
	caKeys, err := parseAuthorizedKeys(s.userCA.SSHPublicKeys)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	checker := &ssh.CertChecker{
		IsUserAuthority: func(auth ssh.PublicKey) bool {
			return slices.ContainsFunc(caKeys, func(k ssh.PublicKey) bool { return bytes.Equal(k.Marshal(), auth.Marshal()) })
		},
		Clock: s.clock.Now,
	}
	if len(cert.ValidPrincipals) == 0 {
		return nil, trace.AccessDenied("user certificate: no principals")
	}
	if err := checker.CheckCert(cert.ValidPrincipals[0], cert); err != nil {
		return nil, trace.AccessDenied("user certificate: %v", err)
	}
	if !checker.IsUserAuthority(cert.SignatureKey) {
		return nil, trace.AccessDenied("user certificate: not signed by this cluster's user CA")
	}
	if u := cert.Permissions.Extensions[services.CertExtensionUser]; u == "" || u != cert.KeyId {
		return nil, trace.AccessDenied("user certificate: names no Postern user")
	}
	return cert, nil
}

// userRoles loads roles by name; a missing role grants nothing.
func (s *Server) userRoles(ctx context.Context, names []string) ([]*services.Role, error) {
	var out []*services.Role
	for _, name := range names {
		r, err := s.store.GetRole(ctx, name)
		if trace.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, trace.Wrap(err)
		}
		out = append(out, r)
	}
	return out, nil
}

// CreateAccessRequest writes a pending request of v for req.Roles.
func (s *Server) CreateAccessRequest(ctx context.Context, v *requestViewer, req authapi.AccessRequestCreate) (*services.AccessRequest, error) {
	if v.User == "" {
		return nil, trace.BadParameter("an access request is made by a user (psh request create), not an admin identity")
	}
	roles := slices.Compact(slices.Sorted(slices.Values(req.Roles)))
	if len(roles) == 0 {
		return nil, trace.BadParameter("name the roles to request: --roles ROLE[,ROLE]")
	}
	if err := services.CheckRequestReason(req.Reason); err != nil {
		return nil, trace.Wrap(err)
	}
	policy, err := services.RequestPolicyFor(v.Roles, roles)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	ttl := req.TTL.Value()
	if ttl < 0 {
		return nil, trace.BadParameter("ttl %v: want a positive duration", ttl)
	}
	if ttl == 0 || ttl > policy.MaxTTL {
		ttl = policy.MaxTTL
	}
	now := s.clock.Now().UTC()
	r := services.AccessRequest{
		ID: services.NewAccessRequestID(), User: v.User, Roles: roles, Reason: req.Reason,
		State: services.RequestPending, Thresholds: policy.Thresholds, Created: now, Expires: now.Add(ttl),
	}
	if err := s.store.CreateAccessRequest(ctx, r); err != nil {
		return nil, trace.Wrap(err)
	}
	s.emitRequest(ctx, events.AccessRequestCreate, v.name(), &r, events.Fields{events.FieldReason: r.Reason})
	s.log.WithFields(map[string]any{"request": r.ID, "user": r.User, "roles": r.Roles, "ttl": ttl.String()}).Info("Access request created.")
	return &r, nil
}

// getVisibleRequest reads one request if v may see it; any other is "not
// found", exactly as a missing one, so its existence is not confirmed.
func (s *Server) getVisibleRequest(ctx context.Context, v *requestViewer, id string) (*services.AccessRequest, backend.Item, error) {
	r, item, err := s.store.GetAccessRequest(ctx, id)
	if err != nil {
		return nil, item, trace.Wrap(err)
	}
	if !v.canSee(r) {
		return nil, item, trace.NotFound("access request %q not found", id)
	}
	return r, item, nil
}

// GetAccessRequest returns one request v may see.
func (s *Server) GetAccessRequest(ctx context.Context, v *requestViewer, id string) (*services.AccessRequest, error) {
	r, _, err := s.getVisibleRequest(ctx, v, id)
	return r, trace.Wrap(err)
}

// ListAccessRequests returns the requests v may see: its own and those it
// may review.
func (s *Server) ListAccessRequests(ctx context.Context, v *requestViewer) ([]services.AccessRequest, error) {
	all, err := s.store.GetAccessRequests(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	out := []services.AccessRequest{}
	for i := range all {
		if v.canSee(&all[i]) {
			out = append(out, all[i])
		}
	}
	return out, nil
}

// ReviewAccessRequest records v's approval or denial. A request is
// approved once it has its thresholds of approvals, denied at the first
// denial; a denial of an approved request ends its grant (a lock on the
// id). A user never reviews their own request, nor one for a role their
// review_requests does not name (not found: they may not see it).
func (s *Server) ReviewAccessRequest(ctx context.Context, v *requestViewer, req authapi.AccessRequestReview) (*services.AccessRequest, error) {
	if req.State != services.RequestApproved && req.State != services.RequestDenied {
		return nil, trace.BadParameter("review state %q: want %q or %q", req.State, services.RequestApproved, services.RequestDenied)
	}
	if err := services.CheckRequestReason(req.Reason); err != nil {
		return nil, trace.Wrap(err)
	}
	for range 5 {
		r, item, err := s.getVisibleRequest(ctx, v, req.ID)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		if r.User == v.User {
			return nil, trace.AccessDenied("you cannot review your own access request")
		}
		if !v.canReview(r) {
			return nil, trace.NotFound("access request %q not found", req.ID)
		}
		now := s.clock.Now().UTC()
		if r.State == services.RequestPending && !now.Before(r.Expires) {
			r.State = services.RequestExpired
		}
		switch {
		case r.State == services.RequestDenied || r.State == services.RequestExpired:
			return nil, trace.BadParameter("access request %s is %s: it can no longer be reviewed", r.ID, r.State)
		case r.State == services.RequestApproved && req.State == services.RequestApproved:
			return nil, trace.BadParameter("access request %s is already approved", r.ID)
		case r.ReviewedBy(v.name()) && req.State == services.RequestApproved:
			return nil, trace.BadParameter("you already reviewed access request %s", r.ID)
		}
		was := r.State
		r.Reviews = append(r.Reviews, services.AccessRequestReview{Reviewer: v.name(), State: req.State, Reason: req.Reason, Time: now})
		if req.State == services.RequestDenied {
			r.State = services.RequestDenied
		} else if r.Approvals() >= r.Thresholds {
			r.State = services.RequestApproved
		}
		err = s.store.UpdateAccessRequest(ctx, item, *r)
		if trace.IsCompareFailed(err) {
			continue // another review landed first: decide again
		}
		if err != nil {
			return nil, trace.Wrap(err)
		}
		if was == services.RequestApproved && r.State == services.RequestDenied {
			if err := s.lockRequest(ctx, r, "the access request was denied"); err != nil {
				return nil, trace.Wrap(err)
			}
		}
		s.emitRequest(ctx, events.AccessRequestReview, v.name(), r, events.Fields{events.FieldReason: req.Reason, fieldReview: req.State})
		s.log.WithFields(map[string]any{"request": r.ID, "reviewer": v.name(), "review": req.State, "state": r.State}).Info("Access request reviewed.")
		return r, nil
	}
	return nil, trace.CompareFailed("access request %s is being reviewed by others at the same time: try again", req.ID)
}

// fieldReview is the review's verdict in access_request.review.
const fieldReview = "review"

// lockRequest ends request r's grant on every server: certificates carrying
// its id are refused and their connections ended. The lock outlives every
// certificate the request could have been issued into.
func (s *Server) lockRequest(ctx context.Context, r *services.AccessRequest, why string) error {
	now := s.clock.Now().UTC()
	err := s.store.UpsertLock(ctx, services.Lock{
		Target: services.LockTarget{AccessRequest: r.ID}, Message: why,
		CreatedBy: RoleAuth, Created: now, Expires: r.Expires.Add(services.RequestRetention),
	})
	return trace.Wrap(err, "locking access request %s", r.ID)
}

// GenerateRequestCert issues v a certificate with its roles and the
// approved request's, carrying the request id, expiring with the request
// (and never after v's current certificate). A request that is not v's,
// not approved or expired is refused.
func (s *Server) GenerateRequestCert(ctx context.Context, v *requestViewer, req authapi.AccessRequestCert) ([]byte, error) {
	if v.User == "" || v.Cert == nil {
		return nil, trace.BadParameter("a request certificate is issued to a user, not an admin identity")
	}
	// The key certified is the one the user's certificate is for: the
	// proxy passing the certificate (public data) cannot have the grant
	// certified for a key of its own.
	pub, err := parseAuthorizedKey(req.PublicKey)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if !bytes.Equal(pub.Marshal(), v.Cert.Key.Marshal()) {
		return nil, trace.AccessDenied("a request certificate is issued for the key of the certificate that asks for it")
	}
	r, _, err := s.store.GetAccessRequest(ctx, req.ID)
	if err != nil || r.User != v.User {
		return nil, trace.AccessDenied("access request %q is not an approved request of yours", req.ID)
	}
	now := s.clock.Now()
	if r.State != services.RequestApproved || !now.Before(r.Expires) {
		return nil, trace.AccessDenied("access request %s is %s, not approved: it grants nothing", r.ID, r.StateAt(now))
	}
	user, err := s.store.GetUser(ctx, v.User)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	granted := *user
	granted.Roles = slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(user.Roles), r.Roles...))))
	ttl := time.Unix(int64(v.Cert.ValidBefore), 0).Sub(now)
	if ttl <= 0 {
		return nil, trace.AccessDenied("your certificate has expired: log in again")
	}
	return s.generateUserCert(ctx, &granted, authapi.UserCertRequest{User: v.User, PublicKey: req.PublicKey, TTL: ttl}, r)
}

// applyRequestGrant makes cert carry request r: its id, and an expiry no
// later than the request's.
func applyRequestGrant(cert *ssh.Certificate, r *services.AccessRequest) {
	if r == nil {
		return
	}
	cert.Permissions.Extensions[services.CertExtensionRequestID] = r.ID
	if end := uint64(r.Expires.Unix()); end < cert.ValidBefore {
		cert.ValidBefore = end
	}
}

// requestExpiryInterval is how often expired requests are swept: a
// grant's end reaches open connections within this plus a lock's
// propagation.
const requestExpiryInterval = time.Second

// RunAccessRequestExpiry marks requests expired at their expiry (auth's
// clock), locks the grants of expired approved requests and audits
// access_request.expire, until ctx ends.
func (s *Server) RunAccessRequestExpiry(ctx context.Context) {
	t := s.clock.NewTicker(requestExpiryInterval)
	defer t.Stop()
	for {
		if err := s.ExpireAccessRequests(ctx); err != nil && ctx.Err() == nil {
			s.log.WithError(err).Warn("Failed to expire access requests.")
		}
		select {
		case <-t.Chan():
		case <-ctx.Done():
			return
		}
	}
}

// ExpireAccessRequests runs one sweep.
func (s *Server) ExpireAccessRequests(ctx context.Context) error {
	all, err := s.store.GetAccessRequests(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	now := s.clock.Now()
	var errs []error
	for i := range all {
		r := &all[i]
		if (r.State != services.RequestPending && r.State != services.RequestApproved) || now.Before(r.Expires) {
			continue
		}
		errs = append(errs, s.expireRequest(ctx, r.ID))
	}
	return trace.NewAggregate(errs...)
}

func (s *Server) expireRequest(ctx context.Context, id string) error {
	r, item, err := s.store.GetAccessRequest(ctx, id)
	if err != nil {
		return trace.Wrap(err)
	}
	if (r.State != services.RequestPending && r.State != services.RequestApproved) || s.clock.Now().Before(r.Expires) {
		return nil
	}
	was := r.State
	r.State = services.RequestExpired
	// The lock goes first: were the update to win and the lock fail, the
	// grant would outlive the request on open connections.
	if was == services.RequestApproved {
		if err := s.lockRequest(ctx, r, "the access request expired"); err != nil {
			return trace.Wrap(err)
		}
	}
	if err := s.store.UpdateAccessRequest(ctx, item, *r); err != nil {
		return trace.Wrap(err)
	}
	s.emitRequest(ctx, events.AccessRequestExpire, "", r, nil)
	s.log.WithField("request", r.ID).Info("Access request expired.")
	return nil
}

// emitRequest audits a step of request r, by (empty for auth itself).
func (s *Server) emitRequest(ctx context.Context, typ, by string, r *services.AccessRequest, extra events.Fields) {
	fields := events.Fields{
		events.FieldRequestID: r.ID,
		events.FieldRoles:     strings.Join(r.Roles, ","),
		fieldRequester:        r.User,
		fieldState:            r.State,
	}
	for k, v := range extra {
		if v != "" {
			fields[k] = v
		}
	}
	user := by
	if user == "" {
		user = r.User
	}
	s.cfg.Audit.Emit(context.WithoutCancel(ctx), events.Event{Type: typ, User: user, Fields: fields})
	s.notifyRequest(typ, user, r)
}

// RequestNotification is one line of the access_requests webhook: the
// step (the audit event type), who took it and the request after it.
type RequestNotification struct {
	Event   string                 `json:"event"`
	By      string                 `json:"by"`
	Time    time.Time              `json:"time"`
	Request services.AccessRequest `json:"request"`
}

// notifyRequest queues the webhook line; the exporter retries and never
// blocks.
func (s *Server) notifyRequest(typ, by string, r *services.AccessRequest) {
	if s.cfg.RequestNotifier == nil {
		return
	}
	line, err := json.Marshal(RequestNotification{Event: typ, By: by, Time: s.clock.Now().UTC(), Request: *r})
	if err != nil {
		s.log.WithError(err).Warn("Could not encode an access request notification.")
		return
	}
	s.cfg.RequestNotifier.Export(line)
}

const (
	fieldRequester = "requester"
	fieldState     = "state"
)
