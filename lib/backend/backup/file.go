package backup

import (
	"io"
	"os"
	"path/filepath"

	"github.com/gravitational/trace"
)

// WriteFile writes a backup to path atomically: fill writes it into a
// temporary file next to path (mode 0600 from the first byte: a backup
// holds the CAs' private keys), which is synced, read back with Verify and
// only then renamed into place. On any error the temporary file is removed
// and path is untouched: there is never a half backup under its name.
func WriteFile(path string, fill func(w io.Writer) error) (Header, int, error) {
	dir := filepath.Dir(path)
	// os.CreateTemp opens with O_EXCL and mode 0600: nothing planted at a
	// predictable name can be written through.
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return Header{}, 0, trace.ConvertSystemError(trace.Wrap(err, "creating a backup in %s", dir))
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return Header{}, 0, trace.ConvertSystemError(err)
	}
	if err := fill(f); err != nil {
		return Header{}, 0, trace.Wrap(err)
	}
	if err := f.Sync(); err != nil {
		return Header{}, 0, trace.ConvertSystemError(trace.Wrap(err, "writing %s", tmp))
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Header{}, 0, trace.ConvertSystemError(err)
	}
	h, n, err := Verify(f)
	if err != nil {
		return Header{}, 0, trace.Wrap(err, "the backup read back from %s is not complete", tmp)
	}
	if err := f.Close(); err != nil {
		return Header{}, 0, trace.ConvertSystemError(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return Header{}, 0, trace.ConvertSystemError(trace.Wrap(err, "writing %s", path))
	}
	done = true
	// The rename is durable once the directory is synced.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return h, n, nil
}
