package web

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
)

// Session recordings in the browser. The player (asciinema-player's
// segmented source) never downloads a whole recording: it reads a small
// index (GET .../index: duration, markers, the start time of each
// segment, a segment being one or a few stored chunks) and then the
// segment it plays or seeks into (GET .../segments/N), whose snapshot
// rebuilds the screen at the segment's start from a bounded stretch of
// the output before it (recording.SeekIndex.WarmupStart). Seeking to 90%
// of a 100 MB recording reads one segment and its warm-up, a few MB.
//
// Who may watch is lib/authz's CanViewRecording, the rule of psh play:
// a recording the user may not see answers exactly like one that does not
// exist (404), and the refusal is audited. Opening a recording (its index
// or the whole cast) is a recording.play audit event.

// RecordingSource reads stored recordings: the auth server in-process or
// the auth API client (both implement it).
type RecordingSource interface {
	ListRecordings(ctx context.Context) ([]recording.Meta, error)
	// GetRecordingFrom calls fn with each chunk from chunk from on; an
	// error from fn stops the stream.
	GetRecordingFrom(ctx context.Context, session string, from int, fn func(recording.Chunk) error) error
}

// recordingIndexCacheSize bounds the recordings whose seek index is kept
// (an index is a few hundred bytes per chunk: ~100 KiB for 100 MB).
const recordingIndexCacheSize = 64

// warmupBytes is the warm-up budget of a segment's snapshot (a variable
// so that tests can make it small).
var warmupBytes = recording.DefaultWarmupBytes

// errStopStream ends a chunk stream early (not an error).
var errStopStream = errors.New("stop")

func errRecordingNotFound(id string) error {
	return trace.NotFound("recording %q not found", id)
}

// recIndexEntry is one recording's summaries, extended as chunks arrive
// until the final one.
type recIndexEntry struct {
	mu     sync.Mutex
	header *recording.Header
	sums   []recording.ChunkSummary
	// check follows the hash chain over the summarised chunks (the
	// player shows its verdict). hashes are the stored hashes by index
	// and sealed the chain hash each chunk's bytes gave then: a segment's
	// chunks, read again, are checked against them, so that a chunk
	// changed in the store after the index was built (and its verdict
	// cached) is not served under that verdict.
	check  recording.Checker
	hashes []string
	sealed []string
	final  bool
	used   time.Time
}

// seal notes chunk c as summarised.
func (e *recIndexEntry) seal(c recording.Chunk) {
	e.sealed = append(e.sealed, e.chainOf(c))
	e.hashes = append(e.hashes, c.Hash)
}

func (e *recIndexEntry) chainOf(c recording.Chunk) string {
	prev := ""
	if c.Index > 0 && c.Index <= len(e.hashes) {
		prev = e.hashes[c.Index-1]
	}
	h, _ := recording.ChainHash(prev, c.Data)
	return h
}

// unchanged reports whether chunk c, read again for a segment, is the
// chunk the index was built from.
func (e *recIndexEntry) unchanged(c recording.Chunk) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return c.Index < len(e.sealed) && e.hashes[c.Index] == c.Hash && e.chainOf(c) == e.sealed[c.Index]
}

type recIndexCache struct {
	mu      sync.Mutex
	entries map[string]*recIndexEntry
}

func (c *recIndexCache) entry(session string, now time.Time) *recIndexEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[string]*recIndexEntry{}
	}
	e := c.entries[session]
	if e == nil {
		if len(c.entries) >= recordingIndexCacheSize {
			var oldest string
			var at time.Time
			for k, v := range c.entries {
				if oldest == "" || v.used.Before(at) {
					oldest, at = k, v.used
				}
			}
			delete(c.entries, oldest)
		}
		e = &recIndexEntry{}
		c.entries[session] = e
	}
	e.used = now
	return e
}

// forget drops session's entry whatever it holds: its chunks changed in
// the store, the next read rebuilds it (and its verdict) from them.
func (c *recIndexCache) forget(session string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, session)
}

// drop forgets session (asked for but not stored: guessed ids must not
// push real recordings out of the cache).
func (c *recIndexCache) drop(session string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[session]; e != nil && e.mu.TryLock() {
		if e.header == nil {
			delete(c.entries, session)
		}
		e.mu.Unlock()
	}
}

