package authz

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/services"
)

func TestCanViewRecording(t *testing.T) {
	plain := services.NewAccessChecker([]*services.Role{{Spec: services.RoleSpec{Logins: []string{"root"}}}}, nil)
	reviewer := services.NewAccessChecker([]*services.Role{{Spec: services.RoleSpec{ReviewRecordings: true}}}, nil)
	for _, tc := range []struct {
		name  string
		id    *Identity
		owner string
		want  bool
	}{
		{"own recording", &Identity{User: "alice", Checker: plain}, "alice", true},
		{"another user's", &Identity{User: "bob", Checker: plain}, "alice", false},
		{"reviewer sees all", &Identity{User: "carol", Checker: reviewer}, "alice", true},
		{"no roles loaded", &Identity{User: "bob"}, "alice", false},
		{"no user", &Identity{Checker: reviewer}, "", false},
		{"nil identity", nil, "alice", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.id.CanViewRecording(tc.owner))
		})
	}
}
