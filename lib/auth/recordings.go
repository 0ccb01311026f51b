package auth

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
)

// recordings returns the storage or says there is none.
func (s *Server) recordings() (recording.Storage, error) {
	if s.cfg.Recordings == nil {
		return nil, trace.NotImplemented("this auth server stores no session recordings")
	}
	return s.cfg.Recordings, nil
}

// PutRecordingChunk stores chunk c of session as uploaded by caller (a
// node or a proxy identity).
//
// Only the host that recorded a session may write it: chunk 0's header
// names the node (its UUID), and every later chunk must come from that
// node. The one exception is a session on an OpenSSH node, which runs no
// Postern process: the proxy whose web terminal was its SSH client
// recorded it, so a proxy identity may write a session whose node is a
// kind openssh record of this cluster, or a session in one of this
// cluster's leaves (a root proxy's web terminal to a leaf's OpenSSH node),
// and no other (mayWrite). Chunks arrive in order and must extend the stored hash chain, so a
// node (or anyone with its identity) cannot rewrite what it already
// uploaded: a chunk that is already stored is accepted again only when it
// is identical (an upload retried after a crash), never replaced.
//
// Nothing here is held in this process between calls: the store decides
// (its PutChunk never replaces a stored chunk, Storage), so several auth
// servers sharing one store may each receive chunks of the same session
// (a node failing over mid-upload) and the chain stays whole.
func (s *Server) PutRecordingChunk(ctx context.Context, caller RecordingWriter, session string, c recording.Chunk) error {
	st, err := s.recordings()
	if err != nil {
		return trace.Wrap(err)
	}
	if err := recording.CheckSessionID(session); err != nil {
		return trace.Wrap(err)
	}
	if c.Index < 0 {
		return trace.BadParameter("chunk index %d is negative", c.Index)
	}
	if _, err := recording.DecodeChunk(c.Data); err != nil {
		return trace.Wrap(err)
	}
	var owner *recording.Header
	if c.Index == 0 {
		h, err := recording.HeaderOf(c.Data)
		if err != nil {
			return trace.Wrap(err)
		}
		if h.SessionID != session {
			return trace.BadParameter("chunk 0 is for session %q, not %q", h.SessionID, session)
		}
		owner = h
	} else {
		first, err := st.GetChunk(ctx, session, 0)
		if trace.IsNotFound(err) {
			return trace.BadParameter("chunk %d of %s: the first chunk is not stored yet", c.Index, session)
		}
		if err != nil {
			return trace.Wrap(err)
		}
		h, err := recording.HeaderOf(first.Data)
		if err != nil {
			return trace.Wrap(err)
		}
		owner = h
	}
	if err := s.mayWrite(ctx, caller, owner); err != nil {
		return trace.Wrap(err)
	}
	prev := ""
	if c.Index > 0 {
		p, err := st.GetChunk(ctx, session, c.Index-1)
		if trace.IsNotFound(err) {
			next := 0
			if last, err := st.LastChunk(ctx, session); err == nil {
				next = last.Index + 1
			}
			return trace.BadParameter("chunk %d of %s: the next chunk expected is %d", c.Index, session, next)
		}
		if err != nil {
			return trace.Wrap(err)
		}
		if p.Final {
			return trace.BadParameter("recording %s is already complete", session)
		}
		prev = p.Hash
	}
	want, err := recording.ChainHash(prev, c.Data)
	if err != nil {
		return trace.Wrap(err)
	}
	if want != c.Hash {
		return trace.BadParameter("chunk %d of %s does not extend the hash chain", c.Index, session)
	}
	return trace.Wrap(st.PutChunk(ctx, session, c))
}

// LastRecordingChunk answers a node resuming an upload: the index and
// hash of the last chunk the store holds of session (NotFound when it
// holds none). The store is the cluster's, so any auth server gives the
// same answer. A node asks only about its own sessions (a proxy about
// its OpenSSH nodes'): any other is NotFound, as if absent.
func (s *Server) LastRecordingChunk(ctx context.Context, caller RecordingWriter, session string) (*recording.ChunkRef, error) {
	st, err := s.recordings()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := recording.CheckSessionID(session); err != nil {
		return nil, trace.Wrap(err)
	}
	notFound := trace.NotFound("recording %s not found", session)
	first, err := st.GetChunk(ctx, session, 0)
	if trace.IsNotFound(err) {
		return nil, notFound
	}
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if h, err := recording.HeaderOf(first.Data); err != nil || s.mayWrite(ctx, caller, h) != nil {
		return nil, notFound
	}
	last, err := st.LastChunk(ctx, session)
	return last, trace.Wrap(err)
}

// A chunk upload fits maxRequestBody: a chunk is at most
// recording.DefaultChunkBytes plus one escaped 32 KiB pty read before
// compression (under 450 KiB), under 600 KiB as base64 in JSON.

