package recording

// One session's pass: shipping its closed chunks in order, and resuming
// from what the store holds when auth refuses one (uploader.go schedules
// the passes).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/gravitational/trace"
)

// flushSession ships a session's chunks in order from s.next on: chunk
// files (an older node's spool) are deleted one by one once auth has
// them; segments are read on from where the last pass stopped and
// deleted once auth has all of them and the writer has moved on to a
// later segment (or the final chunk is shipped, which removes the
// session). A session whose writer is gone (spool.go, lockName) is
// removed once all of it is shipped.
func (u *Uploader) flushSession(ctx context.Context, s *sessionState) error {
	session := s.name
	// Whether the writer is gone is asked before the files are listed:
	// a writer that appends its final chunk and releases its lock while
	// this pass ships the earlier ones has left a chunk this pass never
	// read, and asked afterwards "gone" would remove it unshipped. Gone
	// before the listing, everything it wrote is in the files listed.
	lock, gone := u.cfg.Spool.writerGone(session)
	if gone {
		defer lock.Close()
	}
	chunks, segs, err := u.cfg.Spool.sessionFiles(session)
	if trace.IsNotFound(err) {
		u.forget(s)
		return nil
	}
	if err != nil {
		return trace.Wrap(err)
	}
	done := func() {
		// Nothing follows a final chunk: the session is done here.
		_ = os.RemoveAll(filepath.Join(u.cfg.Spool.Dir, session))
		u.forget(s)
	}
	if !s.resumed {
		// The first pass of this run: start from what the store holds
		// (an earlier run, or another auth server sharing the store,
		// may have stored more than this node knows).
		if err := u.resume(ctx, s, -1, nil); err != nil {
			if errors.Is(err, errStoredFinal) {
				done()
				return nil
			}
			return trace.Wrap(err)
		}
	}
	// ship puts c, or learns from the store that it need not.
	ship := func(c Chunk) error {
		err := u.cfg.Upload.PutRecordingChunk(ctx, session, c)
		if err == nil {
			s.next = c.Index + 1
			return nil
		}
		if !isRefusal(err) || ctx.Err() != nil {
			return trace.Wrap(err, "uploading chunk %d of %s", c.Index, session)
		}
		return trace.Wrap(u.resume(ctx, s, c.Index, err))
	}

	for _, i := range chunks {
		if i >= s.next {
			c, err := u.cfg.Spool.GetChunk(ctx, session, i)
			if err != nil {
				return trace.Wrap(err)
			}
			if err := ship(*c); errors.Is(err, errStoredFinal) {
				done()
				return nil
			} else if err != nil {
				return trace.Wrap(err)
			}
			if c.Final {
				done()
				return nil
			}
		}
		// Stored (shipped now or before, or the store had it).
		if err := u.cfg.Spool.RemoveChunk(session, i); err != nil {
			return trace.Wrap(err)
		}
	}
	for k, first := range segs {
		if k < len(segs)-1 && segs[k+1] <= s.next {
			// All of it is stored (the writer has moved on); its removal
			// failed last time, or the store had it.
			_ = os.Remove(filepath.Join(u.cfg.Spool.Dir, session, segmentName(first)))
			continue
		}
		if s.cur == nil || s.cur.first != first {
			s.cur = &segmentReader{first: first}
		}
		cur := s.cur
		data, err := u.cfg.Spool.readSegmentFrom(session, first, cur.off)
		if err != nil {
			return trace.Wrap(err)
		}
		final := false
		n, err := wholeLines(data, func(line []byte) error {
			if i, ok := recordIndex(line); ok && i < s.next {
				cur.off += int64(len(line)) + 1
				return nil
			}
			var c Chunk
			if err := json.Unmarshal(line, &c); err != nil {
				return hold(RefusedChunk, trace.BadParameter("spooled segment %s of %s is unreadable at byte %d: %v", segmentName(first), session, cur.off, err))
			}
			if c.Index < s.next {
				cur.off += int64(len(line)) + 1
				return nil
			}
			if err := ship(c); err != nil {
				return trace.Wrap(err)
			}
			cur.off += int64(len(line)) + 1
			final = final || c.Final
			return nil
		})
		if errors.Is(err, errStoredFinal) {
			done()
			return nil
		}
		if err != nil {
			return trace.Wrap(err)
		}
		if final {
			done()
			return nil
		}
		if k < len(segs)-1 {
			// The writer has moved on: nothing more comes to this one
			// (a torn tail can only be the last segment's).
			if n < len(data) {
				u.cfg.Logger.WithField("session_id", session).Warnf("Spooled segment %s ends in a torn chunk; skipped.", segmentName(first))
			}
			if err := os.Remove(filepath.Join(u.cfg.Spool.Dir, session, segmentName(first))); err != nil {
				return trace.ConvertSystemError(err)
			}
		}
	}
	if gone {
		// A dead writer's session (a killed node's, found after its
		// restart): all it spooled is shipped, and nothing more will come
		// (the recording stays incomplete).
		done()
	}
	return nil
}

