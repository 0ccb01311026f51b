package web

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
)

// dirSource serves a DirStorage the way the auth server does (its
// GetRecordingFrom reads one chunk at a time) and counts chunk reads, so
// a test can tell a seek from a download.
type dirSource struct {
	recording.DirStorage
	reads int
}

func (d *dirSource) ListRecordings(ctx context.Context) ([]recording.Meta, error) {
	return d.List(ctx)
}

func (d *dirSource) GetRecordingFrom(ctx context.Context, session string, from int, fn func(recording.Chunk) error) error {
	idx, err := d.ChunkIndexes(ctx, session)
	if err != nil {
		return err
	}
	for _, i := range idx {
		if i < from {
			continue
		}
		c, err := d.GetChunk(ctx, session, i)
		if err != nil {
			return err
		}
		d.reads++
		if err := fn(*c); err != nil {
			return err
		}
	}
	return nil
}

// writeRecording records a session of user: a counter line every 100ms
// for n lines, a resize after line resizeAt, small chunks so there are
// many. It returns the asciicast as exported.
func writeRecording(t *testing.T, st recording.DirStorage, user string, n, resizeAt int) (string, []byte) {
	t.Helper()
	id := uuid.NewString()
	clock := clockwork.NewFakeClock()
	w, err := recording.New(recording.Config{
		Header: recording.Header{SessionID: id, Width: 80, Height: 24, User: user, Login: user, Node: testNodeUUID, Cluster: "c1"},
		Sink:   &recording.DirSink{Storage: st, Session: id}, Deps: observe.Deps{Clock: clock}, ChunkBytes: 2048,
	})
	require.NoError(t, err)
	w.Marker("exec: counter")
	for i := 1; i <= n; i++ {
		clock.Advance(100 * time.Millisecond)
		w.Output([]byte(fmt.Sprintf("\x1b[1mcount\x1b[0m %05d %s\r\n", i, strings.Repeat("x", 40))))
		if i == resizeAt {
			w.Resize(100, 30)
		}
	}
	_, err = w.Close("exit-status 3")
	require.NoError(t, err)
	chunks, err := recording.GetChunks(context.Background(), st, id)
	require.NoError(t, err)
	var cast bytes.Buffer
	require.NoError(t, recording.Export(&cast, chunks))
	return id, cast.Bytes()
}

func loginAs(t *testing.T, e *termEnv, user string) webSession {
	t.Helper()
	resp, body := e.do(t, http.MethodPost, "/webapi/sessions", fmt.Sprintf(`{"user":%q,"password":%q,"otp_token":""}`, user, testPassword), webSession{}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var out webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &out))
	return webSession{cookie: resp.Cookies()[0], token: out.Token}
}

type segmentBody struct {
	Snapshot webapi.RecordingSnapshot `json:"snapshot"`
	Events   [][3]json.RawMessage     `json:"events"`
}

