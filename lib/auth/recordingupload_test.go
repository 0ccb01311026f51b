package auth

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
)

// These tests run a node's real recording uploader against real auth API
// servers and their recording stores: two auth servers over one backend
// (one CA, so the node's identity is good at both), each with its own
// store (the failover that stalled every upload of a node) or sharing
// one.

// secondAuth starts another auth server over env's backend, keeping its
// recordings in rec, with its API on its own listener.
func secondAuth(t *testing.T, env *testEnv, rec recording.Storage) *testEnv {
	t.Helper()
	srv, err := NewServer(ServerConfig{
		Store: env.store, ClusterName: testCluster, BcryptCost: bcrypt.MinCost,
		Deps: observe.Deps{Clock: env.clock, Logger: testLogger()}, Recordings: rec,
	})
	require.NoError(t, err)
	second := &testEnv{clock: env.clock, store: env.store, auth: srv, adminDir: env.adminDir}
	startAPI(t, second)
	return second
}

func storeOf(env *testEnv) recording.DirStorage {
	return env.auth.cfg.Recordings.(recording.DirStorage)
}

// recordChunks records a session of node: outputs chunks of output, the
// first with the header, and the final one.
func recordChunks(t *testing.T, session, node string, outputs int) ([]recording.Chunk, string) {
	t.Helper()
	sink := &chunkSink{}
	w, err := recording.New(recording.Config{
		Header: recording.Header{SessionID: session, User: "alice", Login: "root", Node: node, Cluster: testCluster, Width: 80, Height: 24},
		Sink:   sink, Deps: observe.Deps{Clock: clockwork.NewFakeClock()}, ChunkBytes: 64,
	})
	require.NoError(t, err)
	for i := 0; i < outputs; i++ {
		w.Output([]byte(fmt.Sprintf("line of output number %d ....................................\r\n", i)))
	}
	final, err := w.Close("exit-status 0")
	require.NoError(t, err)
	return sink.chunks, final
}

// spoolChunks leaves chunks in the node's spool as a finished session
// whose upload is pending.
func spoolChunks(t *testing.T, spool recording.DirStorage, session string, chunks []recording.Chunk) {
	t.Helper()
	sink := &recording.SpoolSink{Storage: spool, Session: session}
	for _, c := range chunks {
		require.NoError(t, sink.WriteChunk(c))
	}
	require.NoError(t, sink.Close())
}

// spooled lists the sessions left in the spool.
func spooled(t *testing.T, spool recording.DirStorage) []string {
	t.Helper()
	ents, err := os.ReadDir(spool.Dir)
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// nodeUpload is the node's auth client as its uploader sees it: calls go
// to the client of the moment (a test switches it, as a failover does),
// and the chunks put are noted by session.
type nodeUpload struct {
	mu    sync.Mutex
	clt   *Client
	puts  map[string][]int
	calls map[string]int
}

func newNodeUpload(clt *Client) *nodeUpload {
	return &nodeUpload{clt: clt, puts: map[string][]int{}, calls: map[string]int{}}
}

func (n *nodeUpload) use(clt *Client) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.clt = clt
}

func (n *nodeUpload) client(session string, put int) *Client {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls[session]++
	if put >= 0 {
		n.puts[session] = append(n.puts[session], put)
	}
	return n.clt
}

func (n *nodeUpload) PutRecordingChunk(ctx context.Context, session string, c recording.Chunk) error {
	return n.client(session, c.Index).PutRecordingChunk(ctx, session, c)
}

func (n *nodeUpload) LastRecordingChunk(ctx context.Context, session string) (*recording.ChunkRef, error) {
	return n.client(session, -1).LastRecordingChunk(ctx, session)
}

func (n *nodeUpload) putsOf(session string) []int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.puts[session])
}

func (n *nodeUpload) callsOf(session string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.calls[session]
}

const waitFor = 20 * time.Second

func requireVerified(t *testing.T, st recording.Storage, session, final string) {
	t.Helper()
	chunks, err := recording.GetChunks(context.Background(), st, session)
	require.NoError(t, err)
	res, err := recording.Verify(chunks, final)
	require.NoError(t, err)
	require.True(t, res.Complete)
}