func (a *APIServer) putRecordingChunk(ctx context.Context, p *peer, r *http.Request) (any, error) {
	session := r.PathValue("session")
	n, err := strconv.Atoi(r.PathValue("n"))
	if err != nil || n < 0 {
		return nil, trace.BadParameter("chunk number %q is not a non-negative integer", r.PathValue("n"))
	}
	var c recording.Chunk
	if err := readJSON(r, &c); err != nil {
		return nil, trace.Wrap(err)
	}
	if c.Index != n {
		return nil, trace.BadParameter("chunk body says index %d, the path %d", c.Index, n)
	}
	return nil, trace.Wrap(a.auth.PutRecordingChunk(ctx, RecordingWriter{ID: p.ID, Role: p.Role}, session, c))
}

func (a *APIServer) lastRecordingChunk(ctx context.Context, p *peer, r *http.Request) (any, error) {
	ref, err := a.auth.LastRecordingChunk(ctx, RecordingWriter{ID: p.ID, Role: p.Role}, r.PathValue("session"))
	return ref, trace.Wrap(err)
}

func (a *APIServer) listRecordings(ctx context.Context, _ *peer, _ *http.Request) (any, error) {
	st, err := a.auth.recordings()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	list, err := st.List(ctx)
	return list, trace.Wrap(err)
}

// streamRecording answers GET /v1/recordings/{session}[?from=N]: the
// chunks (from chunk N on, so that a player seeking into a long recording
// reads only what it shows) as newline-delimited JSON, read and sent one
// at a time. Each read by an admin is an audit event (recording.play); for
// the proxy, lib/web and the SSH proxy record the user they play for.
func (a *APIServer) streamRecording(w http.ResponseWriter, r *http.Request, p *peer) {
	ctx := r.Context()
	session := r.PathValue("session")
	st, err := a.auth.recordings()
	if err != nil {
		writeError(w, err)
		return
	}
	if err := recording.CheckSessionID(session); err != nil {
		writeError(w, err)
		return
	}
	from, err := chunkFrom(r.URL.Query().Get("from"))
	if err != nil {
		writeError(w, err)
		return
	}
	idx, err := st.ChunkIndexes(ctx, session)
	if err != nil {
		writeError(w, trace.NotFound("recording %s not found", session))
		return
	}
	idx = chunksFrom(idx, from)
	if p.Role == RoleAdmin {
		a.auth.cfg.Audit.Emit(ctx, events.Event{Type: events.RecordingPlay, User: p.ID, Fields: events.Fields{
			events.FieldSessionID: session, events.FieldRole: p.Role, events.FieldMethod: "api",
		}})
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for _, i := range idx {
		c, err := st.GetChunk(ctx, session, i)
		if err != nil {
			a.log.WithError(err).WithField("session_id", session).Warn("Reading a recording chunk failed.")
			return
		}
		if err := enc.Encode(c); err != nil {
			return
		}
	}
	_ = bw.Flush()
}

// chunkFrom parses the from parameter ("" is 0).
func chunkFrom(v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, trace.BadParameter("from=%q is not a non-negative chunk number", v)
	}
	return n, nil
}

// chunksFrom drops the indexes below from (idx is ascending).
func chunksFrom(idx []int, from int) []int {
	for len(idx) > 0 && idx[0] < from {
		idx = idx[1:]
	}
	return idx
}

// PutRecordingChunk uploads one chunk (a node's identity, or a proxy's
// for its web terminals to OpenSSH nodes).
func (c *Client) PutRecordingChunk(ctx context.Context, session string, ch recording.Chunk) error {
	return trace.Wrap(c.do(ctx, http.MethodPut, "/v1/recordings/"+url.PathEscape(session)+"/chunks/"+strconv.Itoa(ch.Index), nil, ch, nil))
}

// LastRecordingChunk asks which chunk of session the cluster's store
// holds last (the identity that may upload it; NotFound when it holds none), so that
// an upload resumes after it.
func (c *Client) LastRecordingChunk(ctx context.Context, session string) (*recording.ChunkRef, error) {
	var out recording.ChunkRef
	if err := c.do(ctx, http.MethodGet, "/v1/recordings/"+url.PathEscape(session)+"/last", nil, nil, &out); err != nil {
		return nil, trace.Wrap(err)
	}
	return &out, nil
}

// ListRecordings lists the stored recordings' metadata.
func (c *Client) ListRecordings(ctx context.Context) ([]recording.Meta, error) {
	var out []recording.Meta
	return out, trace.Wrap(c.do(ctx, http.MethodGet, "/v1/recordings", nil, nil, &out))
}

// GetRecording reads every chunk of a recording, calling fn for each in
// order (the answer is streamed; nothing is held but the current chunk).
// It is bounded by ctx only: a long recording may take longer than one
// API call's timeout.
func (c *Client) GetRecording(ctx context.Context, session string, fn func(recording.Chunk) error) error {
	return trace.Wrap(c.GetRecordingFrom(ctx, session, 0, fn))
}