// TestWebRecordingsRBAC: alice sees and plays her own recording; bob sees
// an empty list and gets, for alice's recording, exactly the answer of a
// recording that does not exist (audited); a reviewer sees both.
func TestWebRecordingsRBAC(t *testing.T) {
	src := &dirSource{DirStorage: recording.DirStorage{Dir: t.TempDir()}}
	audit := events.NewRecorder()
	e := newTermEnv(t, func(c *WebSessionsConfig) { c.Recordings = src; c.Audit = audit })
	ctx := context.Background()
	aliceRec, _ := writeRecording(t, src.DirStorage, testUser, 30, 0)
	require.NoError(t, e.store.UpsertRole(ctx, &services.Role{Kind: "role", Metadata: services.Metadata{Name: "reviewer"}, Spec: services.RoleSpec{
		Logins: []string{"{{internal.logins}}"}, ReviewRecordings: true,
	}}))
	_, err := e.auth.CreateUser(ctx, "bob", []byte(testPassword), []string{"bob"}, nil, false)
	require.NoError(t, err)
	_, err = e.auth.CreateUser(ctx, "rita", []byte(testPassword), []string{"rita"}, []string{"reviewer"}, false)
	require.NoError(t, err)
	bobRec, _ := writeRecording(t, src.DirStorage, "bob", 5, 0)

	list := func(ws webSession) []string {
		resp, body := e.do(t, http.MethodGet, "/webapi/recordings", "", ws, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		var out webapi.RecordingsResponse
		require.NoError(t, json.Unmarshal(body, &out))
		var ids []string
		for _, it := range out.Items {
			ids = append(ids, it.SessionID)
		}
		return ids
	}
	alice, bob, rita := e.login(t), loginAs(t, e, "bob"), loginAs(t, e, "rita")
	require.Equal(t, []string{aliceRec}, list(alice))
	require.Equal(t, []string{bobRec}, list(bob))
	require.ElementsMatch(t, []string{aliceRec, bobRec}, list(rita))

	resp, _ := e.do(t, http.MethodGet, "/webapi/recordings", "", webSession{token: alice.token}, nil)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the token without the cookie is not a session")

	missing := uuid.NewString()
	for _, path := range []string{"/index", "/segments/0", "/cast", "/markers"} {
		resp, body := e.do(t, http.MethodGet, "/webapi/recordings/"+aliceRec+path, "", bob, nil)
		respMissing, bodyMissing := e.do(t, http.MethodGet, "/webapi/recordings/"+missing+path, "", bob, nil)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, path)
		require.Equal(t, respMissing.StatusCode, resp.StatusCode, path)
		require.Equal(t, strings.ReplaceAll(string(bodyMissing), missing, aliceRec), string(body), "%s: refused exactly like a missing recording", path)

		resp, body = e.do(t, http.MethodGet, "/webapi/recordings/"+aliceRec+path, "", alice, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, body)
		resp, body = e.do(t, http.MethodGet, "/webapi/recordings/"+aliceRec+path, "", rita, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, body)
	}
	e.server.web.recIndex.mu.Lock()
	_, cached := e.server.web.recIndex.entries[missing]
	e.server.web.recIndex.mu.Unlock()
	require.False(t, cached, "an id that is not stored takes no place in the index cache")

	var denied, plays int
	for _, ev := range audit.Events() {
		switch {
		case ev.Type == events.AccessDenied && ev.User == "bob" && ev.Fields[events.FieldSessionID] == aliceRec:
			denied++
		case ev.Type == events.RecordingPlay && ev.Fields[events.FieldSessionID] == aliceRec:
			require.Equal(t, "web", ev.Fields[events.FieldMethod])
			plays++
		}
	}
	require.Equal(t, 4, denied, "each refusal is audited")
	require.Equal(t, 4, plays, "index and cast, by alice and rita: each is a play")

	resp, body := e.do(t, http.MethodGet, "/webapi/recordings?id="+aliceRec, "", rita, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, 1, strings.Count(string(body), `"session_id"`), string(body))
	resp, body = e.do(t, http.MethodGet, "/webapi/recordings/..%2Fetc/index", "", alice, nil)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(body))
	resp, body = e.do(t, http.MethodGet, "/webapi/recordings?since=yesterday", "", alice, nil)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(body))
	require.Contains(t, string(body), "since")
}

