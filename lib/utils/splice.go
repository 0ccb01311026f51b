// Package utils holds the few small pieces every Postern component shares.
// Keep it small: anything with a policy or a dependency belongs elsewhere.
package utils

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/jonboulle/clockwork"
)

// spliceBufferSize is the copy buffer of a busy splice direction. 32 KiB is
// x/crypto/ssh's maximum channel packet payload, so one Read from a channel
// never needs more, and io.Copy's own default is the same size.
const spliceBufferSize = 32 * 1024

// idleBufferSize is the buffer a quiet direction reads with. Most of a
// proxy's pipes are idle most of the time (an interactive shell, a held
// `ssh -J`), and a buffer held across a blocked Read is memory the process
// pays per connection. A socket source that idles past SpliceParkAfter
// is parked without any buffer (one that cannot park is waited on without
// one, readWaiter), and the buffer is taken from the pool only once data
// is there; an ssh.Channel source (which has no such wait) blocks with this
// one. 1 KiB holds keystrokes, their echo and a few lines of screen, and a
// direction that fills it switches to a full buffer until it goes quiet
// again.
const idleBufferSize = 1024

// SpliceParkAfter is how long a splice direction reading a socket must
// have moved no data before it leaves its goroutine for the poller
// (parkRead, splice_linux.go). Until then it blocks in Read like any
// goroutine, so a session being set up or in use pays no readiness
// syscall and no hand-off per message (a handshake's gaps are tens of
// milliseconds; an `ssh -J ... true` never parks at all); only a session
// that has gone idle is parked. It is measured with one read deadline per
// period, not per read. Benchmarks of idle sessions wait this long (twice)
// before they count goroutines.
const SpliceParkAfter = 250 * time.Millisecond

// spliceClock dates the idle deadlines (a socket deadline is wall-clock
// time: a fake clock cannot drive it, which is why tests await the
// parking itself rather than advance a clock).
var spliceClock = clockwork.NewRealClock()

// Buffer pools: a proxy carries thousands of long-lived pipes, so
// allocating buffers per direction per connection would be the dominant
// per-session cost.
var (
	bufferPool = sync.Pool{New: func() any {
		b := make([]byte, spliceBufferSize)
		return &b
	}}
	idleBufferPool = sync.Pool{New: func() any {
		b := make([]byte, idleBufferSize)
		return &b
	}}
)

// closeWriter is what half-close needs: *net.TCPConn, *net.UnixConn,
// *tls.Conn and ssh.Channel all implement it.
type closeWriter interface {
	CloseWrite() error
}

// Splice copies a to b and b to a until both directions have ended, then
// closes both and returns the byte counts (for the audit log) and the first
// error that was not an end of stream.
//
// Half-close: when one direction reaches EOF, Splice calls CloseWrite on the
// destination (when it has one) and keeps the other direction flowing, so
// `printf abc | ssh node 'cat; echo done'` prints "abcdone". A destination
// without CloseWrite is closed outright, since otherwise its peer would
// never learn that the stream ended.
//
// A read or write error in one direction closes both sides: the other
// direction cannot make progress that anybody will see. Cancelling ctx
// closes both sides too, and Splice returns ctx's error.
//
// Goroutines: the direction that reads a socket (b, or a when only a is
// one) runs apart from the caller, and once its socket has been quiet for
// SpliceParkAfter it runs nowhere at all: it is parked in the process's
// one socket poller (parkRead, splice_linux.go) with no goroutine and no
// buffer, and a fresh goroutine takes it up when data, an EOF or an error
// arrives. Splice owns that socket's read deadline while it runs (it
// measures the quiet with it): a caller's deadline must be cleared first. The caller
// runs the other direction. An idle `ssh -J` at the proxy thus costs one
// goroutine here (blocked reading the SSH channel) instead of two. Where
// parking is not available the direction gets a goroutine of its own as
// before. Either way Splice waits for it: when it returns, nothing it
// started is still running.
func Splice(ctx context.Context, a, b io.ReadWriteCloser) (aToB, bToA int64, err error) {
	// The apart direction: b -> a when b is a socket, else a -> b.
	apart := &half{dst: a, src: b}
	own := &half{dst: b, src: a}
	if socketOf(b) == nil && socketOf(a) != nil {
		apart, own = own, apart
	}
	var closeOnce sync.Once
	closeBoth := func() {
		closeOnce.Do(func() {
			_ = a.Close()
			_ = b.Close()
			// A parked direction's socket left the poller with its
			// close: resume it, its Read reports the close.
			apart.unpark()
		})
	}
	stop := context.AfterFunc(ctx, closeBoth)
	defer stop()

	done := make(chan struct{})
	apart.onDone = func() {
		if apart.err != nil {
			closeBoth()
		}
		close(done)
	}
	if ds, ok := apart.src.(interface{ SetReadDeadline(time.Time) error }); ok {
		apart.park = parkerFor(apart.src)
		apart.deadline = ds.SetReadDeadline
	}
	apart.wait = readWaiter(apart.src)
	go apart.run()
	own.wait = readWaiter(own.src)
	own.run()
	if own.err != nil {
		closeBoth()
	}
	<-done
	closeBoth()
	if apart.src == b {
		aToB, bToA = own.n, apart.n
	} else {
		aToB, bToA = apart.n, own.n
	}

	if ctx.Err() != nil {
		return aToB, bToA, ctx.Err()
	}
	// Errors caused by our own Close (the other direction failed first)
	// are noise; report the first real one.
	errAB, errBA := own.err, apart.err
	if apart.src != b {
		errAB, errBA = apart.err, own.err
	}
	for _, e := range []error{errAB, errBA} {
		if e != nil && !isClosedErr(e) {
			return aToB, bToA, e
		}
	}
	return aToB, bToA, nil
}

