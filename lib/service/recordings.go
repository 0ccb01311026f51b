package service

import (
	"context"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/srv"
)

// startRecordingUploads starts the uploader of the node's recording spool
// (which first ships whatever an earlier run left there) and returns the
// session recorder. Uploads go through clt, the node identity's client:
// auth accepts a session's chunks only from the node that ran it.
func (p *Process) startRecordingUploads(clt *auth.Client) (*srv.Recorder, error) {
	spool := recording.DirStorage{Dir: p.cfg.RecordingSpoolDir()}
	u, err := recording.NewUploader(recording.UploaderConfig{
		Spool:   spool,
		Upload:  clt,
		Clock:   p.clock,
		Logger:  p.log.WithField("component", "recording:upload"),
		Metrics: p.registry,
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	p.onShutdown(func(ctx context.Context) error {
		// One last pass so that a clean shutdown leaves nothing behind,
		// bounded by the shutdown's context.
		_ = u.Flush(ctx)
		return u.Close()
	})
	settings, err := p.nodeNetworking(clt)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	r, err := srv.NewRecorder(srv.RecorderConfig{
		Spool:    spool,
		Settings: settings,
		Notify:   u.Notify,
		Clock:    p.clock,
	})
	return r, trace.Wrap(err)
}
