//go:build unix

package recording

import (
	"os"
	"syscall"

	"github.com/gravitational/trace"
)

// tryLock takes an exclusive flock on f without waiting and reports
// whether it got it. The kernel drops the lock when its holder dies, even
// by SIGKILL, which is what tells the uploader that a spooled session's
// writer is gone.
func tryLock(f *os.File) (bool, error) {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == syscall.EWOULDBLOCK {
		return false, nil
	}
	return err == nil, trace.ConvertSystemError(err)
}