// half is one direction of a splice: it copies src to dst and half-closes
// dst at EOF (n, err: bytes copied and a non-EOF error).
//
// It reads into a small buffer while the stream is quiet and a full-size
// pooled one while it is busy (a Read filled the small one), giving the big
// one back as soon as a Read comes back short, before blocking again. A
// socket waits with no buffer at all: in the poller (park) once it has
// been quiet for SpliceParkAfter, when the direction may leave its
// goroutine, else in the runtime's netpoller (wait). (Our own loop rather than io.CopyBuffer, which would
// also bypass any buffer when *net.TCPConn's ReaderFrom/WriterTo are
// visible.)
type half struct {
	dst, src io.ReadWriteCloser
	// wait blocks until src has something to report (nil: Read blocks).
	wait func()
	// park, when set, hands the direction to the poller while src is
	// quiet: false means src is readable now (or closed), go on reading.
	park func(h *half) (parked bool)
	// deadline sets src's read deadline (with park): the idle clock.
	deadline func(time.Time) error
	onDone   func() // called once when the direction has ended

	mu     sync.Mutex
	parked *parkedRead // set while in the poller
	// polled says src is registered in the poller (parkRead's state),
	// armed that src has an idle deadline set, moved that data was read
	// since it was set; all touched only by the goroutine running the
	// direction.
	polled, armed, moved bool

	small, big *[]byte
	n          int64
	err        error
}

// unpark resumes a direction that is in the poller (Splice closed its
// socket, which takes it out of the poller without an event).
func (h *half) unpark() {
	h.mu.Lock()
	p := h.parked
	h.mu.Unlock()
	if p != nil {
		p.fire()
	}
}

