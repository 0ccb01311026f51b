package auth

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/services"
)

// The node watch streams backend events as JSON lines over one long HTTP
// response, so a proxy on another machine runs the very same NodeWatcher
// it would run on a local backend: the client's NewWatcher returns a
// backend.Watcher. Only keys under the nodes prefix are ever streamed.

// streamHandler serves a long-lived response for an authorized peer.
type streamHandler func(w http.ResponseWriter, r *http.Request, p *peer)

func (a *APIServer) handleStream(pattern string, roles []string, h streamHandler) {
	a.handle(pattern, roles, func(_ context.Context, p *peer, r *http.Request) (any, error) {
		// handle has authorized the peer; the stream writes its own response.
		return streamMarker{h: h, p: p}, nil
	})
}

// streamMarker tells respond to hand the ResponseWriter to a stream
// handler instead of writing JSON.
type streamMarker struct {
	h streamHandler
	p *peer
}

// watchNodes streams node events. Query: prefix (repeatable; each must be
// under the nodes prefix; default the whole prefix) and queue_size.
func (a *APIServer) watchNodes(w http.ResponseWriter, r *http.Request, p *peer) {
	a.watchPrefix(w, r, p, services.NodesPrefix())
}

// watchPrefix streams the events of keys under root, and nothing else:
// every requested prefix must be under it.
func (a *APIServer) watchPrefix(w http.ResponseWriter, r *http.Request, p *peer, root string) {
	a.watchRoots(w, r, p, nil, root)
}

// watchRoots streams the events of keys under any of roots; every
// requested prefix must be under one of them. transform, when set,
// rewrites each put's value before it is sent (to strip secrets) and may
// refuse it (the event is then sent as a delete: the peer must not keep a
// stale value it can no longer be told about).
func (a *APIServer) watchRoots(w http.ResponseWriter, r *http.Request, p *peer, transform func(key string, value []byte) ([]byte, error), roots ...string) {
	var convert func(backend.Event) (backend.Event, bool)
	if transform != nil {
		convert = func(ev backend.Event) (backend.Event, bool) {
			if ev.Type != backend.OpPut {
				return ev, true
			}
			v, err := transform(ev.Item.Key, ev.Item.Value)
			if err != nil {
				a.log.WithError(err).WithFields(logrus.Fields{"peer": p.ID, "key": ev.Item.Key}).Warn("Watch event not sent as is.")
				ev.Type, v = backend.OpDelete, nil
			}
			ev.Item.Value = v
			return ev, true
		}
	}
	a.watchEvents(w, r, p, convert, roots...)
}

// watchEvents is watchRoots with each event passed through convert, when
// set, which may rewrite it or drop it (false).
func (a *APIServer) watchEvents(w http.ResponseWriter, r *http.Request, p *peer, convert func(backend.Event) (backend.Event, bool), roots ...string) {
	q := r.URL.Query()
	prefixes := q["prefix"]
	for _, pr := range prefixes {
		if !slices.ContainsFunc(roots, func(root string) bool { return strings.HasPrefix(pr, root) }) {
			writeError(w, trace.AccessDenied("watch prefix %q is outside %q", pr, strings.Join(roots, ", ")))
			return
		}
	}
	if len(prefixes) == 0 {
		prefixes = roots
	}
	root := strings.Join(roots, ",")
	queue, _ := strconv.Atoi(q.Get("queue_size"))
	if queue < 0 || queue > 1<<16 {
		queue = 0
	}
	if a.shuttingDown() {
		writeGoingAway(w)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	watcher, err := a.auth.store.Backend().NewWatcher(ctx, backend.Watch{
		Name:      "api:" + p.Role + ":" + p.ID,
		Prefixes:  prefixes,
		QueueSize: queue,
	})
	if err != nil {
		writeError(w, trace.Wrap(err))
		return
	}
	defer watcher.Close()
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "application/x-ndjson")
	// Keep-alives only for a client that asked: an older one would take
	// the unknown event for a broken stream.
	var keepalive <-chan time.Time
	if q.Get(watchKeepAliveParam) == "1" {
		// Real time, as the client's deadline it feeds: a fake clock
		// would never ping.
		every := a.watchKeepAlive()
		w.Header().Set(headerWatchKeepAlive, every.String())
		t := time.NewTicker(every)
		defer t.Stop()
		keepalive = t.C
	}
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		// The headers now: a client tells a live server from a frozen
		// one by how soon it hears from it.
		flusher.Flush()
	}
	enc := json.NewEncoder(w)
	send := func(ev authapi.WatchEvent) bool {
		if err := enc.Encode(ev); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	log := a.log.WithFields(logrus.Fields{"peer": p.ID, "role": p.Role})
	log = log.WithField("prefix", root)
	log.Debug("Watch started.")
	defer log.Debug("Watch ended.")
	for {
		select {
		case ev := <-watcher.Events():
			if convert != nil {
				var ok bool
				if ev, ok = convert(ev); !ok {
					continue
				}
			}
			we := authapi.WatchEvent{
				Type:     ev.Type.String(),
				Key:      ev.Item.Key,
				Value:    ev.Item.Value,
				Expires:  ev.Item.Expires,
				Revision: ev.Item.Revision,
			}
			if !send(we) {
				return
			}
		case <-keepalive:
			if !send(authapi.WatchEvent{Type: authapi.WatchEventPing}) {
				return
			}
		case <-watcher.Done():
			msg := "watcher closed"
			if err := watcher.Error(); err != nil {
				msg = err.Error()
			}
			send(authapi.WatchEvent{Type: "error", Error: msg})
			return
		case <-ctx.Done():
			return
		case <-a.closing:
			return
		}
	}
}

