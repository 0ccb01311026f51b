package proxyapi

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseAccessRequestOp: known ops and fields only, one object, a
// bounded size; each refusal says what was wrong.
func TestParseAccessRequestOp(t *testing.T) {
	op, err := ParseAccessRequestOp(`{"op":"create","roles":["dba"],"reason":"r","ttl":"1h"}`)
	require.NoError(t, err)
	require.Equal(t, AccessRequestOp{Op: AccessRequestOpCreate, Roles: []string{"dba"}, Reason: "r", TTL: "1h"}, op)
	for in, want := range map[string]string{
		`{"op":"steal"}`:           `unknown access request operation "steal"`,
		`{"op":"ls","user":"bob"}`: `unknown field "user"`,
		`{"op":"ls"} {"op":"ls"}`:  "trailing data",
		`[]`:                       "invalid access request operation",
		`{"op":"ls","x":"` + strings.Repeat("a", 9000) + `"}`: "longer than",
	} {
		_, err := ParseAccessRequestOp(in)
		require.ErrorContains(t, err, want, in)
	}
}

// FuzzParseAccessRequestOp: whatever a client sends in the subsystem
// name, the parser answers an op it knows or an error, never a panic.
func FuzzParseAccessRequestOp(f *testing.F) {
	f.Add(`{"op":"ls"}`)
	f.Add(`{"op":"cert","id":"3f2a6c1e-0000-4000-8000-000000000000","public_key":"c3NoLWVkMjU1MTk="}`)
	f.Fuzz(func(t *testing.T, in string) {
		op, err := ParseAccessRequestOp(in)
		if err == nil {
			switch op.Op {
			case AccessRequestOpCreate, AccessRequestOpList, AccessRequestOpShow, AccessRequestOpReview, AccessRequestOpCert:
			default:
				t.Fatalf("accepted unknown op %q", op.Op)
			}
		}
	})
}
