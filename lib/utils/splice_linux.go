package utils

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// readWaiter returns a function that parks the goroutine in the runtime's
// poller until src (a socket) has data, an EOF or an error to report,
// without holding a read buffer, so that an idle direction of a splice
// costs no buffer at all; nil when src is not a socket (the caller then
// blocks in Read with a buffer).
//
// The check is a zero-timeout poll(2) of the socket: data already in it (a
// previous Read took only part of it, so no new readiness edge will come),
// an EOF, a reset or an error are seen at once; only a socket with nothing
// to report waits for the poller's next edge. poll, unlike a MSG_PEEK
// recv, leaves a pending error (a reset) in place for the real Read to
// return. Bytes a wrapper already holds (buffered) count as data.
func readWaiter(src io.Reader) func() {
	raw := socketOf(src)
	if raw == nil {
		return nil
	}
	return func() {
		if buffered(src) {
			return
		}
		_ = raw.Read(func(fd uintptr) bool {
			return pollReadable(fd)
		})
	}
}

// pollReadable is the zero-timeout poll(2) of readWaiter: true when the
// socket has something to report (or poll itself failed: the real Read
// decides).
func pollReadable(fd uintptr) bool {
	fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
	n, err := unix.Poll(fds[:], 0)
	return n != 0 || err != nil
}

// parkerFor returns the park function of a splice direction reading src,
// nil when src is not a socket or the poller is unavailable.
//
// Why a poller of our own: a goroutine blocked in Read, even one that
// holds no buffer (readWaiter), costs its stack (4-8 KiB) and a scheduler
// entry for as long as the socket stays quiet, and a proxy's sockets are
// quiet most of the time (a held `ssh -J`, a shell nobody types in). Go
// has no "call me when this socket is readable" without a goroutine, so
// the quiet direction registers its socket (level-triggered, one-shot) in
// one epoll instance for the whole process and its goroutine ends; the
// poller's one goroutine starts a new one for it when the socket becomes
// readable, errs, or reaches EOF. The runtime's own netpoller keeps the
// socket (epoll allows one socket in several sets); only its read is ours.
func parkerFor(src io.Reader) func(h *half) bool {
	raw := socketOf(src)
	if raw == nil || thePoller.init() != nil {
		return nil
	}
	return func(h *half) bool {
		if buffered(src) {
			return false
		}
		return thePoller.park(h, raw)
	}
}

// parkedRead is one direction waiting in the poller.
type parkedRead struct {
	id uint64
	// fd is the socket's descriptor while it is parked: CloseSpliced
	// finds the directions parked on a socket by it (before closing it,
	// so the number is not yet anyone else's).
	fd   int
	h    *half
	once sync.Once
}

// fire takes the direction out of the poller and runs it again in a new
// goroutine: its socket is readable, or Splice closed it. Once.
func (p *parkedRead) fire() { p.fireFrom(false) }

// fireFrom is fire; fromLoop says the poller's loop calls it (and needs no
// wake-up to notice an empty set).
func (p *parkedRead) fireFrom(fromLoop bool) {
	p.once.Do(func() {
		thePoller.remove(p, !fromLoop)
		p.h.mu.Lock()
		p.h.parked = nil
		p.h.mu.Unlock()
		go p.h.run()
	})
}

// fireClosed takes the direction out of the poller and ends it as if its
// Read had failed on a closed socket (CloseSpliced is about to close it):
// the splice then closes both sides. Nothing of the socket is read, so
// it does not matter when the close lands. Once, like fire.
func (p *parkedRead) fireClosed() {
	p.once.Do(func() {
		thePoller.remove(p, true)
		p.h.mu.Lock()
		p.h.parked = nil
		p.h.mu.Unlock()
		go p.h.finish(net.ErrClosed)
	})
}

// poller is the process's one epoll instance for quiet splice directions.
// Its goroutine runs only while a direction is parked: with none, it
// ends (a process with no idle splices has no goroutine for it).
type poller struct {
	initOnce sync.Once
	initErr  error
	epfd     int
	wakefd   int // eventfd: wakes the loop to let it end

	mu     sync.Mutex
	parked map[uint64]*parkedRead
	// byFD holds the same directions by socket descriptor. A slice: a
	// socket closed by plain Close while parked stays here (its number
	// may be reused), and CloseSpliced of the number ends it too.
	byFD    map[int][]*parkedRead
	next    uint64 // ids from 1; 0 is wakefd
	running bool
	broken  bool // epoll_wait failed: no more parking
	// parkedMore is closed (and replaced) whenever a direction parks:
	// what WaitParkedSplices waits on instead of polling the count.
	parkedMore chan struct{}
}

var thePoller poller

func (p *poller) init() error {
	p.initOnce.Do(func() {
		epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			p.initErr = err
			return
		}
		wakefd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			_ = unix.Close(epfd)
			p.initErr = err
			return
		}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &unix.EpollEvent{Events: unix.EPOLLIN}); err != nil {
			_ = unix.Close(epfd)
			_ = unix.Close(wakefd)
			p.initErr = err
			return
		}
		p.epfd, p.wakefd = epfd, wakefd
		// Under mu: WaitParkedSplices reads it without init.
		p.mu.Lock()
		p.parked = map[uint64]*parkedRead{}
		p.byFD = map[int][]*parkedRead{}
		p.mu.Unlock()
	})
	return p.initErr
}

