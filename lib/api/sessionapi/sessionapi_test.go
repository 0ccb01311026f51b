package sessionapi

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseSessionID(t *testing.T) {
	id, err := ParseSessionID("0B9E4F1C-3A5D-4E2B-9C1F-2D3E4F5A6B7C")
	require.NoError(t, err)
	require.Equal(t, "0b9e4f1c-3a5d-4e2b-9c1f-2d3e4f5a6b7c", id)
	for _, bad := range []string{"", "x", "../../etc/passwd", "{0b9e4f1c-3a5d-4e2b-9c1f-2d3e4f5a6b7c}", "urn:uuid:0b9e4f1c-3a5d-4e2b-9c1f-2d3e4f5a6b", "0b9e4f1c3a5d4e2b9c1f2d3e4f5a6b7c"} {
		_, err := ParseSessionID(bad)
		require.ErrorContains(t, err, "malformed session id", bad)
	}
	_, err = ParseMode("admin")
	require.ErrorContains(t, err, `unknown session join mode "admin"`)
}

// FuzzParseSessionID: whatever a client sends as a session id is either
// refused or a canonical UUID that parses to itself.
func FuzzParseSessionID(f *testing.F) {
	f.Add("0b9e4f1c-3a5d-4e2b-9c1f-2d3e4f5a6b7c")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseSessionID(s)
		if err != nil {
			return
		}
		again, err := ParseSessionID(id)
		if err != nil || again != id || len(id) != 36 {
			t.Fatalf("%q -> %q -> %q, %v", s, id, again, err)
		}
	})
}

func TestParseJoinRequest(t *testing.T) {
	const id = "0b9e4f1c-3a5d-4e2b-9c1f-2d3e4f5a6b7c"
	got, mode, err := ParseJoinRequest("join@" + id)
	require.NoError(t, err)
	require.Equal(t, id, got)
	require.Equal(t, Observer, mode)
	got, mode, err = ParseJoinRequest(JoinSubsystem(id, Moderator))
	require.NoError(t, err)
	require.Equal(t, id, got)
	require.Equal(t, Moderator, mode)
	for name, want := range map[string]string{
		"sftp":                          "not a join request",
		"join@" + id + "/root":          `unknown session join mode "root"`,
		"join@" + id + "/peer/x":        `unknown session join mode "peer/x"`,
		"join@../" + id:                 "malformed session id",
		"join@" + id[:35] + "/observer": "malformed session id",
	} {
		_, _, err := ParseJoinRequest(name)
		require.ErrorContains(t, err, want, name)
	}
}

// FuzzParseJoinRequest: a join request from a client either is refused
// or names a canonical session id and a known mode, and says so again.
func FuzzParseJoinRequest(f *testing.F) {
	f.Add("join@0b9e4f1c-3a5d-4e2b-9c1f-2d3e4f5a6b7c/peer")
	f.Add("join@")
	f.Fuzz(func(t *testing.T, name string) {
		id, mode, err := ParseJoinRequest(name)
		if err != nil {
			return
		}
		id2, mode2, err := ParseJoinRequest(JoinSubsystem(id, mode))
		if err != nil || id2 != id || mode2 != mode {
			t.Fatalf("%q -> %q %q -> %q %q %v", name, id, mode, id2, mode2, err)
		}
	})
}