func requireUploadMetrics(t *testing.T, reg *prometheus.Registry, held int, refusals map[string]int) {
	t.Helper()
	var want strings.Builder
	want.WriteString("# HELP postern_recording_uploads_held Spooled recordings auth refuses now, kept in the spool and offered again every few minutes.\n# TYPE postern_recording_uploads_held gauge\n")
	fmt.Fprintf(&want, "postern_recording_uploads_held %d\n", held)
	names := []string{"postern_recording_uploads_held"}
	if len(refusals) > 0 {
		names = append(names, "postern_recording_upload_refusals_total")
		want.WriteString("# HELP postern_recording_upload_refusals_total Spooled recordings auth refused for good, by reason (gap, conflict, refused); each is kept in the spool.\n# TYPE postern_recording_upload_refusals_total counter\n")
		for reason, n := range refusals {
			fmt.Fprintf(&want, "postern_recording_upload_refusals_total{reason=%q} %d\n", reason, n)
		}
	}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want.String()), names...))
}

func errorLines(hook *logtest.Hook) []string {
	var out []string
	for _, e := range hook.AllEntries() {
		if e.Level <= logrus.ErrorLevel {
			out = append(out, e.Message)
		}
	}
	return out
}

// TestRecordingUploadHeldSessionDoesNotDelayOthers is the stall after a
// failover: a node shipped chunks 0-2 of a session to auth #1, then its
// client moved to auth #2, whose store (its own disk) has none of it, and
// the spool no longer has them. That session is held (one error line,
// counted, its chunks kept), and every other session of the spool ships
// to auth #2 anyway, through one worker and without the clock moving.
// What auth #1 holds of it reads as incomplete. Offered again every
// MaxRetryInterval, it is refused without a new log line until the
// client is back on auth #1, where it completes.
func TestRecordingUploadHeldSessionDoesNotDelayOthers(t *testing.T) {
	ctx := context.Background()
	env1 := newTestAPI(t)
	env2 := secondAuth(t, env1, recording.DirStorage{Dir: t.TempDir()})
	node := env1.identity(t, "node-1", RoleNode)
	clt1, clt2 := env1.client(t, node), env2.client(t, node)
	spool := recording.DirStorage{Dir: t.TempDir()}

	stuck := "00000000-0000-4000-8000-000000000001" // first in the spool's order
	stuckChunks, stuckFinal := recordChunks(t, stuck, "node-1", 6)
	require.Greater(t, len(stuckChunks), 4)
	for _, c := range stuckChunks[:3] {
		require.NoError(t, clt1.PutRecordingChunk(ctx, stuck, c))
	}
	spoolChunks(t, spool, stuck, stuckChunks[3:])
	others := map[string]string{}
	for i := 2; i <= 6; i++ {
		s := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		chunks, final := recordChunks(t, s, "node-1", 3)
		spoolChunks(t, spool, s, chunks)
		others[s] = final
	}

	up := newNodeUpload(clt2)
	reg := prometheus.NewRegistry()
	logger, hook := logtest.NewNullLogger()
	clock := clockwork.NewFakeClock()
	u, err := recording.NewUploader(recording.UploaderConfig{
		Spool: spool, Upload: up, Deps: observe.Deps{Clock: clock, Metrics: reg, Logger: logger.WithField("component", "recording:upload")}, Concurrency: 1,
	})
	require.NoError(t, err)
	defer u.Close()

	require.Eventually(t, func() bool { return slices.Equal(spooled(t, spool), []string{stuck}) }, waitFor, 10*time.Millisecond,
		"every other session ships while one is refused")
	for s, final := range others {
		requireVerified(t, storeOf(env2), s, final)
	}
	require.Eventually(t, func() bool { return len(errorLines(hook)) == 1 }, waitFor, 10*time.Millisecond)
	require.Contains(t, errorLines(hook)[0], "gap")
	requireUploadMetrics(t, reg, 1, map[string]int{recording.RefusedGap: 1})
	idx, err := spool.ChunkIndexes(ctx, stuck)
	require.NoError(t, err)
	require.Equal(t, stuckChunks[len(stuckChunks)-1].Index, idx[len(idx)-1], "the held session's chunks stay in the spool")
	require.Equal(t, 3, idx[0])
	_, err = storeOf(env2).LastChunk(ctx, stuck)
	require.Error(t, err, "auth #2 stored nothing of it")
	got, err := recording.GetChunks(ctx, storeOf(env1), stuck)
	require.NoError(t, err)
	res, err := recording.Verify(got, "")
	require.NoError(t, err, "what auth #1 holds is not tampered with")
	require.False(t, res.Complete, "it reads as incomplete")

	// Offered again after MaxRetryInterval: still refused, no new line.
	calls := up.callsOf(stuck)
	clock.Advance(recording.DefaultMaxRetryInterval)
	u.Notify()
	require.Eventually(t, func() bool { return up.callsOf(stuck) >= calls+2 }, waitFor, 10*time.Millisecond)

	// Back on auth #1, whose store has chunks 0-2: it completes there.
	up.use(clt1)
	clock.Advance(recording.DefaultMaxRetryInterval)
	u.Notify()
	require.Eventually(t, func() bool { return len(spooled(t, spool)) == 0 }, waitFor, 10*time.Millisecond)
	requireVerified(t, storeOf(env1), stuck, stuckFinal)
	require.NoError(t, u.Close())
	require.Len(t, errorLines(hook), 1, "a held session is logged once")
	requireUploadMetrics(t, reg, 0, map[string]int{recording.RefusedGap: 1})
}

