package backup

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks for leaks, except embedded etcd's own idle peer
// connections (lib/backend/etcdbk's TestMain says more).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("github.com/soheilhy/cmux.(*MuxConn).Read"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
	)
}
