package service

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/uuid"
	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/utils"
)

// ensureDataDir creates the data dir (0700: it holds private keys and the
// backend) and proves it is writable before anything else starts, so that a
// bad --data-dir is one clear line instead of a failure deep in the backend.
//
// A data dir that other users can enter is tightened to 0700 with a
// warning rather than refused: it holds the admin identity pctl uses, so
// leaving it open would hand cluster admin to every local user, silently.
// Refusing (sshd's StrictModes) would also be safe, but would stop every
// existing install whose directory was made by hand or by a package with
// the usual 0755; the warning tells the operator that the keys in it may
// have been read and should be considered exposed.
func ensureDataDir(dir string, log logrus.FieldLogger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return trace.BadParameter("data dir %s: %v", dir, unwrapPathError(err))
	}
	st, err := os.Stat(dir)
	if err != nil {
		return trace.BadParameter("data dir %s: %v", dir, unwrapPathError(err))
	}
	if mode := st.Mode().Perm(); mode&0o077 != 0 {
		if err := os.Chmod(dir, mode&0o700); err != nil {
			return trace.BadParameter("data dir %s is accessible to other users (mode %04o) and cannot be restricted: %v; run chmod 700 %s", dir, mode, unwrapPathError(err), dir)
		}
		log.WithFields(logrus.Fields{"data_dir": dir, "old_mode": fmt.Sprintf("%04o", mode), "new_mode": fmt.Sprintf("%04o", mode&0o700)}).
			Warn("The data dir was accessible to other users; restricted it to its owner. Keys in it (the admin identity included) may have been read: consider them exposed.")
	}
	probe, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return trace.BadParameter("data dir %s is not writable: %v", dir, unwrapPathError(err))
	}
	name := probe.Name()
	probe.Close()
	os.Remove(name)
	return nil
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// readOrCreateUUID returns the auth host's UUID, generating it on first
// start. The UUID is the node's identity in the inventory: keeping it
// across restarts is what makes a restarted node the same node rather than
// a duplicate that makes its hostname ambiguous.
func readOrCreateUUID(path string) (string, error) {
	id, err := readUUID(path)
	if err != nil || id != "" {
		return id, trace.Wrap(err)
	}
	id = uuid.NewString()
	return id, trace.Wrap(writeUUID(path, id))
}

// readUUID returns the UUID kept in the data dir, or "" when there is none
// yet (a host that has not joined).
func readUUID(path string) (string, error) {
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", nil
	case err != nil:
		return "", trace.ConvertSystemError(err)
	}
	id := strings.TrimSpace(string(data))
	if _, perr := uuid.Parse(id); perr != nil {
		return "", trace.BadParameter("%s: not a UUID (%q); remove the file to generate a new identity", path, id)
	}
	return id, nil
}

// writeUUID keeps the host's UUID in the data dir (atomically: a crash
// leaves the old file or the new one, never half of one).
func writeUUID(path, id string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return trace.ConvertSystemError(err)
	}
	return trace.Wrap(utils.WriteFileAtomic(path, []byte(id+"\n"), 0o600))
}
