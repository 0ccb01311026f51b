package utils

import (
	"os"
	"path/filepath"

	"github.com/gravitational/trace"
)

// WriteFileAtomic writes data to path through a temporary file in the same
// directory, synced and then renamed over path. Keys, certificates and
// identity files are written this way so that a crash or a full disk never
// leaves a half-written file that a restart would trip over: a reader sees
// the old content or the new, nothing in between.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return trace.ConvertSystemError(err)
	}
	defer os.Remove(tmp.Name()) // a no-op after a successful rename
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return trace.ConvertSystemError(err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return trace.ConvertSystemError(err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return trace.ConvertSystemError(err)
	}
	if err := tmp.Close(); err != nil {
		return trace.ConvertSystemError(err)
	}
	return trace.ConvertSystemError(os.Rename(tmp.Name(), path))
}