// TestRecordingUploadResumesAfterFailover: auth #1 and auth #2 share one
// store, which already has chunks 0-k of a session (auth #1 took them,
// and the node restarted before deleting them from its spool). Auth #1
// is gone; the node's client fails over to auth #2, and the uploader
// asks the store what it holds and goes on at chunk k+1: no chunk is
// sent twice, and the recording is whole.
func TestRecordingUploadResumesAfterFailover(t *testing.T) {
	ctx := context.Background()
	env1 := newTestAPI(t)
	addr1 := env1.addr
	env2 := secondAuth(t, env1, storeOf(env1))
	node := env1.identity(t, "node-1", RoleNode)
	spool := recording.DirStorage{Dir: t.TempDir()}

	const session = "00000000-0000-4000-8000-000000000007"
	chunks, final := recordChunks(t, session, "node-1", 8)
	const k = 4
	require.Greater(t, len(chunks), k+2)
	clt1 := env1.client(t, node)
	for _, c := range chunks[:k+1] {
		require.NoError(t, clt1.PutRecordingChunk(ctx, session, c))
	}
	spoolChunks(t, spool, session, chunks)
	env1.api.Close()

	clt, err := NewClient(ClientConfig{Addr: addr1 + "," + env2.addr, Identity: node, Deps: observe.Deps{Clock: env1.clock}, Timeout: 10 * time.Second})
	require.NoError(t, err)
	defer clt.Close()
	up := newNodeUpload(clt)
	u, err := recording.NewUploader(recording.UploaderConfig{Spool: spool, Upload: up, Deps: observe.Deps{Clock: clockwork.NewFakeClock()}})
	require.NoError(t, err)
	defer u.Close()
	require.Eventually(t, func() bool { return len(spooled(t, spool)) == 0 }, waitFor, 10*time.Millisecond)
	var want []int
	for _, c := range chunks[k+1:] {
		want = append(want, c.Index)
	}
	require.Equal(t, want, up.putsOf(session), "the upload resumed at chunk k+1")
	requireVerified(t, storeOf(env2), session, final)
}

