package main

import (
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/services"
)

// TestResolveToken: `pctl tokens rm` takes the whole token or a prefix of
// at least the length ls shows that names one token; an ambiguous prefix
// is refused without printing any token whole.
func TestResolveToken(t *testing.T) {
	a := "0123456789abcdef0123456789abcdef"
	b := "0123456799999999aaaaaaaaaaaaaaaa"
	c := "fedcba9876543210fedcba9876543210"
	tokens := []services.Token{{Name: a}, {Name: b}, {Name: c}}

	got, err := resolveToken(tokens, c[:8])
	require.NoError(t, err)
	require.Equal(t, c, got)
	got, err = resolveToken(tokens, a)
	require.NoError(t, err)
	require.Equal(t, a, got)
	got, err = resolveToken(tokens, a[:9])
	require.NoError(t, err)
	require.Equal(t, a, got, "one more character than ls shows tells a from b")

	_, err = resolveToken(tokens, a[:8])
	require.True(t, trace.IsBadParameter(err), "%v", err)
	require.Contains(t, err.Error(), "ambiguous: 2 tokens")
	require.NotContains(t, err.Error(), a)
	require.NotContains(t, err.Error(), b)

	_, err = resolveToken(tokens, "fedc")
	require.True(t, trace.IsBadParameter(err), "%v", err)
	require.Contains(t, err.Error(), "too short")
	_, err = resolveToken(tokens, "99999999")
	require.True(t, trace.IsNotFound(err), "%v", err)
}
