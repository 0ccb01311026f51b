package termscreen

import (
	"testing"

	"go.uber.org/goleak"
)

// The feeder and the emulator's reply drain are goroutines; Close must
// end both.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
