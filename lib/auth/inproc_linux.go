//go:build linux

package auth

import (
	"net"
	"os"
	"syscall"

	"github.com/gravitational/trace"
)

// streamPair is two connected ends of a kernel socket pair.
func streamPair() (net.Conn, net.Conn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, trace.ConvertSystemError(err)
	}
	a, err := fileConn(fds[0], "auth-inproc-client")
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, trace.Wrap(err)
	}
	b, err := fileConn(fds[1], "auth-inproc-server")
	if err != nil {
		a.Close()
		return nil, nil, trace.Wrap(err)
	}
	return a, b, nil
}

// fileConn turns fd into a net.Conn; the fd is closed either way (the
// Conn holds its own duplicate).
func fileConn(fd int, name string) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	c, err := net.FileConn(f)
	return c, trace.ConvertSystemError(err)
}
