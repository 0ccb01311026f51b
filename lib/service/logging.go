package service

import (
	"io"

	"github.com/sirupsen/logrus"
)

// newLogger builds the process logger: text to stderr by default, JSON for
// log shippers, debug level with --debug.
func newLogger(out io.Writer, format string, debug bool) *logrus.Logger {
	l := logrus.New()
	l.SetOutput(out)
	if format == "json" {
		l.SetFormatter(&logrus.JSONFormatter{})
	} else {
		l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	}
	l.SetLevel(logrus.InfoLevel)
	if debug {
		l.SetLevel(logrus.DebugLevel)
	}
	return l
}
