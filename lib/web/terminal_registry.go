package web

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"sync"
	"time"

	"github.com/gravitational/trace"
)

// DefaultTerminalGrace is how long a web terminal outlives its websocket,
// waiting for a resume: long enough for a reload, a laptop lid or a Wi-Fi
// change, short enough that an abandoned shell does not linger.
const DefaultTerminalGrace = 5 * time.Minute

// resumeTokenBytes: 256 bits, beyond guessing (the issue asks >= 128).
const resumeTokenBytes = 32

// termRegistry owns this proxy's web terminals, attached and detached:
// each terminal's goroutine is started by add and counted in the
// server's terminals WaitGroup; closeAll ends them all. Resume tokens are
// kept as hashes, each naming one terminal. A token is single-use once
// the client has its successor: the token a socket resumed with stays
// valid until that socket's client confirms the new token (an empty
// FrameSession back), because a socket lost between the claim and the
// client reading FrameSession would otherwise leave the client with a
// used token and no way back to its shell. Both tokens are bound to the
// web session, as always.
type termRegistry struct {
	// mu guards byID, byToken, closed and draining. Lock order: a
	// terminal's locks, then mu (claim releases mu before touching the
	// terminal).
	mu      sync.Mutex
	byID    map[string]*term
	byToken map[string]*term
	closed  bool
	// draining: the proxy is shutting down; a terminal whose socket goes
	// away ends instead of waiting for a resume that cannot come here.
	draining bool
}

func newResumeToken() (token, hash string, err error) {
	var b [resumeTokenBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", trace.Wrap(err)
	}
	token = hex.EncodeToString(b[:])
	return token, hashToken(token), nil
}

func hashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// add registers a new terminal; false after closeAll.
func (r *termRegistry) add(t *term) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	if r.byID == nil {
		r.byID = map[string]*term{}
		r.byToken = map[string]*term{}
	}
	r.byID[t.id] = t
	return true
}

// remove forgets an ended terminal and its token.
func (r *termRegistry) remove(t *term) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byID, t.id)
	r.forgetLocked(&t.tokenHash)
	r.forgetLocked(&t.prevHash)
}

// forgetLocked removes the token whose hash *hash holds, if any.
func (r *termRegistry) forgetLocked(hash *string) {
	if *hash != "" {
		delete(r.byToken, *hash)
		*hash = ""
	}
}

// rotate issues t's next resume token; the one issued before it stops
// working (the one t was resumed with lasts until confirm).
func (r *termRegistry) rotate(t *term) (string, error) {
	token, hash, err := newResumeToken()
	if err != nil {
		return "", trace.Wrap(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.byID[t.id]; !ok {
		return "", trace.NotFound("terminal ended")
	}
	r.forgetLocked(&t.tokenHash)
	t.tokenHash = hash
	r.byToken[hash] = t
	return token, nil
}

// errResumeUnknown is the refusal of a token that is unknown, used, or
// whose terminal ended (grace expiry, logout): the three are not told
// apart, to the user or to a guesser.
var errResumeUnknown = trace.AccessDenied("resume refused: the terminal ended or the resume token was already used")

// claim consumes a resume token for live's web session. A token of
// another web session or user is refused and stays valid for its owner
// (a thief's attempt must not end the owner's terminal).
func (r *termRegistry) claim(live *liveSession, token string) (*term, error) {
	hash := hashToken(token)
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.byToken[hash]
	if t == nil {
		return nil, errResumeUnknown
	}
	if t.live.key != live.key || t.live.user != live.user {
		return nil, trace.AccessDenied("resume refused: the terminal belongs to another web session")
	}
	if hash == t.tokenHash {
		// The client has the newest token: the one before it is done
		// with, and this one now backs the attach it starts.
		r.forgetLocked(&t.prevHash)
		t.prevHash, t.tokenHash = hash, ""
	} else {
		// The token of the last attach: the one issued since never
		// reached the client.
		r.forgetLocked(&t.tokenHash)
	}
	return t, nil
}

// confirm retires the token t's attached socket resumed with: its
// client holds the token issued on that attach.
func (r *termRegistry) confirm(t *term) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgetLocked(&t.prevHash)
}

// list returns the terminals of one web session, oldest first.
func (r *termRegistry) list(live *liveSession) []*term {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*term
	for _, t := range r.byID {
		// A joined session is someone else's shell: not this session's
		// terminal to list, resume or end.
		if t.live.key == live.key && t.joinMode == "" {
			out = append(out, t)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].started.Before(out[j].started) })
	return out
}

// get returns one terminal of live's web session, or NotFound (also for
// another session's terminal: its existence is not revealed).
func (r *termRegistry) get(live *liveSession, id string) (*term, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.byID[id]
	if t == nil || t.live.key != live.key || t.joinMode != "" {
		return nil, trace.NotFound("terminal %q not found", id)
	}
	return t, nil
}

// drain refuses new terminals and ends, with cause, those no socket is
// attached to; attached ones go on (a later detach ends them too, see
// isDraining).
func (r *termRegistry) drain(cause error) {
	r.mu.Lock()
	r.closed = true
	r.draining = true
	all := make([]*term, 0, len(r.byID))
	for _, t := range r.byID {
		all = append(all, t)
	}
	r.mu.Unlock()
	for _, t := range all {
		t.mu.Lock()
		detached := t.att == nil
		t.mu.Unlock()
		if detached {
			t.cancel(cause)
		}
	}
}

// openSSH lists the terminals connected to OpenSSH nodes, with their
// nodes' UUIDs.
func (r *termRegistry) openSSH() map[*term]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[*term]string{}
	for _, t := range r.byID {
		if id := t.openSSHNode.Load(); id != nil {
			out[t] = *id
		}
	}
	return out
}

// isDraining reports whether drain was called.
func (r *termRegistry) isDraining() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.draining
}

// closeAll ends every terminal with cause and refuses new ones; the
// server's terminals WaitGroup waits for their goroutines.
func (r *termRegistry) closeAll(cause error) {
	r.mu.Lock()
	r.closed = true
	all := make([]*term, 0, len(r.byID))
	for _, t := range r.byID {
		all = append(all, t)
	}
	r.mu.Unlock()
	for _, t := range all {
		t.cancel(cause)
	}
}
