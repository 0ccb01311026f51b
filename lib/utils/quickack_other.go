//go:build !linux

package utils

import "syscall"

// quickAck is Linux only (TCP_QUICKACK); elsewhere it does nothing.
func quickAck(syscall.RawConn) {}
