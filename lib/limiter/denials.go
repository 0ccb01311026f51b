package limiter

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/postern-dev/postern/lib/observe"
)

// Denials bounds the audit events of refusals that happen after accept:
// failed handshakes and refused credentials on a port whose clients are
// machines (the tunnel port, the peer port). There every unauthenticated
// connection can fail its handshake, and one audit event per connection
// lets a flood of junk connections write the audit log (and the backend)
// as fast as it connects. WrapListener's OnRefuse does the same for
// connections refused at accept.
//
// The rule, per window of DenialsConfig.Window:
//   - the first refusal of a kind from a source (an IPv4 address or an IPv6
//     /64) is reported at once, with its reason and Count 1: one refused
//     node or leaf is audited as it happens, with why;
//   - its repeats within the window are counted, and reported once when
//     the window ends, with the latest reason and how many (Summary);
//   - at most MaxKeys kinds and sources are tracked at once; refusals
//     beyond them are counted together, and reported as one summary with
//     an empty Key and Kind at the window's end.
//
// So a window costs at most 2×MaxKeys+1 reports, whatever the flood. A
// source and kind still refused when its summary is written stays tracked
// into the next window (its refusals are counted, not reported at once
// again), so a steady flood costs one report per window; one that went
// quiet is forgotten, and its next refusal is reported at once.
type Denials struct {
	cfg DenialsConfig

	// mu guards everything below.
	mu sync.Mutex
	// keys are the kinds and sources of this window; open says a window
	// runs (timer ends it).
	keys     map[denialKey]*denialState
	overflow denialState
	open     bool
	timer    clockwork.Timer
	closed   bool
}

// DenialsConfig configures Denials.
type DenialsConfig struct {
	// Report writes one report (an audit event). It is called from Deny
	// and, for summaries, from the window's timer or Close, never with
	// a lock held; it must not block (an audit Emit does not). Required.
	Report func(Denial)
	// Window is how long repeats are counted before their summary; zero
	// means RefusalReportInterval.
	Window time.Duration
	// MaxKeys bounds the kinds and sources tracked at once; zero means
	// DefaultMaxDenialKeys.
	MaxKeys int
	// Deps: Clock times the windows (the only one used: Report is
	// where the denials go).
	observe.Deps
}

// DefaultMaxDenialKeys: room for every refusal a handful of misconfigured
// nodes and leaves cause at once (each a kind of its own: its reason), few
// enough that a flood of made-up kinds and sources costs at most 65 audit
// events a window.
const DefaultMaxDenialKeys = 32

// CheckAndSetDefaults validates and fills in defaults.
func (c *DenialsConfig) CheckAndSetDefaults() error {
	if c.Report == nil {
		return trace.BadParameter("limiter: denials need a Report func")
	}
	if c.Window < 0 {
		return trace.BadParameter("limiter: negative denial window %v", c.Window)
	}
	if c.Window == 0 {
		c.Window = RefusalReportInterval
	}
	if c.MaxKeys < 0 {
		return trace.BadParameter("limiter: negative denial MaxKeys %d", c.MaxKeys)
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultMaxDenialKeys
	}
	c.Deps.SetDefaults(observe.ComponentLimiter)
	return nil
}

// Denial is one report.
type Denial struct {
	// Addr is the remote address (host:port) of the refusal reported, the
	// latest one for a summary; Key its source (IPv4 address or IPv6
	// /64). Both empty, with Kind, for the summary of refusals beyond
	// MaxKeys.
	Addr, Key string
	// Kind is what the caller classed the refusal as.
	Kind string
	// Reason is the refusal's, the latest one's for a summary.
	Reason string
	// Count is how many refusals this report covers: 1 at once, the
	// repeats since for a summary.
	Count int
	// Summary says the report ends a window (Count repeats), rather than
	// being the first refusal of its kind and source; Window is then the
	// window's length.
	Summary bool
	Window  time.Duration
	// Fields are the caller's, given to DenyWith with the first refusal
	// of the kind and source (nil for the summary beyond MaxKeys).
	Fields map[string]any
}

