package services

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

// TestNetworkingWatcher also shows the ResourceWatcher serving a second
// resource kind unchanged.
func TestNetworkingWatcher(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, clockwork.NewRealClock())
	w, err := NewNetworkingWatcher(NetworkingWatcherConfig{Events: s, Clock: clockwork.NewFakeClock()})
	require.NoError(t, err)
	defer w.Close()

	c, err := w.GetClusterNetworkingConfig(ctx)
	require.NoError(t, err)
	require.Equal(t, DefaultClusterNetworkingConfig(), c)
	require.NoError(t, w.Healthy())

	set := &ClusterNetworkingConfig{Spec: ClusterNetworkingConfigSpec{RoutingStrategy: RoutingMostRecent, SSHDialTimeout: Duration(time.Second)}}
	require.NoError(t, s.SetClusterNetworkingConfig(ctx, set))
	require.Eventually(t, func() bool {
		c, err := w.GetClusterNetworkingConfig(ctx)
		return err == nil && c.Spec.RoutingStrategy == RoutingMostRecent && c.Spec.SSHDialTimeout.Value() == time.Second
	}, 10*time.Second, time.Millisecond)

	// Callers get copies.
	c, err = w.GetClusterNetworkingConfig(ctx)
	require.NoError(t, err)
	c.Spec.RoutingStrategy = "changed"
	c, err = w.GetClusterNetworkingConfig(ctx)
	require.NoError(t, err)
	require.Equal(t, RoutingMostRecent, c.Spec.RoutingStrategy)

	require.NoError(t, s.Backend().Delete(ctx, networkingKey()))
	require.Eventually(t, func() bool {
		c, err := w.GetClusterNetworkingConfig(ctx)
		return err == nil && c.Spec.RoutingStrategy == RoutingUnambiguousMatch
	}, 10*time.Second, time.Millisecond)
}