// recordingSource returns the source or answers 501.
func (s *Server) recordingSource(w http.ResponseWriter) RecordingSource {
	src := s.cfg.WebSessions.Recordings
	if src == nil {
		writeError(w, http.StatusNotImplemented, "this proxy does not serve recordings")
	}
	return src
}

// seekIndex brings session's index up to date: the chunks stored since
// the last call are read and summarised (all of them the first time).
func (s *Server) seekIndex(ctx context.Context, src RecordingSource, session string) (*recording.SeekIndex, *recIndexEntry, error) {
	e := s.web.recIndex.entry(session, s.cfg.Clock.Now())
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.final {
		err := src.GetRecordingFrom(ctx, session, len(e.sums), func(c recording.Chunk) error {
			if c.Index != len(e.sums) {
				// A gap: the player plays up to it, the verdict names it.
				e.check.Add(c)
				return errStopStream
			}
			e.check.Add(c)
			sum, h, err := recording.SummarizeChunk(c)
			if err != nil {
				if e.check.Result("").State == recording.CheckTampered {
					// Past the break and unreadable: the player plays up
					// to it, the verdict says why.
					return errStopStream
				}
				return trace.Wrap(err)
			}
			if h != nil {
				e.header = h
			}
			e.sums = append(e.sums, sum)
			e.seal(c)
			e.final = c.Final
			return nil
		})
		if err != nil && !errors.Is(err, errStopStream) {
			return nil, nil, trace.Wrap(err)
		}
	}
	if e.header == nil {
		return nil, nil, errRecordingNotFound(session)
	}
	ix, err := recording.BuildSeekIndex(*e.header, e.sums)
	return ix, e, trace.Wrap(err)
}

// recordingOwner is the user whose session a recording is: from the cached
// index, else from the first chunk alone (an RBAC check must not cost a
// whole recording's read).
func (s *Server) recordingOwner(ctx context.Context, src RecordingSource, session string) (string, error) {
	if err := recording.CheckSessionID(session); err != nil {
		return "", trace.Wrap(err)
	}
	e := s.web.recIndex.entry(session, s.cfg.Clock.Now())
	e.mu.Lock()
	if e.header != nil {
		defer e.mu.Unlock()
		return e.header.User, nil
	}
	e.mu.Unlock()
	var owner string
	err := src.GetRecordingFrom(ctx, session, 0, func(c recording.Chunk) error {
		if c.Index == 0 {
			h, err := recording.HeaderOf(c.Data)
			if err != nil {
				return trace.Wrap(err)
			}
			owner = h.User
		}
		return errStopStream
	})
	if err != nil && !errors.Is(err, errStopStream) {
		if trace.IsNotFound(err) {
			s.web.recIndex.drop(session)
			return "", errRecordingNotFound(session)
		}
		return "", trace.Wrap(err)
	}
	if owner == "" {
		s.web.recIndex.drop(session)
		return "", errRecordingNotFound(session)
	}
	return owner, nil
}

// authorizeRecording resolves the user and checks they may see the
// recording named by the path; ok is false when the answer has been
// written (404 for a recording they may not see, audited).
func (s *Server) authorizeRecording(w http.ResponseWriter, r *http.Request, live *liveSession) (src RecordingSource, id *authz.Identity, session string, ok bool) {
	if src = s.recordingSource(w); src == nil {
		return nil, nil, "", false
	}
	log := s.cfg.Logger.WithField("user", live.user)
	id, err := s.identity(r.Context(), live)
	if err != nil {
		internalError(w, log, "Could not resolve a web session's roles.", err)
		return nil, nil, "", false
	}
	session = r.PathValue("id")
	if err := recording.CheckSessionID(session); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return nil, nil, "", false
	}
	owner, err := s.recordingOwner(r.Context(), src, session)
	if err != nil {
		if trace.IsNotFound(err) {
			writeError(w, http.StatusNotFound, errRecordingNotFound(session).Error())
			return nil, nil, "", false
		}
		internalError(w, log, "Could not read a recording.", err)
		return nil, nil, "", false
	}
	if !id.CanViewRecording(owner) {
		s.cfg.WebSessions.Audit.Emit(r.Context(), events.Event{Type: events.AccessDenied, User: live.user, Fields: events.Fields{
			events.FieldMethod: auditMethod, events.FieldKind: "recording", events.FieldSessionID: session,
			events.FieldRemoteAddr: r.RemoteAddr,
			events.FieldReason:     "not the user's recording and no review_recordings role",
		}})
		writeError(w, http.StatusNotFound, errRecordingNotFound(session).Error())
		return nil, nil, "", false
	}
	return src, id, session, true
}

