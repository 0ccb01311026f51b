package export

import (
	"testing"

	"go.uber.org/goleak"
)

// The exporters start goroutines; none may outlive Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// signal.Notify's dispatcher runs for the rest of the process.
		goleak.IgnoreTopFunction("os/signal.signal_recv"),
		goleak.IgnoreTopFunction("os/signal.loop"),
	)
}
