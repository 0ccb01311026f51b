//go:build !linux

package service

import "github.com/sirupsen/logrus"

// raiseFileLimit is Linux-only (rlimit_linux.go); elsewhere the limit the
// process was started with applies.
func raiseFileLimit(logrus.FieldLogger) {}

// fileLimit is not read outside Linux: no descriptor cap is derived.
func fileLimit() (soft, hard uint64, ok bool) { return 0, 0, false }