func (s *Server) emitPlay(r *http.Request, live *liveSession, session, what string) {
	s.cfg.WebSessions.Audit.Emit(r.Context(), events.Event{Type: events.RecordingPlay, User: live.user, Fields: events.Fields{
		events.FieldSessionID: session, events.FieldMethod: auditMethod, events.FieldKind: what,
		events.FieldRemoteAddr: r.RemoteAddr,
	}})
}

// listRecordings serves GET /webapi/recordings[?user=U&node=N&since=24h&id=ID]:
// the recordings the user may see (their own; all with
// review_recordings), newest first.
func (s *Server) listRecordings(w http.ResponseWriter, r *http.Request, live *liveSession) {
	src := s.recordingSource(w)
	if src == nil {
		return
	}
	log := s.cfg.Logger.WithField("user", live.user)
	q := r.URL.Query()
	var since time.Time
	if v := q.Get("since"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			writeError(w, http.StatusBadRequest, "since="+strconv.Quote(v)+": want a positive duration such as 24h")
			return
		}
		since = s.cfg.Clock.Now().Add(-d)
	}
	id, err := s.identity(r.Context(), live)
	if err != nil {
		internalError(w, log, "Could not resolve a web session's roles.", err)
		return
	}
	list, err := src.ListRecordings(r.Context())
	if err != nil {
		internalError(w, log, "Could not list recordings.", err)
		return
	}
	out := []webapi.RecordingItem{}
	for i := len(list) - 1; i >= 0; i-- {
		m := list[i]
		if !id.CanViewRecording(m.User) {
			continue
		}
		started := time.Unix(m.Timestamp, 0).UTC()
		if sid := q.Get("id"); sid != "" && m.SessionID != sid {
			continue
		}
		if user := q.Get("user"); user != "" && m.User != user {
			continue
		}
		if node := q.Get("node"); node != "" && m.Node != node && m.NodeHostname != node {
			continue
		}
		if !since.IsZero() && started.Before(since) {
			continue
		}
		out = append(out, webapi.RecordingItem{
			SessionID: m.SessionID, Started: started, User: m.User, Login: m.Login,
			Node: m.Node, NodeHostname: m.NodeHostname, Command: m.Command,
			Complete: m.Complete, Chunks: m.Chunks, Cols: m.Width, Rows: m.Height,
		})
	}
	writeJSON(w, http.StatusOK, webapi.RecordingsResponse{Items: out})
}

// recordingIndex serves GET /webapi/recordings/{id}/index, the
// asciinema-player segmented index (version 1) with Postern's fields.
func (s *Server) recordingIndex(w http.ResponseWriter, r *http.Request, live *liveSession) {
	src, _, session, ok := s.authorizeRecording(w, r, live)
	if !ok {
		return
	}
	ix, e, err := s.seekIndex(r.Context(), src, session)
	if err != nil {
		s.writeRecordingError(w, live, session, err)
		return
	}
	if len(ix.Segments) == 0 {
		writeError(w, http.StatusConflict, "recording "+session+" has no events yet")
		return
	}
	s.emitPlay(r, live, session, "web player")
	e.mu.Lock()
	check, final := e.check.Result(""), e.final
	e.mu.Unlock()
	resp := webapi.RecordingIndex{
		Version: 1, Duration: ix.Duration,
		Term:     webapi.RecordingTerm{Cols: ix.Header.Width, Rows: ix.Header.Height},
		Markers:  make([]webapi.RecordingMarker, 0, len(ix.Markers)),
		Segments: make([]webapi.RecordingSegmentRef, len(ix.Segments)),
		Postern: webapi.RecordingInfo{
			SessionID: session, User: ix.Header.User, Login: ix.Header.Login,
			Node: ix.Header.Node, NodeHostname: ix.Header.NodeHostname, Command: ix.Header.Command,
			Started: time.Unix(ix.Header.Timestamp, 0).UTC(), Complete: final, Chunks: len(ix.Chunks),
		},
	}
	resp.Postern.Verification = verificationOf(check)
	if err := check.Err(); err != nil {
		resp.Postern.Integrity = err.Error()
	}
	resp.Markers = append(resp.Markers, markersOf(ix, check)...)
	for i, seg := range ix.Segments {
		// last pins the segment's end to this index: a recording still
		// being written grows, and the player checks a segment against
		// the duration it was told.
		resp.Segments[i] = webapi.RecordingSegmentRef{Start: seg.Start, URL: "segments/" + strconv.Itoa(i) + "?last=" + strconv.Itoa(seg.LastChunk)}
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, resp)
}