// GetRecordingFrom is GetRecording from chunk from on. fn returning an
// error stops the stream (the response body is closed unread).
func (c *Client) GetRecordingFrom(ctx context.Context, session string, from int, fn func(recording.Chunk) error) error {
	path := "/v1/recordings/" + url.PathEscape(session)
	newReq := func(ctx context.Context, base string) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path+"?from="+strconv.Itoa(from), nil)
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
	// Opening the stream fails over like any call; a stream that breaks
	// midway is not restarted here (fn has seen part of it).
	if err := c.send(ctx, http.MethodGet, path, 0, newReq, handle); err != nil {
		return trace.Wrap(err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for dec.More() {
		var ch recording.Chunk
		if err := dec.Decode(&ch); err != nil {
			return trace.ConnectionProblem(err, "reading recording %s: %v", session, err)
		}
		if err := fn(ch); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}

// ListRecordings lists the stored recordings.
func (s *Server) ListRecordings(ctx context.Context) ([]recording.Meta, error) {
	st, err := s.recordings()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	list, err := st.List(ctx)
	return list, trace.Wrap(err)
}

// GetRecording calls fn with each stored chunk of session, in order.
func (s *Server) GetRecording(ctx context.Context, session string, fn func(recording.Chunk) error) error {
	return trace.Wrap(s.GetRecordingFrom(ctx, session, 0, fn))
}

// GetRecordingFrom calls fn with each stored chunk of session from chunk
// from on, in order, reading one at a time; an error from fn stops it.
func (s *Server) GetRecordingFrom(ctx context.Context, session string, from int, fn func(recording.Chunk) error) error {
	if from < 0 {
		return trace.BadParameter("chunk %d: want a non-negative chunk number", from)
	}
	st, err := s.recordings()
	if err != nil {
		return trace.Wrap(err)
	}
	if err := recording.CheckSessionID(session); err != nil {
		return trace.Wrap(err)
	}
	idx, err := st.ChunkIndexes(ctx, session)
	if err != nil {
		return trace.NotFound("recording %s not found", session)
	}
	for _, i := range chunksFrom(idx, from) {
		c, err := st.GetChunk(ctx, session, i)
		if err != nil {
			return trace.Wrap(err)
		}
		if err := fn(*c); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}

// RecordingWriter is the identity uploading a recording: a node, or a
// proxy recording its web terminals to OpenSSH nodes.
type RecordingWriter struct {
	ID   string
	Role string
}

// mayWrite decides whether caller may write the recording whose header is
// h. A node writes the sessions it ran (h.Node is its UUID). A proxy
// writes only sessions of this cluster whose node is a kind openssh
// record: a Postern node records its own sessions, and a proxy that could
// write one could forge it. Anything else is refused (deny by default).
func (s *Server) mayWrite(ctx context.Context, caller RecordingWriter, h *recording.Header) error {
	switch caller.Role {
	case RoleNode:
		if h.Node != caller.ID {
			return trace.AccessDenied("node %q may not upload the recording of a session on node %q", caller.ID, h.Node)
		}
		return nil
	case RoleProxy:
		if h.Cluster != s.cfg.ClusterName {
			return trace.Wrap(s.mayWriteLeaf(ctx, caller, h))
		}
		nodes, err := s.store.GetNodes(ctx, s.cfg.ClusterName)
		if err != nil {
			return trace.Wrap(err)
		}
		for _, n := range nodes {
			if n.UUID != h.Node {
				continue
			}
			if n.IsOpenSSH() {
				return nil
			}
			return trace.AccessDenied("proxy %q may not upload the recording of a session on Postern node %q: the node records its own sessions", caller.ID, h.Node)
		}
		return trace.AccessDenied("proxy %q may not upload the recording of a session on node %q: no OpenSSH node of cluster %q has that id", caller.ID, h.Node, s.cfg.ClusterName)
	}
	return trace.AccessDenied("a %s identity may not upload session recordings", caller.Role)
}

// mayWriteLeaf decides a proxy's upload of a session in another cluster:
// a root proxy's web terminal to an OpenSSH node of one of this
// cluster's leaves, which the root proxy records and this cluster stores
// (lib/web's startRecording says why). This cluster knows none of a
// leaf's nodes, so it checks that the cluster is a leaf of its own; it
// stores no other recording of a leaf's sessions (a leaf's Postern nodes
// upload to the leaf's auth), so such an upload cannot overwrite or pass
// for a node's own recording.
func (s *Server) mayWriteLeaf(ctx context.Context, caller RecordingWriter, h *recording.Header) error {
	denied := trace.AccessDenied("proxy %q may not upload the recording of a session in cluster %q", caller.ID, h.Cluster)
	if h.Cluster == "" || h.Node == "" {
		return denied
	}
	rcs, err := s.store.GetRemoteClusters(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	for _, rc := range rcs {
		if rc.Name == h.Cluster {
			return nil
		}
	}
	return denied
}