// TestWebRecordingSegments: the segments of the index, fetched one by one,
// hold every event of the recording exactly once and in order, each
// starting at its index time; a segment's snapshot replays the output
// before it (since the last resize); and a segment near the end is served
// from its own chunks and a bounded warm-up, not from the whole recording.
func TestWebRecordingSegments(t *testing.T) {
	warmupBytes = 32 << 10
	t.Cleanup(func() { warmupBytes = recording.DefaultWarmupBytes })
	src := &dirSource{DirStorage: recording.DirStorage{Dir: t.TempDir()}}
	e := newTermEnv(t, func(c *WebSessionsConfig) { c.Recordings = src })
	id, cast := writeRecording(t, src.DirStorage, testUser, 3000, 200)
	_, want, err := recording.Parse(cast)
	require.NoError(t, err)
	alice := e.login(t)

	resp, body := e.do(t, http.MethodGet, "/webapi/recordings/"+id+"/index", "", alice, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var ix webapi.RecordingIndex
	require.NoError(t, json.Unmarshal(body, &ix))
	require.Equal(t, 1, ix.Version)
	require.InDelta(t, 300.0, ix.Duration, 1e-6)
	require.Equal(t, webapi.RecordingTerm{Cols: 80, Rows: 24}, ix.Term)
	require.True(t, ix.Postern.Complete)
	require.Empty(t, ix.Postern.Integrity)
	require.Greater(t, len(ix.Segments), 50, "small chunks make many segments")
	require.Contains(t, string(body), `"markers":[[0,"exec: counter"],[300,"exit-status 3"]]`)
	require.Zero(t, ix.Segments[0].Start)

	var got []recording.Event
	var outputBefore strings.Builder
	for i, ref := range ix.Segments {
		resp, body := e.do(t, http.MethodGet, "/webapi/recordings/"+id+"/"+ref.URL, "", alice, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		var seg segmentBody
		require.NoError(t, json.Unmarshal(body, &seg), "segment %d", i)
		require.NotEmpty(t, seg.Events)
		if i > 0 {
			var t0 float64
			require.NoError(t, json.Unmarshal(seg.Events[0][0], &t0))
			require.Equal(t, ref.Start, t0, "segment %d starts at its first event", i)
			require.Greater(t, ref.Start, ix.Segments[i-1].Start)
		}
		size := seg.Snapshot.Cols
		if len(got) < 220 { // before the resize (line 200) and a little after
			require.Equal(t, outputBefore.String(), seg.Snapshot.Init, "segment %d: the snapshot replays all output before it", i)
		}
		for _, raw := range seg.Events {
			var ev recording.Event
			require.NoError(t, json.Unmarshal(raw[0], &ev.Time))
			require.NoError(t, json.Unmarshal(raw[1], &ev.Code))
			require.NoError(t, json.Unmarshal(raw[2], &ev.Data))
			got = append(got, ev)
			switch ev.Code {
			case "o":
				outputBefore.WriteString(ev.Data)
			case "r":
				outputBefore.Reset()
			}
		}
		if len(got) > 400 {
			require.Equal(t, uint32(100), size, "segment %d: the size after the resize", i)
		}
	}
	require.Equal(t, want, got, "the segments are the recording, once, in order")

	// Seek near the end: the segment and its warm-up only.
	src.reads = 0
	last := ix.Segments[len(ix.Segments)-3]
	resp, body = e.do(t, http.MethodGet, "/webapi/recordings/"+id+"/"+last.URL, "", alice, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var seg segmentBody
	require.NoError(t, json.Unmarshal(body, &seg))
	n, err := src.ChunkIndexes(context.Background(), id)
	require.NoError(t, err)
	require.Less(t, src.reads, len(n)/2, "a seek reads the end, not the whole recording (%d of %d chunks)", src.reads, len(n))
	require.Contains(t, seg.Snapshot.Init, "count", "the warm-up rebuilds the screen")
	require.Less(t, len(seg.Snapshot.Init), warmupBytes+4096)

	// The cast is the export byte for byte.
	resp, body = e.do(t, http.MethodGet, "/webapi/recordings/"+id+"/cast", "", alice, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, cast, body)

	resp, body = e.do(t, http.MethodGet, "/webapi/recordings/"+id+"/segments/99999", "", alice, nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, string(body))
	resp, body = e.do(t, http.MethodGet, "/webapi/recordings/"+id+"/segments/x", "", alice, nil)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(body))
}

// TestWebRecordingVerification: the index tells the player what the hash
// chain says: verified for a recording as written; for one whose chunk
// was altered on disk, tampered at that chunk with the time it stops
// being vouched for and a marker there; for one with a chunk deleted,
// tampered at the gap and playable up to it; incomplete, not tampered, for one
// without its final chunk. A chunk altered after the index was cached is
// not served under the cached verdict.
func TestWebRecordingVerification(t *testing.T) {
	src := &dirSource{DirStorage: recording.DirStorage{Dir: t.TempDir()}}
	e := newTermEnv(t, func(c *WebSessionsConfig) { c.Recordings = src })
	alice := e.login(t)
	index := func(id string) webapi.RecordingIndex {
		resp, body := e.do(t, http.MethodGet, "/webapi/recordings/"+id+"/index", "", alice, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		var ix webapi.RecordingIndex
		require.NoError(t, json.Unmarshal(body, &ix))
		return ix
	}
	chunkFile := func(id string, i int) string { return fmt.Sprintf("%s/%s/%08d.chunk", src.Dir, id, i) }
	alter := func(id string, i int) {
		data, err := os.ReadFile(chunkFile(id, i))
		require.NoError(t, err)
		var c recording.Chunk
		require.NoError(t, json.Unmarshal(data, &c))
		plain, err := recording.DecodeChunk(c.Data)
		require.NoError(t, err)
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		_, err = zw.Write(bytes.ReplaceAll(plain, []byte("count"), []byte("forge")))
		require.NoError(t, err)
		require.NoError(t, zw.Close())
		c.Data = gz.Bytes()
		data, err = json.Marshal(c)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(chunkFile(id, i), data, 0o600))
	}

	good, _ := writeRecording(t, src.DirStorage, testUser, 300, 0)
	v := index(good).Postern.Verification
	require.Equal(t, recording.CheckVerified, v.State)
	require.Nil(t, v.BrokenChunk)
	require.Contains(t, v.Summary, "verified: hash chain intact over")

	bad, _ := writeRecording(t, src.DirStorage, testUser, 300, 0)
	alter(bad, 3)
	ix := index(bad)
	v = ix.Postern.Verification
	require.Equal(t, recording.CheckTampered, v.State)
	require.NotNil(t, v.BrokenChunk)
	require.Equal(t, 3, *v.BrokenChunk)
	require.Equal(t, recording.ProblemHashMismatch, v.Problem)
	require.Equal(t, 3, v.Chunks)
	require.Greater(t, v.Until, 0.0)
	require.Contains(t, v.Summary, "NOT VERIFIED, TAMPERED: the hash chain breaks at chunk 3")
	require.Contains(t, ix.Markers, webapi.RecordingMarker{Time: v.Until, Label: "NOT VERIFIED from here on: the hash chain breaks at chunk 3 (hash mismatch)"})
	resp, body := e.do(t, http.MethodGet, "/webapi/recordings/"+bad+"/"+ix.Segments[len(ix.Segments)-1].URL, "", alice, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "a tampered recording still plays, under its banner: %s", body)

	gap, _ := writeRecording(t, src.DirStorage, testUser, 300, 0)
	require.NoError(t, os.Remove(chunkFile(gap, 2)))
	ix = index(gap)
	v = ix.Postern.Verification
	require.Equal(t, recording.CheckTampered, v.State)
	require.Equal(t, recording.ProblemMissingChunk, v.Problem)
	require.Equal(t, 2, *v.BrokenChunk)
	require.Contains(t, v.Reason, "chunk 2 is missing")
	require.LessOrEqual(t, ix.Duration, v.Until+1e-9, "the player plays up to the gap")
	resp, body = e.do(t, http.MethodGet, "/webapi/recordings/"+gap+"/"+ix.Segments[len(ix.Segments)-1].URL, "", alice, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))

	garbage, _ := writeRecording(t, src.DirStorage, testUser, 300, 0)
	data, err := os.ReadFile(chunkFile(garbage, 4))
	require.NoError(t, err)
	var c4 recording.Chunk
	require.NoError(t, json.Unmarshal(data, &c4))
	c4.Data = []byte("not gzip at all")
	data, err = json.Marshal(c4)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(chunkFile(garbage, 4), data, 0o600))
	v = index(garbage).Postern.Verification
	require.Equal(t, recording.CheckTampered, v.State, "an unreadable chunk is a break the player plays up to")
	require.Equal(t, 4, *v.BrokenChunk)

	cut, _ := writeRecording(t, src.DirStorage, testUser, 300, 0)
	idx, err := src.ChunkIndexes(context.Background(), cut)
	require.NoError(t, err)
	require.NoError(t, os.Remove(chunkFile(cut, idx[len(idx)-1])))
	v = index(cut).Postern.Verification
	require.Equal(t, recording.CheckIncomplete, v.State, "no final chunk is incomplete, not tampered")
	require.Nil(t, v.BrokenChunk)

	// good's index (verified) is cached; a chunk changed now is refused
	// when its segment is read, and the next index says tampered.
	ix = index(good)
	alter(good, 1)
	refused := ""
	for _, ref := range ix.Segments {
		resp, body = e.do(t, http.MethodGet, "/webapi/recordings/"+good+"/"+ref.URL, "", alice, nil)
		if resp.StatusCode != http.StatusOK {
			require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, string(body))
			refused = string(body)
			break
		}
	}
	require.Contains(t, refused, "chunk 1 changed in the store", "the segment holding chunk 1 is refused")
	v = index(good).Postern.Verification
	require.Equal(t, recording.CheckTampered, v.State)
	require.Equal(t, 1, *v.BrokenChunk)
}
