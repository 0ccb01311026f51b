package recording

import (
	"fmt"

	"github.com/gravitational/trace"
)

// Verdicts of a Check. Incomplete is not tampering: a recording without
// its final chunk is what a session still running, or a node that died
// mid-session, leaves; nothing in the chain says anything was removed.
// Only the audited final hash can tell a cut tail from a dead node, and
// with it a missing final chunk is Tampered (ProblemTruncated).
const (
	CheckVerified   = "verified"
	CheckIncomplete = "incomplete"
	CheckTampered   = "tampered"
)

// Problems a Tampered check names.
const (
	// ProblemHashMismatch: a chunk's stored hash does not follow from the
	// chunk before it and its own bytes (a byte of it, or of its hash,
	// was changed).
	ProblemHashMismatch = "hash mismatch"
	// ProblemMissingChunk: a gap in the chunk indexes (a chunk deleted).
	ProblemMissingChunk = "missing chunk"
	// ProblemUndecodable: the chain holds but the chunk is not whole
	// asciicast lines (never written by a node).
	ProblemUndecodable = "undecodable chunk"
	// ProblemAfterFinal: chunks follow the one marked final.
	ProblemAfterFinal = "chunk after the final one"
	// ProblemTruncated: the chain ends without its final chunk although
	// session.end audited one (the tail was cut).
	ProblemTruncated = "truncated"
	// ProblemRewritten: the chain is whole but ends in another hash than
	// the audited one (chunks rewritten with their hashes).
	ProblemRewritten = "final hash mismatch"
)

// Check is what Checker found in a recording.
type Check struct {
	// State is CheckVerified, CheckIncomplete or CheckTampered.
	State string
	// Chunks and Bytes are the chunks that check out, from chunk 0 on,
	// and the asciicast bytes they hold (the prefix of the export that
	// the chain vouches for).
	Chunks int
	Bytes  int64
	// Until is the time (seconds into the session) of the last event in
	// those chunks: where a tampered recording stops being vouched for.
	Until float64
	// FinalHash is the chain hash of the last chunk that checks out.
	FinalHash string
	// Audited is true when the chain was checked against the final hash
	// of the session.end audit event.
	Audited bool
	// BrokenChunk is the first chunk that does not check out (Tampered
	// only); Problem says how, Reason says it in a sentence.
	BrokenChunk int
	Problem     string
	Reason      string
}

// Summary is the one line a person reads before playing: what was
// verified, or where and how the chain breaks.
func (c Check) Summary() string {
	against := "not checked against the session.end audit event (pctl recordings verify does)"
	if c.Audited {
		against = "matching the final hash of the session.end audit event"
	}
	switch c.State {
	case CheckVerified:
		return fmt.Sprintf("verified: hash chain intact over %d chunks (%d bytes, complete), %s; recordings are not signed by the node", c.Chunks, c.Bytes, against)
	case CheckIncomplete:
		return fmt.Sprintf("INCOMPLETE, not tampered: hash chain intact over %d chunks (%d bytes, up to %.1fs) but there is no final chunk (the session is still running, or its node stopped before the session ended), %s", c.Chunks, c.Bytes, c.Until, against)
	default:
		return fmt.Sprintf("NOT VERIFIED, TAMPERED: the hash chain breaks at chunk %d (%s, at byte %d, %.1fs into the session): %s", c.BrokenChunk, c.Problem, c.Bytes, c.Until, c.Reason)
	}
}

// Err is nil unless the recording is tampered.
func (c Check) Err() error {
	if c.State != CheckTampered {
		return nil
	}
	return trace.BadParameter("chunk %d: %s", c.BrokenChunk, c.Reason)
}

// Checker verifies a recording chunk by chunk, as it is streamed, so that
// a long one is never held whole. Chunks must come in index order (the
// order every reader streams them in).
type Checker struct {
	next   int
	prev   string
	final  bool
	res    Check
	broken bool
}

// Add checks the next chunk. It returns the chunk's asciicast bytes when
// the chunk checks out, nil once the chain is broken (at this chunk or
// before).
func (k *Checker) Add(c Chunk) []byte {
	if k.broken {
		return nil
	}
	switch {
	case c.Index != k.next:
		k.fail(k.next, ProblemMissingChunk, fmt.Sprintf("chunk %d is missing (the next stored chunk is %d)", k.next, c.Index))
		return nil
	case k.final:
		k.fail(c.Index, ProblemAfterFinal, fmt.Sprintf("chunk %d follows chunk %d, which is marked final", c.Index, c.Index-1))
		return nil
	}
	got, err := ChainHash(k.prev, c.Data)
	if err != nil {
		k.fail(c.Index, ProblemHashMismatch, err.Error())
		return nil
	}
	if got != c.Hash {
		k.fail(c.Index, ProblemHashMismatch, fmt.Sprintf("its stored hash is %s, the chain says %s: the chunk was altered", c.Hash, got))
		return nil
	}
	b, err := DecodeChunk(c.Data)
	if err != nil {
		k.fail(c.Index, ProblemUndecodable, trace.UserMessage(err))
		return nil
	}
	if _, lines, err := ChunkLines(b, c.Index == 0); err != nil {
		k.fail(c.Index, ProblemUndecodable, trace.UserMessage(err))
		return nil
	} else if len(lines) > 0 {
		k.res.Until = lines[len(lines)-1].Time
	}
	k.prev, k.final = got, c.Final
	k.next++
	k.res.Chunks++
	k.res.Bytes += int64(len(b))
	k.res.FinalHash = got
	return b
}

func (k *Checker) fail(chunk int, problem, reason string) {
	k.broken = true
	k.res.State, k.res.BrokenChunk, k.res.Problem, k.res.Reason = CheckTampered, chunk, problem, reason
}

// Result is the verdict on the chunks added so far. wantFinal, when not
// empty, is the final hash of the session.end audit event.
func (k *Checker) Result(wantFinal string) Check {
	res := k.res
	if k.broken {
		return res
	}
	res.Audited = wantFinal != ""
	switch {
	case k.next == 0:
		res.State, res.Problem, res.Reason = CheckTampered, ProblemMissingChunk, "the recording has no chunks"
	case wantFinal != "" && !k.final:
		res.State, res.BrokenChunk, res.Problem = CheckTampered, k.next, ProblemTruncated
		res.Reason = fmt.Sprintf("the tail is cut after chunk %d: there is no final chunk, and the session.end event says the recording ended with hash %s", k.next-1, wantFinal)
	case wantFinal != "" && wantFinal != k.prev:
		// Nothing is vouched for: any chunk may be the rewritten one.
		res.State, res.BrokenChunk, res.Problem = CheckTampered, 0, ProblemRewritten
		res.Bytes, res.Until, res.Chunks = 0, 0, 0
		res.Reason = fmt.Sprintf("the chain ends in %s, the session.end event says %s: chunks were rewritten with their hashes", k.prev, wantFinal)
	case !k.final:
		res.State = CheckIncomplete
	default:
		res.State = CheckVerified
	}
	return res
}