// resume asks auth what the store holds of s and moves s.next there.
// refused is the chunk auth just refused (with why), or -1 on a
// session's first pass. It returns nil to go on from s.next (chunks
// below it are skipped as stored), errRewind to start the pass again
// from a chunk the spool still has, errStoredFinal when the store holds
// the whole recording, or a heldError when the session cannot go on:
//
//   - the store holds chunks below the refused one that the spool no
//     longer has (RefusedGap): they were acknowledged by an auth server
//     whose store this one does not share. The store's recording stays
//     what it is (chunks 0 to s.next-1, no final chunk: read as
//     incomplete, Verify's Complete false, an export ends with
//     IncompleteMarker), and the rest stays in the spool. Shipping it
//     past the gap would make every reader call the recording tampered
//     (a missing chunk) and would need auth to take chunks it cannot
//     chain to the stored ones; offered again every MaxRetryInterval,
//     it completes if the node's client returns to the auth server whose
//     store has the missing chunks;
//   - the store's chunk differs from the spool's of the same index
//     (RefusedConflict);
//   - auth refuses the very chunk that follows what the store holds
//     (RefusedChunk: not this node's session, a broken chain, bad data).
func (u *Uploader) resume(ctx context.Context, s *sessionState, refused int, why error) error {
	session := s.name
	ref, err := u.cfg.Upload.LastRecordingChunk(ctx, session)
	next := 0
	switch {
	case trace.IsNotFound(err):
		ref = nil
	case err != nil:
		if why != nil {
			return trace.Wrap(err, "chunk %d of %s was refused (%v); asking what the store holds", refused, session, why)
		}
		return trace.Wrap(err, "asking what the store holds of %s", session)
	default:
		next = ref.Index + 1
	}
	have, err := u.cfg.Spool.ChunkIndexes(ctx, session)
	if err != nil && !trace.IsNotFound(err) {
		return trace.Wrap(err)
	}
	spooled := func(i int) bool {
		k := sort.SearchInts(have, i)
		return k < len(have) && have[k] == i
	}
	if ref != nil && (spooled(ref.Index) || (len(have) > 0 && ref.Index >= have[0])) {
		// The chain hash names everything up to it: equal, the store
		// holds the spool's chunks 0..ref.Index, and those may be
		// skipped and deleted. A stored chunk the spool should have and
		// has not (the store is ahead of the spool) proves nothing.
		c, err := u.cfg.Spool.GetChunk(ctx, session, ref.Index)
		if err != nil && !trace.IsNotFound(err) {
			return trace.Wrap(err)
		}
		if err != nil || c.Hash != ref.Hash {
			return hold(RefusedConflict, trace.AlreadyExists("the store's chunk %d of %s is not the spooled one", ref.Index, session))
		}
	}
	if ref != nil && ref.Final {
		if len(have) > 0 && have[len(have)-1] > ref.Index {
			return hold(RefusedConflict, trace.AlreadyExists("the store holds %s complete at chunk %d; the spool has chunks after it", session, ref.Index))
		}
		return errStoredFinal
	}
	s.resumed = true
	switch {
	case refused < 0:
		// The first pass: skip what the store has. When the spool begins
		// after the store ends, shipping finds whether auth takes it.
		s.next = max(s.next, next)
		return nil
	case next == refused:
		// The store is where the chunk belongs, yet auth refuses it.
		return hold(RefusedChunk, why)
	case next > refused:
		// The store has it (and the spool's copy, by the hash): skip.
		s.next = max(s.next, next)
		return nil
	case spooled(next):
		// The store lacks chunks that the spool still has: ship them
		// again, from the first one it lacks.
		s.next, s.cur = next, nil
		return errRewind
	default:
		msg := fmt.Sprintf("the store holds chunks 0-%d of %s; the spool starts at chunk %d: the chunks between went to an auth server whose store this one does not share (the stored recording reads as incomplete)", next-1, session, refused)
		if len(have) > 0 {
			msg = fmt.Sprintf("the store holds chunks 0-%d of %s; the spool starts at chunk %d: the chunks between went to an auth server whose store this one does not share (the stored recording reads as incomplete)", next-1, session, have[0])
		}
		if next == 0 {
			msg = fmt.Sprintf("the store holds nothing of %s; the spool does not have its first chunk: the chunks before chunk %d went to an auth server whose store this one does not share", session, refused)
		}
		return hold(RefusedGap, trace.NotFound("%s (chunk %d: %v)", msg, refused, why))
	}
}
