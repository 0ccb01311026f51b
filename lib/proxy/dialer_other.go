//go:build !linux

package proxy

import (
	"syscall"
	"time"
)

// userTimeoutControl: TCP_USER_TIMEOUT is Linux's; elsewhere only the
// keep-alives apply.
func userTimeoutControl(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