// recordingMarkers serves GET /webapi/recordings/{id}/markers: the
// markers (exec command, sftp, agent, exit status) for the player page's
// list, and the verdict on the hash chain for its banner. Like the listing it is metadata, not a play: the player's read of
// the index is the audited play.
func (s *Server) recordingMarkers(w http.ResponseWriter, r *http.Request, live *liveSession) {
	src, _, session, ok := s.authorizeRecording(w, r, live)
	if !ok {
		return
	}
	ix, e, err := s.seekIndex(r.Context(), src, session)
	if err != nil {
		s.writeRecordingError(w, live, session, err)
		return
	}
	e.mu.Lock()
	check := e.check.Result("")
	e.mu.Unlock()
	writeJSON(w, http.StatusOK, webapi.RecordingMarkers{Markers: markersOf(ix, check), Verification: verificationOf(check)})
}

// brokenMarkerPrefix starts the marker put where a recording's hash chain
// breaks (psh play marks the same place).
const brokenMarkerPrefix = "NOT VERIFIED from here on: "

// markersOf are the recording's markers and, for a tampered one, a
// marker where the chain stops vouching for it, so that the timeline
// shows the point.
func markersOf(ix *recording.SeekIndex, check recording.Check) []webapi.RecordingMarker {
	out := make([]webapi.RecordingMarker, 0, len(ix.Markers)+1)
	broken := check.State == recording.CheckTampered
	for _, m := range ix.Markers {
		if broken && m.Time > check.Until {
			out = append(out, brokenMarker(check))
			broken = false
		}
		out = append(out, webapi.RecordingMarker{Time: m.Time, Label: m.Label})
	}
	if broken {
		out = append(out, brokenMarker(check))
	}
	return out
}

func brokenMarker(check recording.Check) webapi.RecordingMarker {
	return webapi.RecordingMarker{Time: check.Until, Label: fmt.Sprintf("%sthe hash chain breaks at chunk %d (%s)", brokenMarkerPrefix, check.BrokenChunk, check.Problem)}
}

func verificationOf(c recording.Check) webapi.RecordingVerification {
	v := webapi.RecordingVerification{
		State: c.State, Chunks: c.Chunks, Bytes: c.Bytes, Until: c.Until, Audited: c.Audited,
		Problem: c.Problem, Reason: c.Reason, Summary: c.Summary(),
	}
	if c.State == recording.CheckTampered {
		v.BrokenChunk = &c.BrokenChunk
	}
	return v
}

func (s *Server) writeRecordingError(w http.ResponseWriter, live *liveSession, session string, err error) {
	switch {
	case trace.IsNotFound(err):
		writeError(w, http.StatusNotFound, errRecordingNotFound(session).Error())
	case trace.IsBadParameter(err):
		writeError(w, http.StatusUnprocessableEntity, "recording "+session+" is damaged: "+trace.UserMessage(err)+" (pctl recordings verify says more)")
	default:
		internalError(w, s.cfg.Logger.WithField("user", live.user), "Could not read a recording.", err)
	}
}

