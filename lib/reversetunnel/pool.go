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

	// mu guards agents, bootstrap and closed.
	mu        sync.Mutex
	bootstrap *Agent
	agents    map[string]*Agent
	closed    bool
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
	p := &Pool{template: cfg, resolve: resolve, agents: map[string]*Agent{}}
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

// onAnnounce reconciles the pool with a proxy list.
func (p *Pool) onAnnounce(_ *Agent, ann Announcement) {
	if ann.Proxies == nil {
		return
	}
	want := map[string]AnnouncedProxy{}
	for _, ap := range ann.Proxies {
		if ap.UUID != "" && ap.TunnelAddr != "" {
			want[ap.UUID] = ap
		}
	}
	bootUUID := p.bootstrap.ProxyUUID()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	var drop []*Agent
	for uuid, a := range p.agents {
		if _, ok := want[uuid]; !ok || uuid == bootUUID {
			drop = append(drop, a)
			delete(p.agents, uuid)
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

// onMove waits (bounded by ctx) until some other agent has a tunnel up,
// so that the node is reachable throughout: make before break.
func (p *Pool) onMove(ctx context.Context, moving *Agent) {
	for {
		var others []*Agent
		for _, a := range p.Agents() {
			if a != moving {
				others = append(others, a)
			}
		}
		for _, a := range others {
			if a.Connected() {
				return
			}
		}
		if len(others) == 0 {
			return
		}
		// Wait for any of them to come up.
		wctx, cancel := context.WithCancel(ctx)
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
			cancel()
			return
		case <-ctx.Done():
			cancel()
			return
		}
	}
}

// DialAuth opens an auth channel on the bootstrap tunnel, or on any other
// tunnel that is up.
func (p *Pool) DialAuth(ctx context.Context, network, addr string) (net.Conn, error) {
	var last error
	for _, a := range p.Agents() {
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
