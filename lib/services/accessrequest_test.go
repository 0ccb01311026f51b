package services

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRoleRequestOptions: request and review_requests are validated like
// every role option, and get their defaults.
func TestRoleRequestOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		spec RoleSpec
		want string
	}{
		"no roles":        {RoleSpec{Request: &RequestOption{}}, "spec.request.roles"},
		"bad role":        {RoleSpec{Request: &RequestOption{Roles: []string{"a b"}}}, "spec.request.roles"},
		"ttl too long":    {RoleSpec{Request: &RequestOption{Roles: []string{"dba"}, MaxTTL: Duration(8 * 24 * time.Hour)}}, "spec.request.max_ttl"},
		"thresholds":      {RoleSpec{Request: &RequestOption{Roles: []string{"dba"}, Thresholds: 11}}, "spec.request.thresholds"},
		"review no roles": {RoleSpec{ReviewRequests: &ReviewRequestsOption{}}, "spec.review_requests.roles"},
		"review bad role": {RoleSpec{ReviewRequests: &ReviewRequestsOption{Roles: []string{""}}}, "spec.review_requests.roles"},
	} {
		t.Run(name, func(t *testing.T) {
			r := &Role{Metadata: Metadata{Name: "r"}, Spec: tc.spec}
			err := r.CheckAndSetDefaults()
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	r := &Role{Metadata: Metadata{Name: "r"}, Spec: RoleSpec{Request: &RequestOption{Roles: []string{"dba"}}}}
	require.NoError(t, r.CheckAndSetDefaults())
	require.Equal(t, DefaultRequestMaxTTL, r.Spec.Request.MaxTTL.Value())
	require.Equal(t, 1, r.Spec.Request.Thresholds)

	// A file with the options, through the resource parser.
	_, v, err := UnmarshalResource([]byte("kind: role\nmetadata: {name: dev}\nspec:\n  request: {roles: [dba], max_ttl: 4h, thresholds: 2}\n  review_requests: {roles: [dba]}\n"), "dev.yaml")
	require.NoError(t, err)
	role := v.(*Role)
	require.Equal(t, 4*time.Hour, role.Spec.Request.MaxTTL.Value())
	require.Equal(t, 2, role.Spec.Request.Thresholds)
	_, _, err = UnmarshalResource([]byte("kind: role\nmetadata: {name: dev}\nspec:\n  request: {roles: [dba], max_tll: 4h}\n"), "dev.yaml")
	require.ErrorContains(t, err, "max_tll")
}

// TestRequestPolicy: every wanted role must be requestable; the strictest
// cap and the most approvals win.
func TestRequestPolicy(t *testing.T) {
	a := &Role{Spec: RoleSpec{Request: &RequestOption{Roles: []string{"dba", "ops"}, MaxTTL: Duration(4 * time.Hour), Thresholds: 1}}}
	b := &Role{Spec: RoleSpec{Request: &RequestOption{Roles: []string{"ops"}, MaxTTL: Duration(time.Hour), Thresholds: 2}}}
	p, err := RequestPolicyFor([]*Role{a, b}, []string{"dba", "ops"})
	require.NoError(t, err)
	require.Equal(t, RequestPolicy{MaxTTL: time.Hour, Thresholds: 2}, p)
	_, err = RequestPolicyFor([]*Role{a}, []string{"dba", "root"})
	require.ErrorContains(t, err, "root")
	rev := &Role{Spec: RoleSpec{ReviewRequests: &ReviewRequestsOption{Roles: []string{"dba"}}}}
	require.True(t, CanReviewRequest([]*Role{rev}, []string{"dba"}))
	require.False(t, CanReviewRequest([]*Role{rev}, []string{"dba", "ops"}))
	require.False(t, CanReviewRequest([]*Role{a}, []string{"dba"}))
}

// TestLockTargetAccessRequest: a lock on a request id keys, parses and
// checks like the other targets.
func TestLockTargetAccessRequest(t *testing.T) {
	id := NewAccessRequestID()
	tg, err := ParseLockTarget(LockTargetAccessRequest, id)
	require.NoError(t, err)
	require.Equal(t, LockTarget{AccessRequest: id}, tg)
	require.Equal(t, "/locks/access_request/"+id, LockKey(tg))
	_, err = ParseLockTarget(LockTargetAccessRequest, "nope")
	require.ErrorContains(t, err, "UUID")
	require.Error(t, LockTarget{User: "a", AccessRequest: id}.Check())
}
