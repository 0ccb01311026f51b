package web

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSessionGrants: a per-session token opens one terminal, to the node
// and login it was issued for, within its minute; it is spent by any
// attempt, so a token seen once (a log, a replayed first message) is
// worth nothing.
func TestSessionGrants(t *testing.T) {
	now := time.Now()
	var g sessionGrants
	add := func() string {
		tok, err := g.add(&sessionGrant{node: "n1", login: "root", expires: now.Add(time.Minute)}, now)
		require.NoError(t, err)
		return tok
	}
	tok := add()
	require.Nil(t, g.take(tok, "n2", "root", now), "another node")
	require.Nil(t, g.take(tok, "n1", "root", now), "spent by the failed attempt")
	tok = add()
	require.Nil(t, g.take(tok, "n1", "admin", now), "another login")
	tok = add()
	require.Nil(t, g.take(tok, "n1", "root", now.Add(time.Minute)), "expired")
	tok = add()
	require.Nil(t, g.take("forged", "n1", "root", now))
	require.Nil(t, g.take("", "n1", "root", now))
	require.NotNil(t, g.take(tok, "n1", "root", now))
	require.Nil(t, g.take(tok, "n1", "root", now), "single use")
}