// park registers h's socket and ends h's goroutine's part: true when h is
// parked (its goroutine must return), false when the socket is readable
// now or cannot be registered (closed: h's Read reports it).
func (p *poller) park(h *half, raw syscall.RawConn) bool {
	// Data already there would be reported by epoll at once anyway, but
	// a poll is cheaper than a round trip through the poller goroutine.
	readable, sock := true, -1
	if err := raw.Control(func(fd uintptr) { readable, sock = pollReadable(fd), int(fd) }); err != nil || readable {
		return false
	}
	p.mu.Lock()
	if p.broken {
		p.mu.Unlock()
		return false
	}
	p.next++
	pr := &parkedRead{id: p.next, fd: sock, h: h}
	p.parked[pr.id] = pr
	p.byFD[sock] = append(p.byFD[sock], pr)
	if p.parkedMore != nil {
		close(p.parkedMore)
		p.parkedMore = nil
	}
	start := !p.running
	p.running = true
	p.mu.Unlock()
	// Published before the socket is registered: a Splice closing it
	// from now on finds it and resumes it (the close takes the socket
	// out of the epoll set without an event).
	h.mu.Lock()
	h.parked = pr
	h.mu.Unlock()
	if start {
		go p.loop()
	}
	var ctlErr error
	err := raw.Control(func(fd uintptr) {
		ev := unix.EpollEvent{
			Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT,
			Fd:     int32(uint32(pr.id)),
			Pad:    int32(uint32(pr.id >> 32)),
		}
		op := unix.EPOLL_CTL_ADD
		if h.polled {
			op = unix.EPOLL_CTL_MOD // re-arm the one-shot registration
		}
		// Before the registration: once it is in, the event may resume
		// h in another goroutine at any moment, and h is theirs. (Wrong
		// when the registration fails, which MOD's ENOENT fallback
		// below absorbs.)
		h.polled = true
		ctlErr = unix.EpollCtl(p.epfd, op, int(fd), &ev)
		if op == unix.EPOLL_CTL_MOD && errors.Is(ctlErr, unix.ENOENT) {
			ctlErr = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev)
		}
	})
	if err == nil && ctlErr == nil {
		return true // h may be running elsewhere already: hands off
	}
	// Not registered (the socket closed meanwhile): take it back unless
	// Splice's close already resumed it, in which case that goroutine
	// runs the direction and this one must stop.
	resumed := true
	pr.once.Do(func() {
		resumed = false
		p.remove(pr, true)
		h.mu.Lock()
		h.parked = nil
		h.mu.Unlock()
	})
	return resumed
}

// remove forgets a parked direction and, when none is left and wake is
// set, wakes the loop so that it can end.
func (p *poller) remove(pr *parkedRead, wake bool) {
	p.mu.Lock()
	delete(p.parked, pr.id)
	if rest := slices.DeleteFunc(p.byFD[pr.fd], func(x *parkedRead) bool { return x == pr }); len(rest) == 0 {
		delete(p.byFD, pr.fd)
	} else {
		p.byFD[pr.fd] = rest
	}
	empty := len(p.parked) == 0 && p.running
	p.mu.Unlock()
	if empty && wake {
		var one = [8]byte{1, 0, 0, 0, 0, 0, 0, 0}
		_, _ = unix.Write(p.wakefd, one[:])
	}
}

// loop resumes directions whose sockets became readable, until none has
// been parked for loopLinger: a proxy setting up sessions one at a time
// parks and resumes a direction a few times per handshake, and would
// otherwise start and end this goroutine each time.
func (p *poller) loop() {
	events := make([]unix.EpollEvent, 64)
	var drain [8]byte
	timeout := -1
	for {
		n, err := unix.EpollWait(p.epfd, events, timeout)
		if err != nil && !errors.Is(err, unix.EINTR) {
			// Not expected to happen: stop parking (directions block
			// in Read from now on) and resume every parked one.
			p.mu.Lock()
			p.broken, p.running = true, false
			all := make([]*parkedRead, 0, len(p.parked))
			for _, pr := range p.parked {
				all = append(all, pr)
			}
			p.mu.Unlock()
			for _, pr := range all {
				pr.fire()
			}
			return
		}
		for i := 0; i < n; i++ {
			id := uint64(uint32(events[i].Fd)) | uint64(uint32(events[i].Pad))<<32
			if id == 0 {
				_, _ = unix.Read(p.wakefd, drain[:])
				continue
			}
			p.mu.Lock()
			pr := p.parked[id]
			p.mu.Unlock()
			if pr != nil {
				pr.fireFrom(true)
			}
		}
		p.mu.Lock()
		switch {
		case len(p.parked) > 0:
			timeout = -1
		case timeout == -1 || n > 0:
			// Empty: linger a little for the next park.
			timeout = loopLingerMillis
		default:
			// Empty for a whole linger.
			p.running = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
}

// loopLingerMillis is how long the loop outlives the last parked
// direction: short, so that a test's leak check finds no goroutine once
// its splices ended.
const loopLingerMillis = 100

// WaitParkedSplices waits until at least n splice directions wait in the
// poller at once (what a benchmark of idle sessions awaits before it counts
// goroutines), or until ctx is done.
func WaitParkedSplices(ctx context.Context, n int) error {
	for {
		thePoller.mu.Lock()
		if len(thePoller.parked) >= n {
			thePoller.mu.Unlock()
			return nil
		}
		if thePoller.parkedMore == nil {
			thePoller.parkedMore = make(chan struct{})
		}
		more := thePoller.parkedMore
		thePoller.mu.Unlock()
		select {
		case <-more:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// endParked ends the splice directions parked on raw's socket
// (CloseSpliced, just before it closes the socket): closing it would take
// it out of the epoll set without an event, and they would wait for good.
func endParked(raw syscall.RawConn) {
	if thePoller.init() != nil {
		return
	}
	var prs []*parkedRead
	_ = raw.Control(func(fd uintptr) {
		thePoller.mu.Lock()
		prs = slices.Clone(thePoller.byFD[int(fd)])
		thePoller.mu.Unlock()
	})
	for _, pr := range prs {
		pr.fireClosed()
	}
}
