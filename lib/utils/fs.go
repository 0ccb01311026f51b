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
	return WriteFilesAtomic([]File{{Path: path, Data: data, Mode: perm}})
}

// File is one file for WriteFilesAtomic.
type File struct {
	Path string
	Data []byte
	Mode os.FileMode
}

// WriteFilesAtomic writes every file to a temporary name in its target
// directory first and renames them into place only once all are written,
// so a failure never leaves a private key without its certificate.
//
// The temporaries come from os.CreateTemp: a random name opened with
// O_CREAT|O_EXCL and mode 0600. A fixed name such as PATH.tmp would let
// anyone who can write to the directory plant a symlink or a file of their
// own there beforehand and have a private key written through it (or into a
// file they can read); O_EXCL never follows or reuses what is already there.
// The final mode is set on the open descriptor before any byte is written.
func WriteFilesAtomic(files []File) error {
	tmps := make([]string, 0, len(files))
	defer func() {
		for _, t := range tmps {
			os.Remove(t) // a no-op after a successful rename
		}
	}()
	for _, f := range files {
		tmp, err := stage(f)
		if err != nil {
			return trace.Wrap(err)
		}
		tmps = append(tmps, tmp)
	}
	for i, f := range files {
		if err := os.Rename(tmps[i], f.Path); err != nil {
			return trace.ConvertSystemError(err)
		}
	}
	tmps = nil
	return nil
}

// stage writes f to a fresh temporary file beside f.Path and returns its name.
func stage(f File) (string, error) {
	tmp, err := os.CreateTemp(filepath.Dir(f.Path), "."+filepath.Base(f.Path)+".tmp-*")
	if err != nil {
		return "", trace.ConvertSystemError(err)
	}
	name := tmp.Name()
	fail := func(err error) (string, error) {
		tmp.Close()
		os.Remove(name)
		return "", trace.ConvertSystemError(err)
	}
	if err := tmp.Chmod(f.Mode); err != nil {
		return fail(err)
	}
	if _, err := tmp.Write(f.Data); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(name)
		return "", trace.ConvertSystemError(err)
	}
	return name, nil
}