// TestRecordingUploadRewindsForANewStore: the node ships a running
// session's first chunks to auth #1; its client then moves to auth #2,
// whose store is its own. Auth #2 refuses the next chunk (its store
// lacks the first); the store holds nothing, the spool still has every
// chunk (the writer has not moved on from its segment), so the upload
// starts again at chunk 0 and auth #2 gets the whole recording.
func TestRecordingUploadRewindsForANewStore(t *testing.T) {
	ctx := context.Background()
	env1 := newTestAPI(t)
	env2 := secondAuth(t, env1, recording.DirStorage{Dir: t.TempDir()})
	node := env1.identity(t, "node-1", RoleNode)
	spool := recording.DirStorage{Dir: t.TempDir()}
	const session = "00000000-0000-4000-8000-000000000008"

	up := newNodeUpload(env1.client(t, node))
	u, err := recording.NewUploader(recording.UploaderConfig{Spool: spool, Upload: up, Deps: observe.Deps{Clock: clockwork.NewFakeClock()}})
	require.NoError(t, err)
	defer u.Close()
	w, err := recording.New(recording.Config{
		Header: recording.Header{SessionID: session, User: "alice", Login: "root", Node: "node-1", Cluster: testCluster, Width: 80, Height: 24},
		Sink:   &recording.SpoolSink{Storage: spool, Session: session, Notify: u.Notify, Clock: clockwork.NewFakeClock()},
		Deps:   observe.Deps{Clock: clockwork.NewFakeClock()}, ChunkBytes: 64,
	})
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		w.Output(bytes.Repeat([]byte{'a' + byte(i)}, 100))
	}
	require.NoError(t, w.Sync())
	require.Eventually(t, func() bool {
		last, err := storeOf(env1).LastChunk(ctx, session)
		return err == nil && last.Index >= 2
	}, waitFor, 10*time.Millisecond)

	up.use(env2.client(t, node))
	for i := 3; i < 6; i++ {
		w.Output(bytes.Repeat([]byte{'a' + byte(i)}, 100))
	}
	final, err := w.Close("exit-status 0")
	require.NoError(t, err)
	u.Notify()
	require.Eventually(t, func() bool { return len(spooled(t, spool)) == 0 }, waitFor, 10*time.Millisecond)
	requireVerified(t, storeOf(env2), session, final)
	puts := up.putsOf(session)
	require.Contains(t, puts[1:], 0, "chunk 0 was shipped again, to auth #2: %v", puts)
}

// TestRecordingUploadPermanentRefusalStaysSpooled: a spooled session auth
// refuses for good (its header names another node: AccessDenied on
// chunk 0, whatever the store holds) is held: its chunks stay in the
// spool, it is logged once and counted once however often it is offered
// again, and another session ships meanwhile through the one worker.
func TestRecordingUploadPermanentRefusalStaysSpooled(t *testing.T) {
	ctx := context.Background()
	env := newTestAPI(t)
	spool := recording.DirStorage{Dir: t.TempDir()}
	const refused = "00000000-0000-4000-8000-000000000009"
	const fine = "00000000-0000-4000-8000-00000000000a"
	bad, _ := recordChunks(t, refused, "node-2", 3)
	spoolChunks(t, spool, refused, bad)
	good, goodFinal := recordChunks(t, fine, "node-1", 3)
	spoolChunks(t, spool, fine, good)

	up := newNodeUpload(env.client(t, env.identity(t, "node-1", RoleNode)))
	reg := prometheus.NewRegistry()
	logger, hook := logtest.NewNullLogger()
	clock := clockwork.NewFakeClock()
	u, err := recording.NewUploader(recording.UploaderConfig{
		Spool: spool, Upload: up, Deps: observe.Deps{Clock: clock, Metrics: reg, Logger: logger.WithField("component", "recording:upload")}, Concurrency: 1,
	})
	require.NoError(t, err)
	defer u.Close()
	require.Eventually(t, func() bool { return slices.Equal(spooled(t, spool), []string{refused}) }, waitFor, 10*time.Millisecond)
	requireVerified(t, storeOf(env), fine, goodFinal)
	requireUploadMetrics(t, reg, 1, map[string]int{recording.RefusedChunk: 1})
	for i := 0; i < 2; i++ {
		calls := up.callsOf(refused)
		// Advanced on every poll: the uploader dates the next try when it
		// settles the pass, which may come after the calls were counted.
		require.Eventually(t, func() bool {
			clock.Advance(recording.DefaultMaxRetryInterval)
			u.Notify()
			return up.callsOf(refused) >= calls+2
		}, waitFor, 10*time.Millisecond)
	}
	require.NoError(t, u.Close())

	lines := errorLines(hook)
	require.Len(t, lines, 1, "logged once: %v", lines)
	require.Contains(t, lines[0], recording.RefusedChunk)
	requireUploadMetrics(t, reg, 0, map[string]int{recording.RefusedChunk: 1})
	idx, err := spool.ChunkIndexes(ctx, refused)
	require.NoError(t, err)
	require.Len(t, idx, len(bad), "nothing of it left the spool")
	_, err = storeOf(env).LastChunk(ctx, refused)
	require.Error(t, err)
}