// Text is the reason to audit: Reason for a refusal reported at once, and
// for a summary the count and window too, so that the event reads on its
// own.
func (d Denial) Text() string {
	if !d.Summary {
		return d.Reason
	}
	if d.Key == "" && d.Kind == "" {
		return fmt.Sprintf("%s within %v, beyond the kinds and sources audited one by one; the latest: %s", plural(d.Count, "more refusal"), d.Window, d.Reason)
	}
	return fmt.Sprintf("refused %s within %v; the latest: %s", plural(d.Count, "more time"), d.Window, d.Reason)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

type denialKey struct{ key, kind string }

type denialState struct {
	addr, reason string
	count        int
	fields       map[string]any
}

// NewDenials returns a Denials; Close it to write the pending summaries.
func NewDenials(cfg DenialsConfig) (*Denials, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	return &Denials{cfg: cfg, keys: map[denialKey]*denialState{}}, nil
}

// Deny reports, or counts, one refusal of remote (host:port) for reason.
// kind classes it: refusals of one kind from one source are coalesced. It
// must not vary with what differs between connections of one attack (a
// port, a time): use a fixed kind for a failed handshake, whose error
// names the connection's addresses, and the reason itself for a refused
// credential, which is the same each time the same one is offered. After
// Close every refusal is reported at once.
func (d *Denials) Deny(remote, kind, reason string) {
	d.DenyWith(remote, kind, reason, nil)
}

// DenyWith is Deny with fields to report with the refusal and, when it is
// the first of its kind and source, with their summary. They should not
// vary within a kind (put what varies in kind).
func (d *Denials) DenyWith(remote, kind, reason string, fields map[string]any) {
	key, _ := ipKey(stringAddr(remote))
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		d.cfg.Report(Denial{Addr: remote, Key: key, Kind: kind, Reason: reason, Count: 1, Fields: fields})
		return
	}
	if !d.open {
		d.open = true
		d.timer = d.cfg.Clock.AfterFunc(d.cfg.Window, d.endWindow)
	}
	k := denialKey{key, kind}
	if st := d.keys[k]; st != nil {
		st.addr, st.reason = remote, reason
		st.count++
		d.mu.Unlock()
		return
	}
	if len(d.keys) >= d.cfg.MaxKeys {
		d.overflow.addr, d.overflow.reason = remote, reason
		d.overflow.count++
		d.mu.Unlock()
		return
	}
	d.keys[k] = &denialState{fields: fields}
	d.mu.Unlock()
	d.cfg.Report(Denial{Addr: remote, Key: key, Kind: kind, Reason: reason, Count: 1, Fields: fields})
}

// Pending is how many refusals are counted for summaries not yet
// written: what a test of a flood awaits before it ends the window.
func (d *Denials) Pending() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.overflow.count
	for _, st := range d.keys {
		n += st.count
	}
	return n
}

// endWindow writes the window's summaries and, when some of its sources
// are still being refused, starts the next window with them.
func (d *Denials) endWindow() {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	out := d.takeSummaries()
	if len(d.keys) > 0 {
		d.timer = d.cfg.Clock.AfterFunc(d.cfg.Window, d.endWindow)
	} else {
		d.open = false
	}
	d.mu.Unlock()
	for _, r := range out {
		d.cfg.Report(r)
	}
}

// takeSummaries returns the summaries due and keeps only the kinds and
// sources that had repeats (mu held).
func (d *Denials) takeSummaries() []Denial {
	var out []Denial
	for k, st := range d.keys {
		if st.count == 0 {
			delete(d.keys, k)
			continue
		}
		out = append(out, Denial{Addr: st.addr, Key: k.key, Kind: k.kind, Reason: st.reason, Count: st.count, Summary: true, Window: d.cfg.Window, Fields: st.fields})
		st.count = 0
	}
	// In a stable order, for whoever reads them side by side.
	slices.SortFunc(out, func(a, b Denial) int { return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Kind, b.Kind)) })
	if d.overflow.count > 0 {
		out = append(out, Denial{Addr: d.overflow.addr, Reason: d.overflow.reason, Count: d.overflow.count, Summary: true, Window: d.cfg.Window})
		d.overflow = denialState{}
	}
	return out
}

// Close ends the window now, writing its summaries; refusals after it are
// reported one by one (a server closes it after its last handler ended).
func (d *Denials) Close() {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.closed = true
	if d.timer != nil {
		d.timer.Stop()
	}
	out := d.takeSummaries()
	d.keys = map[denialKey]*denialState{}
	d.mu.Unlock()
	for _, r := range out {
		d.cfg.Report(r)
	}
}