// NewWatcher starts a node watch on the auth server. Only prefixes under
// services.NodesPrefix() are allowed. The returned watcher delivers OpInit
// first, like a local backend's; it stops (Done, Error) when the stream
// breaks, and the caller re-syncs as it would after a local watcher broke.
func (c *Client) NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error) {
	return c.newWatcher(ctx, "/v1/watch/nodes", watch)
}

// newWatcher starts the watch stream at path (a watchPrefix endpoint).
func (c *Client) newWatcher(ctx context.Context, path string, watch backend.Watch) (backend.Watcher, error) {
	q := url.Values{}
	for _, p := range watch.Prefixes {
		q.Add("prefix", p)
	}
	if watch.QueueSize > 0 {
		q.Set("queue_size", strconv.Itoa(watch.QueueSize))
	}
	q.Set(watchKeepAliveParam, "1")
	size := watch.QueueSize
	if size <= 0 {
		size = backend.DefaultWatchQueueSize
	}
	wctx, cancel := context.WithCancel(ctx)
	newReq := func(ctx context.Context, base string) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path+"?"+q.Encode(), nil)
		return req, trace.Wrap(err)
	}
	var resp *http.Response
	server := -1
	handle := func(r *http.Response) (bool, error) {
		if r.StatusCode != http.StatusOK {
			return false, authapi.ReadErrorResponse(r)
		}
		resp = r
		return true, nil
	}
	// A frozen server (SIGSTOPped: it accepts, and never answers) would
	// hold the watch forever, and its owner would serve a view that no
	// longer moves: nodes that heartbeat elsewhere expire from it. So the
	// stream must be heard from: its headers within c.watchSilence, then
	// a line (an event or the server's keep-alive) at least that often.
	// When it falls silent the request is cancelled, the server is marked
	// suspect (the re-opened watch and the next calls go elsewhere), and
	// the owner re-syncs. Real time, like every I/O deadline here: a fake
	// clock would never end a stream.
	silence := newSilenceGuard(c.watchSilence, cancel)
	newReq = c.trackServer(newReq, &server)
	if err := c.send(wctx, http.MethodGet, path, 0, newReq, handle); err != nil {
		silence.stop()
		cancel()
		if silence.fired() {
			err = c.watchSilent(server, err)
		}
		return nil, trace.Wrap(err)
	}
	if resp.Header.Get(headerWatchKeepAlive) == "" {
		// An older server sends no keep-alives: a quiet stream is no sign.
		silence.stop()
	}
	w := &remoteWatcher{
		events:  make(chan backend.Event, size),
		done:    make(chan struct{}),
		cancel:  cancel,
		silence: silence,
		silent:  func(err error) error { return c.watchSilent(server, err) },
	}
	w.wg.Add(1)
	go w.run(wctx, resp)
	return w, nil
}

// watchSilent marks the server a watch fell silent on as suspect and says
// so.
func (c *Client) watchSilent(server int, cause error) error {
	addr := c.cfg.Addr
	if server >= 0 {
		addr = c.servers.addrs[server]
		c.servers.suspect(server, cause)
	}
	return trace.ConnectionProblem(cause, "the auth server at %s sent nothing on the watch for %v: it is not answering", addr, c.watchSilence)
}

// trackServer wraps newReq to record which server (its index in
// c.servers) the request went to last.
func (c *Client) trackServer(newReq func(ctx context.Context, base string) (*http.Request, error), server *int) func(ctx context.Context, base string) (*http.Request, error) {
	return func(ctx context.Context, base string) (*http.Request, error) {
		*server = slices.Index(c.servers.addrs, strings.TrimPrefix(base, "https://"))
		return newReq(ctx, base)
	}
}

