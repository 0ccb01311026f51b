package service

import (
	"context"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/proxy/sshproxy"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/srv"
)

// localChunkUploader hands chunks straight to the auth server of this
// process (all-in-one), as the node nodeID.
type localChunkUploader struct {
	auth   *auth.Server
	nodeID string
}

func (l localChunkUploader) PutRecordingChunk(ctx context.Context, session string, c recording.Chunk) error {
	return trace.Wrap(l.auth.PutRecordingChunk(ctx, l.nodeID, session, c))
}

func (l localChunkUploader) LastRecordingChunk(ctx context.Context, session string) (*recording.ChunkRef, error) {
	ref, err := l.auth.LastRecordingChunk(ctx, l.nodeID, session)
	return ref, trace.Wrap(err)
}

// startRecordingUploads starts the uploader of the node's recording spool
// (which first ships whatever an earlier run left there) and returns the
// session recorder. Uploads go as the node identity: auth accepts a
// session's chunks only from the node that ran it, so the proxy identity
// an all-in-one host otherwise talks with would not do.
func (p *Process) startRecordingUploads(nodeID *auth.Identity, ap accessPoint) (*srv.Recorder, error) {
	var up recording.ChunkUploader
	if p.authServer != nil {
		up = localChunkUploader{auth: p.authServer, nodeID: p.hostUUID}
	} else if p.authClient != nil {
		// The process's own auth client: the host's identity (node and
		// proxy roles of one host share its UUID), and for a node behind
		// NAT the one that dials auth through its tunnel.
		up = p.authClient
	} else {
		clt, err := auth.NewClient(auth.ClientConfig{Addr: p.cfg.AuthServer, Identity: nodeID, Clock: p.clock})
		if err != nil {
			return nil, trace.Wrap(err)
		}
		p.onShutdown(func(context.Context) error { return clt.Close() })
		up = clt
	}
	spool := recording.DirStorage{Dir: p.cfg.RecordingSpoolDir()}
	u, err := recording.NewUploader(recording.UploaderConfig{
		Spool:   spool,
		Upload:  up,
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
	settings, err := p.nodeNetworking(ap)
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

// recordingSource is where the proxy reads recordings for psh: the auth
// server itself in an all-in-one process, else the auth API as the proxy.
func (p *Process) recordingSource(ap accessPoint) sshproxy.RecordingSource {
	if p.authServer != nil {
		return p.authServer
	}
	if clt, ok := ap.(*auth.Client); ok {
		return clt
	}
	return nil
}
