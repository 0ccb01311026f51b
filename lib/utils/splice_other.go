//go:build !linux

package utils

import "io"

// readWaiter: elsewhere an idle direction blocks in Read with its small
// buffer.
func readWaiter(io.Reader) func() { return nil }

// parkerFor: no poller outside Linux; the direction keeps its goroutine.
func parkerFor(io.Reader) func(h *half) bool { return nil }

// parkedRead is Linux's (splice_linux.go).
type parkedRead struct{}

func (*parkedRead) fire() {}

// ParkedSplices: nothing parks outside Linux.
func ParkedSplices() int { return 0 }
