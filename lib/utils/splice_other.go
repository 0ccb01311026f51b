//go:build !linux

package utils

import (
	"context"
	"io"
	"syscall"
)

// readWaiter: elsewhere an idle direction blocks in Read with its small
// buffer.
func readWaiter(io.Reader) func() { return nil }

// parkerFor: no poller outside Linux; the direction keeps its goroutine.
func parkerFor(io.Reader) func(h *half) bool { return nil }

// parkedRead is Linux's (splice_linux.go).
type parkedRead struct{}

func (*parkedRead) fire() {}

// WaitParkedSplices: nothing parks outside Linux, so there is nothing to
// wait for.
func WaitParkedSplices(context.Context, int) error { return nil }

// endParked: without the poller a quiet direction blocks in Read, which
// Close wakes by itself.
func endParked(syscall.RawConn) {}