// recordingSegment serves GET /webapi/recordings/{id}/segments/{n}: the
// snapshot that rebuilds the screen at the segment's start and the
// segment's events, streamed as they are read. Only the segment's chunks
// and its warm-up are read.
func (s *Server) recordingSegment(w http.ResponseWriter, r *http.Request, live *liveSession) {
	src, _, session, ok := s.authorizeRecording(w, r, live)
	if !ok {
		return
	}
	n, err := strconv.Atoi(r.PathValue("n"))
	if err != nil || n < 0 {
		writeError(w, http.StatusBadRequest, "segment "+strconv.Quote(r.PathValue("n"))+" is not a segment number")
		return
	}
	ix, e, err := s.seekIndex(r.Context(), src, session)
	if err != nil {
		s.writeRecordingError(w, live, session, err)
		return
	}
	if n >= len(ix.Segments) {
		writeError(w, http.StatusNotFound, "recording "+session+" has no segment "+strconv.Itoa(n))
		return
	}
	seg := ix.Segments[n]
	if v := r.URL.Query().Get("last"); v != "" {
		last, err := strconv.Atoi(v)
		if err != nil || last < seg.FirstChunk {
			writeError(w, http.StatusBadRequest, "last="+strconv.Quote(v)+" is not a chunk of segment "+strconv.Itoa(n))
			return
		}
		seg.LastChunk = min(seg.LastChunk, last)
	}
	warm := ix.WarmupStart(n, warmupBytes)
	var init strings.Builder
	var bw *bufio.Writer
	events := 0
	err = src.GetRecordingFrom(r.Context(), session, warm, func(c recording.Chunk) error {
		if c.Index > seg.LastChunk {
			return errStopStream
		}
		if !e.unchanged(c) {
			s.web.recIndex.forget(session)
			return trace.BadParameter("chunk %d changed in the store since the player's index was built; reload the player to see the verdict on it", c.Index)
		}
		b, err := recording.DecodeChunk(c.Data)
		if err != nil {
			return trace.Wrap(err)
		}
		_, lines, err := recording.ChunkLines(b, c.Index == 0)
		if err != nil {
			return trace.Wrap(err)
		}
		if c.Index < seg.FirstChunk {
			for _, l := range lines {
				switch l.Code {
				case "r":
					init.Reset()
				case "o":
					d, err := recording.EventData(l.Raw)
					if err != nil {
						return trace.Wrap(err)
					}
					init.WriteString(d)
				}
			}
			return nil
		}
		if bw == nil {
			// The warm-up is complete: the header can go out.
			snap := init.String()
			if warm > 0 && ix.Chunks[warm].Cols == 0 {
				// The warm-up starts mid-stream: from its first line on,
				// not inside an escape sequence.
				if i := strings.IndexByte(snap, '\n'); i >= 0 {
					snap = snap[i+1:]
				}
			}
			head, err := json.Marshal(webapi.RecordingSnapshot{Cols: seg.Cols, Rows: seg.Rows, Init: snap})
			if err != nil {
				return trace.Wrap(err)
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusOK)
			bw = bufio.NewWriterSize(w, 64<<10)
			bw.WriteString(`{"snapshot":`)
			bw.Write(head)
			bw.WriteString(`,"events":[`)
		}
		for _, l := range lines {
			if events > 0 {
				bw.WriteByte(',')
			}
			bw.Write(l.Raw)
			events++
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStopStream) {
		if bw == nil {
			s.writeRecordingError(w, live, session, err)
			return
		}
		// Mid-answer: the JSON is left unterminated, which the player
		// reports as a failed segment.
		s.cfg.Logger.WithError(err).WithField("session_id", session).Warn("Reading a recording segment failed.")
		return
	}
	if bw == nil {
		writeError(w, http.StatusNotFound, "recording "+session+" has no segment "+strconv.Itoa(n))
		return
	}
	bw.WriteString("]}\n")
	_ = bw.Flush()
}

// recordingCast serves GET /webapi/recordings/{id}/cast: the whole
// asciicast v2 file (the export), streamed chunk by chunk.
func (s *Server) recordingCast(w http.ResponseWriter, r *http.Request, live *liveSession) {
	src, _, session, ok := s.authorizeRecording(w, r, live)
	if !ok {
		return
	}
	s.emitPlay(r, live, session, "export")
	started := false
	var tail recording.ExportTail
	err := src.GetRecordingFrom(r.Context(), session, 0, func(c recording.Chunk) error {
		b, err := recording.DecodeChunk(c.Data)
		if err != nil {
			return trace.Wrap(err)
		}
		tail.Add(c, b)
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-asciicast")
			w.Header().Set("Content-Disposition", `attachment; filename="`+session+`.cast"`)
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusOK)
		}
		_, err = w.Write(b)
		return trace.Wrap(err)
	})
	if err != nil && !started {
		s.writeRecordingError(w, live, session, err)
		return
	}
	if err != nil {
		s.cfg.Logger.WithError(err).WithField("session_id", session).Warn("Streaming a recording failed.")
		return
	}
	_ = tail.Finish(w)
}