// Watch keep-alives: a client asks with watchKeepAliveParam=1; the server
// then says how often it pings (headerWatchKeepAlive) and writes a ping
// line at least that often. The client allows three intervals of silence.
const (
	watchKeepAliveParam  = "keepalive"
	headerWatchKeepAlive = "Postern-Watch-Keepalive"
	// DefaultWatchKeepAlive: a line every 5 s costs nothing, and three
	// missed (15 s) is well inside a node record's 30 s TTL, so a proxy
	// leaves a frozen server before the nodes it can no longer see
	// expire from its view.
	DefaultWatchKeepAlive = 5 * time.Second
	// DefaultWatchSilence is how long a client waits to hear from a
	// watch stream (headers, an event or a ping) before it gives up on
	// the server.
	DefaultWatchSilence = 3 * DefaultWatchKeepAlive
)

// watchKeepAlive is how often this server pings its watch streams.
func (a *APIServer) watchKeepAlive() time.Duration {
	if a.keepAlive > 0 {
		return a.keepAlive
	}
	return DefaultWatchKeepAlive
}

// silenceGuard cancels a watch stream that has not been heard from for
// its period; reset by every line. A nil guard never fires.
type silenceGuard struct {
	period time.Duration
	timer  *time.Timer
	// silent is set when the timer fired; off once stopped (heard must
	// not re-arm it).
	silent, off atomic.Bool
}

func newSilenceGuard(period time.Duration, cancel context.CancelFunc) *silenceGuard {
	g := &silenceGuard{period: period}
	g.timer = time.AfterFunc(period, func() {
		g.silent.Store(true)
		cancel()
	})
	return g
}

// heard restarts the period (a line arrived).
func (g *silenceGuard) heard() {
	if g != nil && !g.off.Load() {
		g.timer.Reset(g.period)
	}
}

// pause stops the period until the next heard.
func (g *silenceGuard) pause() {
	if g != nil && !g.off.Load() {
		g.timer.Stop()
	}
}

// stop ends the guard for good.
func (g *silenceGuard) stop() {
	if g == nil {
		return
	}
	g.off.Store(true)
	g.timer.Stop()
}

// fired says the stream was cancelled for its silence.
func (g *silenceGuard) fired() bool { return g != nil && g.silent.Load() }

// remoteWatcher is a backend.Watcher fed by the watch stream. It owns one
// goroutine (run), which Close stops by cancelling the request and waits for.
type remoteWatcher struct {
	events chan backend.Event
	done   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// silence ends the stream when the server falls silent; silent is
	// the error that says so (and marks the server suspect).
	silence *silenceGuard
	silent  func(cause error) error

	// mu guards err.
	mu  sync.Mutex
	err error
}

var _ backend.Watcher = (*remoteWatcher)(nil)

func (w *remoteWatcher) run(ctx context.Context, resp *http.Response) {
	defer w.wg.Done()
	defer close(w.done)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	// A node record is small, but leave room for labels.
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	defer w.silence.stop()
	for sc.Scan() {
		w.silence.heard()
		var we authapi.WatchEvent
		if err := json.Unmarshal(sc.Bytes(), &we); err != nil {
			w.setErr(trace.BadParameter("corrupt watch event: %v", err))
			return
		}
		var ev backend.Event
		switch we.Type {
		case authapi.WatchEventPing:
			continue
		case "init":
			ev.Type = backend.OpInit
		case "put":
			ev.Type = backend.OpPut
		case "delete":
			ev.Type = backend.OpDelete
		case "error":
			w.setErr(trace.ConnectionProblem(nil, "auth server ended the watch: %s", we.Error))
			return
		default:
			w.setErr(trace.BadParameter("unknown watch event type %q", we.Type))
			return
		}
		ev.Item = backend.Item{Key: we.Key, Value: we.Value, Expires: we.Expires, Revision: we.Revision}
		select {
		case w.events <- ev:
			continue
		default:
		}
		// The owner is behind: while it catches up, the stream is not
		// read, and that is not the server's silence.
		w.silence.pause()
		select {
		case w.events <- ev:
			w.silence.heard()
		case <-ctx.Done():
			if w.silence.fired() {
				w.setErr(w.silent(ctx.Err()))
			}
			return
		}
	}
	if w.silence.fired() {
		w.setErr(w.silent(sc.Err()))
		return
	}
	if ctx.Err() != nil {
		return // closed by its owner: no error
	}
	err := sc.Err()
	if err == nil {
		err = trace.ConnectionProblem(nil, "auth server closed the watch stream")
	}
	w.setErr(trace.ConnectionProblem(err, "watch broke: %v", err))
}

func (w *remoteWatcher) setErr(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.err = err
}

// Events delivers OpInit first, then puts and deletes.
func (w *remoteWatcher) Events() <-chan backend.Event { return w.events }

// Done is closed when the watcher stops.
func (w *remoteWatcher) Done() <-chan struct{} { return w.done }

// Error says why a watcher not closed by its owner stopped.
func (w *remoteWatcher) Error() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close stops the watcher and waits for its goroutine; safe to repeat.
func (w *remoteWatcher) Close() error {
	w.cancel()
	w.wg.Wait()
	return nil
}
