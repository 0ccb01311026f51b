package utils

import (
	"fmt"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"golang.org/x/crypto/ssh"
)

// SSH keep-alive defaults, as OpenSSH's ServerAliveInterval and
// ServerAliveCountMax would be set for a bastion: a frozen node or proxy
// (SIGSTOP, a paused VM, a dropped route) whose TCP connection stays
// "up" ends the session within 30s of the first unanswered probe, instead
// of hanging forever.
const (
	DefaultSSHKeepAliveInterval = 10 * time.Second
	DefaultSSHKeepAliveCountMax = 3
)

// keepAliveRequest is OpenSSH's keep-alive global request. Any reply, even
// a refusal from a server that does not know it, proves the peer alive.
const keepAliveRequest = "keepalive@openssh.com"

// SSHKeepAliveConfig configures keep-alives on an SSH connection where
// Postern is the client: psh's proxy and node connections, the web
// terminal's connection to the node. The zero value means the defaults.
type SSHKeepAliveConfig struct {
	// Interval between probes; zero means DefaultSSHKeepAliveInterval,
	// negative turns keep-alives off.
	Interval time.Duration
	// CountMax is how many intervals a probe may stay unanswered before
	// the connection is given up; zero means DefaultSSHKeepAliveCountMax.
	CountMax int
	// Clock times the probes; nil means the real clock. A clock alone,
	// not observe.Deps: there is one keep-alive per SSH connection, and
	// Deps' defaults (a logger entry, a private metrics registry) would
	// be allocations on every connection for fields it never uses.
	Clock clockwork.Clock
	// Params, when set, is read each time the next probe is scheduled and
	// overrides Interval and CountMax (a value <= 0 keeps the static
	// one): settings that change while the connection lives (the
	// cluster's tunnel keep-alives) apply from the next probe on, without
	// reconnecting.
	Params func() (interval time.Duration, countMax int)
	// FromLastAnswer gives the connection up CountMax intervals after the
	// last answer (the unanswered probe's own interval is the first
	// miss) instead of CountMax intervals after the first unanswered
	// probe, up to one interval later. Tunnels use it: their 5s x3
	// finds a half-open tunnel within 15s of its last sign of life.
	FromLastAnswer bool
}

// CheckAndSetDefaults fills in the defaults.
func (c *SSHKeepAliveConfig) CheckAndSetDefaults() {
	if c.Interval == 0 {
		c.Interval = DefaultSSHKeepAliveInterval
	}
	if c.CountMax <= 0 {
		c.CountMax = DefaultSSHKeepAliveCountMax
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
}

// SSHKeepAlive probes one SSH connection and closes it when the peer stops
// answering. It owns two goroutines: the loop, and at most one probe in
// flight (which returns when the peer answers or the connection closes).
type SSHKeepAlive struct {
	conn ssh.Conn
	// what names the peer in the message, e.g. `node "web"`.
	what     string
	cfg      SSHKeepAliveConfig
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
	// mu guards cause.
	mu    sync.Mutex
	cause error
}

// StartSSHKeepAlive probes conn every cfg.Interval; nil (whose methods do
// nothing) when keep-alives are off. what names the peer in the error,
// e.g. `node "web"`.
func StartSSHKeepAlive(conn ssh.Conn, what string, cfg SSHKeepAliveConfig) *SSHKeepAlive {
	cfg.CheckAndSetDefaults()
	if cfg.Interval < 0 {
		return nil
	}
	k := &SSHKeepAlive{conn: conn, what: what, cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}
	go k.loop()
	return k
}

// params is the interval and count in force now.
func (k *SSHKeepAlive) params() (time.Duration, int) {
	interval, count := k.cfg.Interval, k.cfg.CountMax
	if k.cfg.Params != nil {
		i, c := k.cfg.Params()
		if i > 0 {
			interval = i
		}
		if c > 0 {
			count = c
		}
	}
	return interval, count
}

func (k *SSHKeepAlive) loop() {
	defer close(k.done)
	var probes sync.WaitGroup
	// The probe in flight ends when conn closes: close it before waiting
	// (the one who stops the loop closes conn, or conn failed already).
	defer probes.Wait()
	// One timer at a time, re-armed after each tick (not a ticker): a
	// probe is due an interval after the previous tick was handled.
	interval, _ := k.params()
	timer := k.cfg.Clock.NewTimer(interval)
	defer timer.Stop()
	var pending chan error
	missed := 0
	for {
		select {
		case <-k.stop:
			return
		case err := <-pending:
			pending, missed = nil, 0
			if err != nil {
				return // the connection is gone; its own error says why
			}
		case <-timer.Chan():
			if pending != nil {
				// select picks at random among ready cases: an answer
				// already there must not count as a miss.
				select {
				case err := <-pending:
					pending, missed = nil, 0
					if err != nil {
						return
					}
				default:
				}
			}
			if pending == nil {
				pending = make(chan error, 1)
				ch := pending
				probes.Go(func() {
					_, _, err := k.conn.SendRequest(keepAliveRequest, true, nil)
					ch <- err
				})
				interval, _ = k.params()
				timer.Reset(interval)
				continue
			}
			missed++
			interval, countMax := k.params()
			threshold := countMax
			if k.cfg.FromLastAnswer && threshold > 1 {
				threshold--
			}
			if missed < threshold {
				timer.Reset(interval)
				continue
			}
			k.mu.Lock()
			k.cause = fmt.Errorf("connection to %s lost: no answer to keep-alives for %v", k.what, time.Duration(countMax)*interval)
			k.mu.Unlock()
			k.conn.Close()
			return
		}
	}
}

// Err is why the keep-alive closed the connection; nil if it did not.
func (k *SSHKeepAlive) Err() error {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cause
}

// Close stops the probes. The connection must be closed first (or be
// closing) so that a probe in flight returns.
func (k *SSHKeepAlive) Close() {
	if k == nil {
		return
	}
	k.stopOnce.Do(func() { close(k.stop) })
	<-k.done
}
