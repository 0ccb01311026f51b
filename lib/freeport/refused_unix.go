//go:build unix

package freeport

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// RefusedAddr returns a loopback address where every connection is
// refused, for as long as the test runs: a TCP socket bound there but not
// listening answers a SYN with a reset, and holding the bind keeps anyone
// else from listening on the port. Listening and closing instead leaves a
// port the next test may take, and then the "dead" node answers.
func RefusedAddr(tb testing.TB) string {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatalf("freeport: socket: %v", err)
	}
	syscall.CloseOnExec(fd) // not into the ssh and sshd processes tests start
	tb.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatalf("freeport: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatalf("freeport: getsockname: %v", err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}
