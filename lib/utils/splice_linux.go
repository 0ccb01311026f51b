package utils

import (
	"io"
	"syscall"

	"golang.org/x/sys/unix"
)

// readWaiter returns a function that parks the goroutine in the runtime's
// poller until src (a socket) has data, an EOF or an error to report,
// without holding a read buffer, so that an idle direction of a splice
// costs no buffer at all; nil when src is not a socket (the caller then
// blocks in Read with a buffer).
//
// The check is a zero-timeout poll(2) of the socket: data already in it (a
// previous Read took only part of it, so no new readiness edge will come),
// an EOF, a reset or an error are seen at once; only a socket with nothing
// to report waits for the poller's next edge. poll, unlike a MSG_PEEK
// recv, leaves a pending error (a reset) in place for the real Read to
// return.
func readWaiter(src io.Reader) func() {
	sc, ok := src.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return func() {
		_ = raw.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
			n, err := unix.Poll(fds, 0)
			// Wait only on "nothing yet"; on an error of poll itself
			// (EINTR) the real Read decides.
			return n != 0 || err != nil
		})
	}
}
