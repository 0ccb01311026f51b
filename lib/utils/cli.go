package utils

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gravitational/trace"
)

// FatalError prints err as one readable line (the
// full trace report only with debug) and exits with status 1. It is the
// single exit path of every postern, psh and pctl command, so that users
// never see a stack trace they did not ask for.
func FatalError(err error, debug bool) {
	PrintError(os.Stderr, err, debug)
	os.Exit(1)
}

// PrintError writes err the way FatalError does, without exiting.
func PrintError(w io.Writer, err error, debug bool) {
	if debug {
		fmt.Fprintln(w, trace.DebugReport(err))
		return
	}
	fmt.Fprintln(w, "ERROR: "+UserMessage(err))
}

// UserMessage is the message a user sees for err, without trace's debug
// details. Messages that are lists by design (the ambiguous-host candidate
// list) keep their lines.
func UserMessage(err error) string {
	msg := trace.UserMessage(err)
	return strings.TrimSpace(msg)
}

// DebugRequested reports whether --debug is among args, up to a "--"
// (after which words belong to a remote command). Commands check it before
// parsing, so that even a parse error is reported in full when the user
// asked for it.
func DebugRequested(args []string) bool {
	for _, a := range args {
		switch a {
		case "--debug":
			return true
		case "--":
			return false
		}
	}
	return false
}
