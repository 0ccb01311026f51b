package utils

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// quickAck sets TCP_QUICKACK (tcp(7)); an error (the socket closed) is of
// no consequence: the next read reports it.
func quickAck(raw syscall.RawConn) {
	_ = raw.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK, 1)
	})
}
