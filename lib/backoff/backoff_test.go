package backoff

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoff(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	var got []time.Duration
	for range 6 {
		got = append(got, b.Next())
	}
	require.Equal(t, []time.Duration{100e6, 200e6, 400e6, 800e6, 1e9, 1e9}, got)
	b.Reset()
	require.Equal(t, 100*time.Millisecond, b.Next())

	j := Backoff{Min: 100 * time.Millisecond, Max: time.Second, Jitter: true}
	for i := range 50 {
		want := min(100*time.Millisecond<<i, time.Second)
		if i > 10 {
			want = time.Second
		}
		d := j.Next()
		require.GreaterOrEqual(t, d, want/2)
		require.LessOrEqual(t, d, want)
	}
}