// run copies until the stream ends, or until src has been quiet for
// SpliceParkAfter and the direction is parked (then a new goroutine runs
// it again later).
//
// A parkable direction blocks in Read with its small buffer, exactly like
// an unparkable one, under a read deadline set once per SpliceParkAfter:
// when the deadline passes and data moved meanwhile (or the direction is
// busy), it is set again; when nothing moved for a whole period, the
// direction gives its buffer back and parks. The hot path (a handshake,
// a busy copy) thus costs no syscall beyond the Read and the Write.
func (h *half) run() {
	for {
		if h.big == nil && h.small == nil {
			if h.park != nil {
				if !h.armed {
					// An error here (src closed) is the Read's to report.
					_ = h.deadline(spliceClock.Now().Add(SpliceParkAfter))
					h.armed, h.moved = true, false
				}
			} else if h.wait != nil {
				h.wait() // quiet: no buffer until there is data
			}
			h.small = idleBufferPool.Get().(*[]byte)
		}
		var buf []byte
		if h.big != nil {
			buf = *h.big
		} else {
			buf = *h.small
		}
		n, rerr := h.src.Read(buf)
		if n > 0 {
			h.moved = true
			wn, werr := h.dst.Write(buf[:n])
			h.n += int64(wn)
			if werr != nil {
				h.finish(werr)
				return
			}
			if wn != n {
				h.finish(io.ErrShortWrite)
				return
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil && h.armed && errors.Is(rerr, os.ErrDeadlineExceeded) {
			// Our idle deadline, not a failure: nothing was read.
			if h.moved || h.big != nil {
				// Data in the last period: not idle yet.
				_ = h.deadline(spliceClock.Now().Add(SpliceParkAfter))
				h.moved = false
				continue
			}
			// Quiet for a whole period: park, without a buffer.
			h.armed = false
			_ = h.deadline(time.Time{})
			if h.small != nil {
				idleBufferPool.Put(h.small)
				h.small = nil
			}
			if h.park(h) {
				return
			}
			continue // readable (or closed) already: read
		}
		if rerr != nil {
			h.finish(rerr)
			return
		}
		switch {
		case h.big == nil && n == len(buf):
			h.big = bufferPool.Get().(*[]byte)
		case h.big != nil && n < idleBufferSize:
			bufferPool.Put(h.big)
			h.big = nil
		}
		// The small buffer is held across a Read only where nothing else
		// can wait: busy directions use the big one, a socket that cannot
		// park is waited on without one, and one that can park gives it
		// back when it does.
		if h.small != nil && (h.big != nil || (h.wait != nil && h.park == nil)) {
			idleBufferPool.Put(h.small)
			h.small = nil
		}
	}
	if cw, ok := h.dst.(closeWriter); ok {
		if err := cw.CloseWrite(); err != nil && !isClosedErr(err) {
			h.finish(err)
			return
		}
		h.finish(nil)
		return
	}
	h.finish(h.dst.Close())
}

// finish gives the buffers back and reports the end.
func (h *half) finish(err error) {
	if h.small != nil {
		idleBufferPool.Put(h.small)
		h.small = nil
	}
	if h.big != nil {
		bufferPool.Put(h.big)
		h.big = nil
	}
	h.err = err
	if h.onDone != nil {
		h.onDone()
	}
}

// buffered reports bytes a wrapper of src holds already read from its
// socket (a conn that replays what it peeked): src is readable whatever
// the socket says.
func buffered(src io.Reader) bool {
	for src != nil {
		if b, ok := src.(interface{ Buffered() int }); ok && b.Buffered() > 0 {
			return true
		}
		u, ok := src.(interface{ Unwrap() net.Conn })
		if !ok {
			return false
		}
		src = u.Unwrap()
	}
	return false
}

// socketOf finds the socket under src, looking through wrappers that
// expose Unwrap() net.Conn; nil when there is none.
func socketOf(src io.Reader) syscall.RawConn {
	for src != nil {
		if sc, ok := src.(syscall.Conn); ok {
			raw, err := sc.SyscallConn()
			if err != nil {
				return nil
			}
			return raw
		}
		u, ok := src.(interface{ Unwrap() net.Conn })
		if !ok {
			return nil
		}
		src = u.Unwrap()
	}
	return nil
}

// isClosedErr reports errors that only say "this side is already closed":
// after one direction fails, Splice closes both sides, and the other
// direction's resulting error is noise.
func isClosedErr(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrClosedPipe) || errors.Is(err, os.ErrClosed)
}

// CloseSpliced closes c, a connection a Splice may be reading, from outside
// that Splice (a tunnel that ended closes its data connections). A Splice
// direction that went quiet waits in the poller with no goroutine, and
// closing a socket takes it out of every epoll set without an event: the
// direction would never learn of the close, and the other side of the
// splice (an idle client's channel) would stay open until its own peer
// hung up. So the directions parked on the socket under c (found through
// Unwrap) are ended first, as if their Read had failed on the closed
// socket, which makes their splices close both sides; then c is closed.
// A direction not parked is woken by the Close itself. Splice's own
// closes need none of this (it resumes its parked direction itself).
func CloseSpliced(c io.Closer) error {
	if r, ok := c.(io.Reader); ok {
		if raw := socketOf(r); raw != nil {
			endParked(raw)
		}
	}
	// The splice a parked direction ended closes c itself, and may do so
	// before this Close: c is closed either way, which is what was asked.
	if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}
