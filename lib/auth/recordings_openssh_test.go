package auth

import (
	"context"
	"testing"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
)

// recordFor records a short session on node of cluster.
func recordFor(t *testing.T, session, node, cluster string) []recording.Chunk {
	t.Helper()
	sink := &chunkSink{}
	w, err := recording.New(recording.Config{
		Header: recording.Header{SessionID: session, User: "alice", Login: "root", Node: node, Cluster: cluster, Width: 80, Height: 24},
		Sink:   sink, Deps: observe.Deps{Clock: clockwork.NewFakeClock()}, ChunkBytes: 64,
	})
	require.NoError(t, err)
	w.Output([]byte("output of a session ..........................................\r\n"))
	_, err = w.Close("exit-status 0")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(sink.chunks), 2)
	return sink.chunks
}

// TestProxyRecordsOnlyOpenSSHNodes: the proxy records its web terminals
// to OpenSSH nodes and may upload those, and only those. The attack is a
// proxy identity (a raw API client holding one) writing a Postern node's
// session, a node that does not exist, another cluster's, or resuming
// one it may not write; nodes keep their own rule. A session in a leaf
// of this cluster (a root proxy's web terminal to the leaf's OpenSSH
// node) is the proxy's to write.
func TestProxyRecordsOnlyOpenSSHNodes(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	admin := env.adminClient(t)
	added, err := admin.AddOpenSSHNode(ctx, authapi.OpenSSHNodeRequest{Name: "db1", Addr: "127.0.0.9:2222", PublicKey: newHostPub(t)})
	require.NoError(t, err)
	openssh := added.Node.UUID
	require.NoError(t, env.store.UpsertNode(ctx, services.Node{UUID: "node-1", Cluster: testCluster, Hostname: "web", Addr: "127.0.0.1:3022"}))
	// A leaf's OpenSSH node stored under its cluster, as the root's
	// watcher would hold it.
	require.NoError(t, env.store.UpsertNode(ctx, services.Node{UUID: "leaf-ssh", Cluster: "leaf", Hostname: "db2", Addr: "127.0.0.10:22", Kind: services.NodeKindOpenSSH}))
	proxy := env.client(t, env.identity(t, "proxy-1", RoleProxy))
	node1 := env.client(t, env.identity(t, "node-1", RoleNode))

	const (
		sOpenSSH = "11111111-1111-4111-8111-111111111111"
		sPostern = "22222222-2222-4222-8222-222222222222"
		sLeaf    = "33333333-3333-4333-8333-333333333333"
		sMissing = "44444444-4444-4444-8444-444444444444"
		sNodeOS  = "55555555-5555-4555-8555-555555555555"
	)

	// The proxy uploads its OpenSSH node's session, resumes it and
	// completes it.
	chunks := recordFor(t, sOpenSSH, openssh, testCluster)
	require.NoError(t, proxy.PutRecordingChunk(ctx, sOpenSSH, chunks[0]))
	ref, err := proxy.LastRecordingChunk(ctx, sOpenSSH)
	require.NoError(t, err)
	require.Equal(t, 0, ref.Index)
	for _, c := range chunks[1:] {
		require.NoError(t, proxy.PutRecordingChunk(ctx, sOpenSSH, c))
	}
	// A node cannot write (or extend) the OpenSSH node's session.
	err = node1.PutRecordingChunk(ctx, sNodeOS, recordFor(t, sNodeOS, openssh, testCluster)[0])
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	_, err = node1.LastRecordingChunk(ctx, sOpenSSH)
	require.True(t, trace.IsNotFound(err), "%v", err)

	// A Postern node's session: refused to the proxy, first chunk or
	// later, and its resume point is hidden from it.
	pchunks := recordFor(t, sPostern, "node-1", testCluster)
	err = proxy.PutRecordingChunk(ctx, sPostern, pchunks[0])
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	require.ErrorContains(t, err, "Postern node")
	require.NoError(t, node1.PutRecordingChunk(ctx, sPostern, pchunks[0]), "the node's own rule is unchanged")
	err = proxy.PutRecordingChunk(ctx, sPostern, pchunks[1])
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	_, err = proxy.LastRecordingChunk(ctx, sPostern)
	require.True(t, trace.IsNotFound(err), "%v", err)
	for _, c := range pchunks[1:] {
		require.NoError(t, node1.PutRecordingChunk(ctx, sPostern, c))
	}

	// Another cluster's OpenSSH node, and a node nobody registered.
	err = proxy.PutRecordingChunk(ctx, sLeaf, recordFor(t, sLeaf, "leaf-ssh", "leaf")[0])
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	err = proxy.PutRecordingChunk(ctx, sLeaf, recordFor(t, sLeaf, "leaf-ssh", testCluster)[0])
	require.True(t, trace.IsAccessDenied(err), "a header claiming this cluster for a leaf node: %v", err)
	err = proxy.PutRecordingChunk(ctx, sMissing, recordFor(t, sMissing, "no-such-node", testCluster)[0])
	require.True(t, trace.IsAccessDenied(err), "%v", err)

	// A leaf of this cluster: a root proxy records its web terminals to
	// the leaf's OpenSSH nodes and this cluster stores them; a cluster
	// that is not a leaf here stays refused, and a node still writes
	// only its own sessions.
	const sLeafOK = "66666666-6666-4666-8666-666666666666"
	require.NoError(t, env.store.CreateRemoteCluster(ctx, services.RemoteCluster{Name: "leaf"}))
	lchunks := recordFor(t, sLeafOK, "leaf-ssh", "leaf")
	err = node1.PutRecordingChunk(ctx, sLeafOK, lchunks[0])
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	for _, c := range lchunks {
		require.NoError(t, proxy.PutRecordingChunk(ctx, sLeafOK, c))
	}
	err = proxy.PutRecordingChunk(ctx, sMissing, recordFor(t, sMissing, "leaf-ssh", "other")[0])
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	require.ErrorContains(t, err, `in cluster "other"`)

	// An admin identity is refused by the route table.
	err = admin.PutRecordingChunk(ctx, sMissing, recordFor(t, sMissing, openssh, testCluster)[0])
	require.True(t, trace.IsAccessDenied(err), "%v", err)

	list, err := admin.ListRecordings(ctx)
	require.NoError(t, err)
	complete := map[string]bool{}
	for _, m := range list {
		complete[m.SessionID] = m.Complete
	}
	require.Equal(t, map[string]bool{sOpenSSH: true, sPostern: true, sLeafOK: true}, complete)
}
