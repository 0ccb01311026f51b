//go:build !linux

package service

import "github.com/sirupsen/logrus"

// raiseFileLimit is Linux-only (rlimit_linux.go); elsewhere the limit the
// process was started with applies.
func raiseFileLimit(logrus.FieldLogger) {}
