package utils

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/gravitational/trace"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/sirupsen/logrus"
)

// Accept back-off bounds while the process (EMFILE) or the machine (ENFILE)
// is out of descriptors. 5ms is long enough that a loop does not spin a
// core re-failing accept, short enough that the first descriptor freed is
// used almost at once; doubling to a 1s ceiling means a long shortage costs
// one failed accept a second, while connections wait in the kernel's
// backlog instead of being refused.
const (
	AcceptRetryFloor   = 5 * time.Millisecond
	AcceptRetryCeiling = time.Second
)

// RetryConfig configures a RetryingListener.
type RetryConfig struct {
	// Name is the listener's name in logs and in Healthy's error
	// ("proxy_ssh"). Empty means the listener's address.
	Name string
	// Deps: Clock times the back-off.
	observe.Deps
	// OnStreak, when set, is called with active=true and the error when a
	// streak of descriptor shortages starts, and with active=false and nil
	// when an Accept succeeds again (e.g. to flip a gauge). It runs on the
	// accepting goroutine and must not block.
	OnStreak func(active bool, err error)
}

// CheckAndSetDefaults fills in defaults.
func (c *RetryConfig) CheckAndSetDefaults() error {
	c.Deps.SetDefaults(observe.ComponentListener)
	return nil
}

// RetryingListener is a net.Listener whose Accept rides out descriptor
// exhaustion instead of failing. Every server's accept loop treats an
// Accept error as the listener being broken and stops serving: with a plain
// listener, one moment without descriptors (a flood, a leak elsewhere in
// the process) would close the port for good. Here Accept pauses and keeps
// the port: connections wait in the backlog, and are served as soon as a
// descriptor is free. It logs once per streak (Warn at the start, Info at
// the end) and reports the streak through Healthy and OnStreak, because a
// port that is bound but getting nobody through needs to be explained to
// an operator.
//
// Other Accept errors, and Close, end Accept as usual. The Go runtime
// already retries the other transient accept errors (EINTR, ECONNABORTED),
// so they never reach here.
type RetryingListener struct {
	net.Listener
	cfg    RetryConfig
	log    logrus.FieldLogger
	closed chan struct{}
	once   sync.Once

	// mu guards streakErr.
	mu        sync.Mutex
	streakErr error
}

// NewRetryingListener wraps ln.
func NewRetryingListener(ln net.Listener, cfg RetryConfig) *RetryingListener {
	_ = cfg.CheckAndSetDefaults()
	if cfg.Name == "" {
		cfg.Name = ln.Addr().String()
	}
	return &RetryingListener{
		Listener: ln,
		cfg:      cfg,
		log:      cfg.Logger.WithFields(logrus.Fields{"listener": cfg.Name, "addr": ln.Addr().String()}),
		closed:   make(chan struct{}),
	}
}

// Accept waits for the next connection, retrying with back-off while the
// process is out of descriptors.
func (l *RetryingListener) Accept() (net.Conn, error) {
	var pause time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			if pause != 0 {
				l.endStreak()
			}
			return c, nil
		}
		if !OutOfDescriptors(err) {
			return nil, err
		}
		select {
		case <-l.closed:
			return nil, err
		default:
		}
		if pause == 0 {
			pause = AcceptRetryFloor
			l.startStreak(err)
		} else {
			pause = min(pause*2, AcceptRetryCeiling)
		}
		timer := l.cfg.Clock.NewTimer(pause)
		select {
		case <-timer.Chan():
		case <-l.closed:
			timer.Stop()
			// The next Accept on the closed listener returns its error.
		}
	}
}

// startStreak and endStreak are called only from Accept, once per
// transition of that Accept call; the mutex makes concurrent Accept calls
// (allowed on a net.Listener) safe, and keeps the log to one line per
// streak however many of them there are.
func (l *RetryingListener) startStreak(err error) {
	l.mu.Lock()
	first := l.streakErr == nil
	l.streakErr = err
	l.mu.Unlock()
	if !first {
		return
	}
	l.log.WithError(err).Warn("Out of file descriptors: accept is backing off and keeps the listener; connections wait in the backlog.")
	if l.cfg.OnStreak != nil {
		l.cfg.OnStreak(true, err)
	}
}

func (l *RetryingListener) endStreak() {
	l.mu.Lock()
	was := l.streakErr != nil
	l.streakErr = nil
	l.mu.Unlock()
	if !was {
		return
	}
	l.log.Info("File descriptors are available again: accepting.")
	if l.cfg.OnStreak != nil {
		l.cfg.OnStreak(false, nil)
	}
}

// Healthy returns an error while a descriptor shortage streak lasts, nil
// otherwise. Its signature fits a readiness check: a proxy that cannot
// accept should be taken out of a load balancer's rotation.
func (l *RetryingListener) Healthy() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.streakErr != nil {
		return trace.LimitExceeded("%s: accept is out of file descriptors, retrying: %v", l.cfg.Name, l.streakErr)
	}
	return nil
}

// Close closes the listener and interrupts a back-off.
func (l *RetryingListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	l.mu.Lock()
	l.streakErr = nil
	l.mu.Unlock()
	return l.Listener.Close()
}

// OutOfDescriptors reports whether err says the process (EMFILE) or the
// machine (ENFILE) has no file descriptor to give.
func OutOfDescriptors(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}
