package auth

import (
	"context"
	"io"
	"net/http"
	"net/url"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend/backup"
	"github.com/postern-dev/postern/lib/events"
)

// backupPath streams a backup of the whole backend (admin only).
const backupPath = "/v1/backup"

// streamBackup answers GET /v1/backup: a backup (lib/backend/backup) of
// the backend as of one moment, read while the cluster goes on serving
// and written out as it is read. A failure after the first byte cannot
// change the status any more: the connection is aborted instead, and the
// stream lacks the backup's trailer, which every reader checks for. Every
// backup is audited (backup.create): it carries the CAs' private keys.
func (a *APIServer) streamBackup(w http.ResponseWriter, r *http.Request, p *peer) {
	ctx := r.Context()
	w.Header().Set("Content-Type", "application/gzip")
	w.WriteHeader(http.StatusOK)
	n, err := backup.Write(ctx, w, a.auth.store.Backend(), backup.Header{ClusterName: a.auth.cfg.ClusterName})
	fields := events.Fields{events.FieldRole: p.Role, events.FieldRemoteAddr: r.RemoteAddr, events.FieldCount: n}
	if err != nil {
		fields[events.FieldReason] = err.Error()
	}
	a.auth.cfg.Audit.Emit(context.WithoutCancel(ctx), events.Event{Type: events.BackupCreate, User: p.ID, Fields: fields})
	if err != nil {
		a.log.WithError(err).Warn("Backup failed midway; aborting the stream.")
		panic(http.ErrAbortHandler)
	}
	a.log.WithField("items", n).Info("Sent a backup.")
}

// Backup streams a backup of the auth server's backend into w (pctl
// backup); it does not check it: the caller verifies what it wrote before
// keeping it (backup.WriteFile).
func (c *Client) Backup(ctx context.Context, w io.Writer) error {
	newReq := func(ctx context.Context, base string) (*http.Request, error) {
		u, err := url.JoinPath(base, backupPath)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		return req, trace.Wrap(err)
	}
	var resp *http.Response
	handle := func(r *http.Response) (bool, error) {
		if r.StatusCode != http.StatusOK {
			return false, authapi.ReadErrorResponse(r)
		}
		resp = r
		return true, nil
	}
	if err := c.send(ctx, http.MethodGet, backupPath, 0, newReq, handle); err != nil {
		return trace.Wrap(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return trace.ConnectionProblem(err, "reading the backup from the auth server: %v", err)
	}
	return nil
}
