package service

import (
	"context"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/web"
)

// startRecordingUploads starts the uploader of the node's recording spool
// (which first ships whatever an earlier run left there) and returns the
// session recorder. Uploads go through clt, the node identity's client:
// auth accepts a session's chunks only from the node that ran it.
func (p *Process) startRecordingUploads(clt *auth.Client) (*srv.Recorder, error) {
	spool := recording.DirStorage{Dir: p.cfg.RecordingSpoolDir()}
	u, err := p.startUploader(spool, clt, "node")
	if err != nil {
		return nil, trace.Wrap(err)
	}
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

// startUploader ships spool's recordings to auth through clt (which first
// ships whatever an earlier run left there), and flushes it at shutdown.
// role (node or proxy) tells the two spools' logs apart.
func (p *Process) startUploader(spool recording.DirStorage, clt *auth.Client, role string) (*recording.Uploader, error) {
	u, err := recording.NewUploader(recording.UploaderConfig{
		Spool:  spool,
		Upload: clt,
		Deps:   p.depsWith(observe.ComponentUploader, nil, logrus.Fields{"role": role}),
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
	return u, nil
}

// startProxyRecorder starts the uploader of the proxy's spool (its web
// terminals to OpenSSH nodes, which no node records) and returns their
// recorder. Uploads go through clt, the proxy identity's client: auth
// accepts a proxy's chunks only for sessions on OpenSSH nodes.
func (p *Process) startProxyRecorder(clt *auth.Client, networking *services.NetworkingWatcher) (*web.TerminalRecorder, error) {
	spool := recording.DirStorage{Dir: p.cfg.ProxyRecordingSpoolDir()}
	u, err := p.startUploader(spool, clt, "proxy")
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &web.TerminalRecorder{
		Spool: spool,
		// The proxy's watcher, or auth until it has synced.
		Settings: func(ctx context.Context) (*services.ClusterNetworkingConfig, error) {
			select {
			case <-networking.Synced():
				return networking.GetClusterNetworkingConfig(ctx)
			default:
				return clt.GetClusterNetworkingConfig(ctx)
			}
		},
		Notify: u.Notify,
	}, nil
}
