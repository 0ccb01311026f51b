package reversetunnel

import (
	"context"
	"net"
	"sync"

	"github.com/gravitational/trace"
)

// Pool keeps one tunnel to every proxy of the cluster. It starts with one
// agent for the address the node was given (the bootstrap: from
// /webapi/ping of --proxy-server), learns every proxy from the
// announcements that come over any tunnel, and runs one agent per
// announced proxy, keyed by the proxy's UUID, each dialing that proxy's
// own tunnel address and refusing any other proxy there (ExpectUUID). A
// proxy gone from the list is dropped; the bootstrap agent stays, so a
// node never ends with no tunnel because a list was briefly empty.
//
// Goroutines: each agent owns its own; Close closes every agent and
// waits for them.
type Pool struct {
	// template is the config every agent starts from.
	template AgentConfig
	// resolve turns an announced tunnel address into a dialable one.
	resolve func(announced string) (string, error)

	// mu guards agents, bootstrap, listed and closed.
	mu        sync.Mutex
	bootstrap *Agent
	agents    map[string]*Agent
	// listed is the set of proxy UUIDs the pool keeps tunnels to: the
	// union of the latest lists of the agents that are connected.
	listed map[string]bool
	// lists is each agent's latest announced list.
	lists  map[*Agent][]AnnouncedProxy
	closed bool
}

// NewPool returns a Pool whose bootstrap agent dials cfg.ProxyAddr; call
// Start. resolve maps an announced tunnel address to the one to dial (an
// unspecified or loopback host is the proxy's view of itself); nil uses
// it as announced.
func NewPool(cfg AgentConfig, resolve func(string) (string, error)) (*Pool, error) {
	if resolve == nil {
		resolve = func(a string) (string, error) { return a, nil }
	}
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	p := &Pool{template: cfg, resolve: resolve, agents: map[string]*Agent{}, lists: map[*Agent][]AnnouncedProxy{}}
	boot := cfg
	boot.OnAnnounce = p.onAnnounce
	boot.OnMove = p.onMove
	a, err := NewAgent(boot)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	p.bootstrap = a
	return p, nil
}

// Start runs the bootstrap agent.
func (p *Pool) Start() { p.bootstrap.Start() }

// Close stops every agent and waits for them.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	all := []*Agent{p.bootstrap}
	for _, a := range p.agents {
		all = append(all, a)
	}
	p.agents = map[string]*Agent{}
	p.mu.Unlock()
	for _, a := range all {
		_ = a.Close()
	}
	return nil
}

// Agents returns the bootstrap agent and every pool agent.
func (p *Pool) Agents() []*Agent {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := []*Agent{p.bootstrap}
	for _, a := range p.agents {
		out = append(out, a)
	}
	return out
}

// Bootstrap is the agent for the address the node was given.
func (p *Pool) Bootstrap() *Agent { return p.bootstrap }

// onAnnounce reconciles the pool with the proxy lists. Proxies may
// disagree for a moment (one has not seen another's first heartbeat
// yet), so the pool keeps the union of what its connected tunnels
// announce: a proxy is dropped once no live tunnel lists it.
func (p *Pool) onAnnounce(from *Agent, ann Announcement) {
	if ann.Proxies == nil {
		return
	}
	bootUUID := p.bootstrap.ProxyUUID()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.lists[from] = ann.Proxies
	want := map[string]AnnouncedProxy{}
	for a, list := range p.lists {
		if a != from && !a.Connected() {
			continue
		}
		for _, ap := range list {
			if ap.UUID != "" && ap.TunnelAddr != "" {
				want[ap.UUID] = ap
			}
		}
	}
	p.listed = map[string]bool{}
	for uuid := range want {
		p.listed[uuid] = true
	}
	var drop []*Agent
	for uuid, a := range p.agents {
		if _, ok := want[uuid]; !ok || uuid == bootUUID {
			drop = append(drop, a)
			delete(p.agents, uuid)
			delete(p.lists, a)
		}
	}
	var start []*Agent
	for uuid, ap := range want {
		if uuid == bootUUID || p.agents[uuid] != nil {
			continue
		}
		addr, err := p.resolve(ap.TunnelAddr)
		if err != nil {
			p.template.Logger.WithError(err).WithField("proxy", uuid).Warn("Ignoring an announced proxy.")
			continue
		}
		cfg := p.template
		cfg.ProxyAddr, cfg.ExpectUUID = addr, uuid
		cfg.OnAnnounce, cfg.OnMove = p.onAnnounce, p.onMove
		a, err := NewAgent(cfg)
		if err != nil {
			p.template.Logger.WithError(err).WithField("proxy", uuid).Warn("Ignoring an announced proxy.")
			continue
		}
		p.agents[uuid] = a
		start = append(start, a)
	}
	p.mu.Unlock()
	for _, a := range start {
		p.template.Logger.WithFields(map[string]any{"proxy": a.cfg.ExpectUUID, "addr": a.cfg.ProxyAddr}).Info("Opening a tunnel to an announced proxy.")
		a.Start()
	}
	// Closing waits for the agent's goroutines: not on the announcing
	// tunnel's request loop.
	for _, a := range drop {
		go func() { _ = a.Close() }()
	}
}

// onMove waits (bounded by ctx) until an agent to another listed proxy
// has its tunnel up, so that the node stays reachable throughout: make
// before break. With no other listed proxy (the last one is shutting
// down) there is nothing to wait for.
func (p *Pool) onMove(ctx context.Context, moving *Agent) {
	leaving := moving.ProxyUUID()
	p.mu.Lock()
	var others []*Agent
	for uuid, a := range p.agents {
		if a != moving && uuid != leaving && p.listed[uuid] {
			others = append(others, a)
		}
	}
	if b := p.bootstrap; b != moving {
		if uuid := b.ProxyUUID(); uuid != leaving && p.listed[uuid] {
			others = append(others, b)
		}
	}
	p.mu.Unlock()
	if len(others) == 0 {
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	up := make(chan struct{}, len(others))
	for _, a := range others {
		go func() {
			if a.WaitConnected(wctx) == nil {
				up <- struct{}{}
			}
		}()
	}
	select {
	case <-up:
	case <-ctx.Done():
	}
}

// DialAuth opens an auth channel on the bootstrap tunnel, or on any other
// tunnel that is up, preferring tunnels that are not moving away (a
// watch opened on one would break when it goes).
func (p *Pool) DialAuth(ctx context.Context, network, addr string) (net.Conn, error) {
	var last error
	agents := p.Agents()
	var ordered []*Agent
	for _, a := range agents {
		if a.usable() {
			ordered = append(ordered, a)
		}
	}
	for _, a := range agents {
		if !a.usable() {
			ordered = append(ordered, a)
		}
	}
	for _, a := range ordered {
		if !a.Connected() {
			continue
		}
		c, err := a.DialAuth(ctx, network, addr)
		if err == nil {
			return c, nil
		}
		last = err
	}
	if last == nil {
		last = trace.ConnectionProblem(nil, "no tunnel to any proxy is up")
	}
	return nil, trace.Wrap(last)
}

// WaitConnected blocks until the bootstrap tunnel is up or ctx ends.
func (p *Pool) WaitConnected(ctx context.Context) error {
	return trace.Wrap(p.bootstrap.WaitConnected(ctx))
}
