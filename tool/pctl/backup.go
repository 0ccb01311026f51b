package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend/backup"
)

// defaultBackupTimeout bounds pctl backup: a backend of a few hundred
// thousand items (mostly audit events) streams in well under a minute on
// loopback; ten leaves room for a slow link to a remote auth server.
const defaultBackupTimeout = 10 * time.Minute

func (c *cli) registerBackup(app *kingpin.Application, add adder) {
	var out string
	bk := app.Command("backup", "Write a consistent backup of the cluster's backend (users, roles, CAs with their private keys, nodes, tokens, audit events) while it serves; restore it with postern restore.")
	bk.Flag("out", "File to write (mode 0600, replaced atomically; never left half written).").Required().StringVar(&out)
	bk.Flag("timeout", "Give up after this long (default "+defaultBackupTimeout.String()+").").DurationVar(&c.timeout)
	bk.Action(func(*kingpin.ParseContext) error {
		if c.timeout <= 0 {
			c.timeout = defaultBackupTimeout
		}
		return nil
	})
	add(bk, func(ctx context.Context) error { return c.backup(ctx, out) })
}

func (c *cli) backup(ctx context.Context, out string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	h, n, err := backup.WriteFile(out, func(w io.Writer) error {
		return trace.Wrap(clt.Backup(ctx, w))
	})
	if err != nil {
		return trace.Wrap(err, "backup not written")
	}
	fmt.Fprintf(c.stdout, "Backup of cluster %q written to %s: %d items, schema version %d, taken %s.\n",
		h.ClusterName, out, n, h.SchemaVersion, h.Created.Format(time.RFC3339))
	return nil
}
