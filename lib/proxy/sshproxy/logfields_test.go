package sshproxy

import (
	"context"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
)

// TestRoutingLogCarriesIDs: the proxy's routing log lines carry the
// connection's conn_id and, when it is traced, its trace_id, so that a
// refusal in the log leads to its trace.
func TestRoutingLogCarriesIDs(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { require.NoError(t, tp.Shutdown(context.Background())) }()
	bk, err := memory.New(memory.Config{})
	require.NoError(t, err)
	defer bk.Close()
	store := services.NewStore(bk)
	ctx := context.Background()
	require.NoError(t, store.SetClusterNetworkingConfig(ctx, services.DefaultClusterNetworkingConfig()))
	nw, err := services.NewNodeWatcher(services.NodeWatcherConfig{Events: store.NodeEvents()})
	require.NoError(t, err)
	defer nw.Close()
	require.NoError(t, nw.WaitSynced(ctx))
	router, err := proxy.NewRouter(proxy.RouterConfig{ClusterName: benchCluster, NodeWatcher: nw, Networking: store})
	require.NoError(t, err)
	logger, hook := test.NewNullLogger()
	h, err := New(Config{Router: router, Deps: observe.Deps{Logger: logger}})
	require.NoError(t, err)

	cctx, span := tp.Tracer("proxy").Start(observe.WithConnID(ctx, "conn-42"), "ssh.channel")
	defer span.End()
	_, err = h.DialDirectTCPIP(cctx, &authz.Identity{User: "alice"}, srv.DirectTCPIPRequest{Host: "nosuch", Port: 22})
	require.Error(t, err)
	var found *logrus.Entry
	for _, e := range hook.AllEntries() {
		if e.Message == "Routing failed." {
			found = e
		}
	}
	require.NotNil(t, found)
	require.Equal(t, "conn-42", found.Data["conn_id"])
	require.Equal(t, span.SpanContext().TraceID().String(), found.Data["trace_id"])
}
