//go:build unix

package events

import (
	"os"
	"syscall"
)

// fileID identifies the file behind fi (its inode), so that a cursor
// saved for one events.log is not applied to another that replaced it.
// Zero when unknown.
func fileID(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino)
	}
	return 0
}
