package service

import (
	"context"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// nodeNetworking returns what the node's session recorder reads the
// cluster's recording settings with (session_recording, the recording
// cap): a NetworkingWatcher, so that a session costs an atomic load rather
// than a round trip to the auth API, which the auth server then answered
// from its backend (measured: a sixth of the auth process's CPU per `ssh
// -J` setup). A `pctl set networking` still reaches the next session as
// soon as its watch event lands. Until the watcher has synced (auth not
// answering yet, or an older auth server that does not let nodes watch
// networking) each session reads through clt as before, so a session
// never waits on the watch.
func (p *Process) nodeNetworking(clt *auth.Client) (func(context.Context) (*services.ClusterNetworkingConfig, error), error) {
	w, err := services.NewNetworkingWatcher(services.NetworkingWatcherConfig{
		Events: clt.NetworkingEvents(),
		Clock:  p.clock,
		Logger: p.log.WithFields(logrus.Fields{"component": observe.ComponentNetWatcher, "role": "node"}),
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	p.onShutdown(func(context.Context) error { return w.Close() })
	return func(ctx context.Context) (*services.ClusterNetworkingConfig, error) {
		select {
		case <-w.Synced():
			return w.GetClusterNetworkingConfig(ctx)
		default:
			return clt.GetClusterNetworkingConfig(ctx)
		}
	}, nil
}
