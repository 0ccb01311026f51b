package freeport

import (
	"net"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPortsAreFreeDistinctAndBelowTheEphemeralRange: every port handed
// out can be bound, none twice, and all sit below the ephemeral range
// that port-0 listeners and outgoing connections draw from.
func TestPortsAreFreeDistinctAndBelowTheEphemeralRange(t *testing.T) {
	lo, hi := pickRange()
	seen := map[int]bool{}
	for i := 0; i < 50; i++ {
		p := Port(t)
		require.False(t, seen[p], "port %d handed out twice", p)
		seen[p] = true
		if hi > lo {
			require.True(t, p >= lo && p < hi, "port %d outside [%d, %d)", p, lo, hi)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		require.NoError(t, err)
		ln.Close()
	}
}

// TestBoundPortIsNotFree: the check behind each pick sees a port in use.
func TestBoundPortIsNotFree(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	require.False(t, free(ln.Addr().(*net.TCPAddr).Port))
}

func TestRangeBelow(t *testing.T) {
	lo, hi := rangeBelow(32768)
	require.Equal(t, []int{10000, 32768}, []int{lo, hi})
	lo, hi = rangeBelow(10000)
	require.Equal(t, lo, hi, "no room below an ephemeral range starting at 10000")
	lo, hi = rangeBelow(1024)
	require.Equal(t, lo, hi)
}

// TestRefusedAddrRefuses: a dial to it is refused, and nobody can listen
// on it while the test runs.
func TestRefusedAddrRefuses(t *testing.T) {
	addr := RefusedAddr(t)
	_, err := net.Dial("tcp", addr)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	_, err = net.Listen("tcp", addr)
	require.Error(t, err, "the port stays taken")
}
