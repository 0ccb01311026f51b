package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/backend/backup"
	"github.com/postern-dev/postern/lib/backend/etcdbk"
	"github.com/postern-dev/postern/lib/backend/sqlite"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/utils"
)

// restoreFlags are the flags of `postern restore`.
type restoreFlags struct {
	configFile, dataDir, file string
}

func (r *restoreFlags) register(app *kingpin.Application) *kingpin.CmdClause {
	cmd := app.Command("restore", "Create a data dir (or fill an empty etcd prefix) from a backup written by pctl backup.")
	cmd.Flag("data-dir", "Data directory to create; it must not exist or be empty (default: the config's data_dir, else "+config.DefaultDataDir+").").StringVar(&r.dataDir)
	cmd.Flag("config", "YAML config file (postern.yaml): with backend type etcd, the backup is restored into its etcd prefix, which must be empty.").Short('c').StringVar(&r.configFile)
	cmd.Arg("file", "Backup file.").Required().StringVar(&r.file)
	return cmd
}

// clusterNameFile is where an auth server's data dir pins its cluster
// (lib/service reads it at start): a restored data dir is pinned to the
// backup's cluster, whose name is in every CA.
const clusterNameFile = "cluster_name"

func (r *restoreFlags) run(ctx context.Context, out io.Writer) error {
	fc := &config.FileConfig{}
	if r.configFile != "" {
		var err error
		if fc, err = config.ReadFile(r.configFile); err != nil {
			return trace.Wrap(err)
		}
	}
	if r.dataDir != "" {
		fc.DataDir = r.dataDir
	}
	if fc.DataDir == "" {
		fc.DataDir = config.DefaultDataDir
	}
	f, err := os.Open(r.file)
	if err != nil {
		return trace.ConvertSystemError(trace.Wrap(err, "backup %s", r.file))
	}
	defer f.Close()
	rd, err := backup.NewReader(f)
	if err != nil {
		return trace.BadParameter("%s: %v", r.file, err)
	}
	h := rd.Header
	if fc.ClusterName != "" && fc.ClusterName != h.ClusterName {
		return trace.BadParameter("the backup is of cluster %q, but %s names cluster %q", h.ClusterName, r.configFile, fc.ClusterName)
	}
	var n int
	var where string
	if fc.Backend.Type == config.BackendEtcd {
		n, where, err = restoreEtcd(ctx, fc, rd)
	} else {
		n, where, err = restoreDataDir(ctx, fc.DataDir, rd)
	}
	if err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(out, "Restored %d items of cluster %q (backup taken %s by Postern %s, schema version %d) into %s.\n",
		n, h.ClusterName, h.Created.Format(time.RFC3339), h.Postern, h.SchemaVersion, where)
	fmt.Fprintf(out, "Start it with --cluster-name %s. Recordings are not in backups: copy the recordings directory from the file backup of the old data dir.\n", h.ClusterName)
	return nil
}

// restoreDataDir creates dir with a SQLite backend holding the backup.
// dir must not exist or be empty: a restore never merges into a data dir
// (its CAs and identities would disagree with the backup's). On error what
// was created is removed again.
func restoreDataDir(ctx context.Context, dir string, rd *backup.Reader) (n int, where string, err error) {
	dir, err = filepath.Abs(dir)
	if err != nil {
		return 0, "", trace.Wrap(err)
	}
	created, err := emptyDir(dir)
	if err != nil {
		return 0, "", trace.Wrap(err)
	}
	defer func() {
		if err == nil {
			return
		}
		if created {
			os.RemoveAll(dir)
			return
		}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}()
	cfg := config.Config{FileConfig: config.FileConfig{DataDir: dir}}
	b, err := sqlite.New(ctx, sqlite.Config{Path: cfg.BackendPath(), Logger: logrus.WithField("component", "restore")})
	if err != nil {
		return 0, "", trace.Wrap(err)
	}
	n, err = backup.Restore(ctx, rd, b)
	if cerr := b.Close(); err == nil && cerr != nil {
		err = trace.Wrap(cerr)
	}
	if err != nil {
		return 0, "", trace.Wrap(err, "restoring into %s", dir)
	}
	if err := utils.WriteFileAtomic(filepath.Join(dir, clusterNameFile), []byte(rd.Header.ClusterName+"\n"), 0o600); err != nil {
		return 0, "", trace.Wrap(err)
	}
	return n, "data dir " + dir, nil
}

// emptyDir makes sure dir is an empty directory, creating it (0700: it
// will hold the CAs' keys) when missing; created says whether it did.
func emptyDir(dir string) (created bool, err error) {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return false, trace.ConvertSystemError(trace.Wrap(err, "creating data dir %s", dir))
		}
		return true, nil
	case err != nil:
		return false, trace.BadParameter("data dir %s: %v", dir, err)
	case len(entries) > 0:
		names := make([]string, 0, 3)
		for _, e := range entries[:min(3, len(entries))] {
			names = append(names, e.Name())
		}
		return false, trace.AlreadyExists("data dir %s is not empty (it holds %s): restore into a new or empty directory", dir, strings.Join(names, ", "))
	}
	return false, nil
}

// restoreEtcd writes the backup under the etcd prefix of fc, which must
// hold nothing yet (backup.Restore checks, and empties it again on error).
func restoreEtcd(ctx context.Context, fc *config.FileConfig, rd *backup.Reader) (int, string, error) {
	cfg := etcdbk.Config{
		Endpoints: fc.Backend.EtcdEndpoints,
		Prefix:    fc.Backend.EtcdPrefix,
		Logger:    logrus.WithField("component", "restore"),
	}
	if t := fc.Backend.EtcdTLS; t != nil {
		tlsCfg, err := etcdbk.LoadTLS(t.CAFile, t.CertFile, t.KeyFile)
		if err != nil {
			return 0, "", trace.Wrap(err)
		}
		cfg.TLS = tlsCfg
	}
	b, err := etcdbk.New(ctx, cfg)
	if err != nil {
		return 0, "", trace.Wrap(err)
	}
	defer b.Close()
	prefix := fc.Backend.EtcdPrefix
	if prefix == "" {
		prefix = etcdbk.DefaultPrefix
	}
	where := fmt.Sprintf("etcd prefix %s at %s", prefix, strings.Join(fc.Backend.EtcdEndpoints, ","))
	n, err := backup.Restore(ctx, rd, b)
	if err != nil {
		return 0, "", trace.Wrap(err, "restoring into %s", where)
	}
	return n, where, nil
}
