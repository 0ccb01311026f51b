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
)

// spliceBufferSize is the copy buffer of a busy splice direction. 32 KiB is
// x/crypto/ssh's maximum channel packet payload, so one Read from a channel
// never needs more, and io.Copy's own default is the same size.
const spliceBufferSize = 32 * 1024

// idleBufferSize is the buffer a quiet direction reads with. Most of a
// proxy's pipes are idle most of the time (an interactive shell, a held
// `ssh -J`), and a buffer held across a blocked Read is memory the process
// pays per connection. A socket source is waited on without any buffer
// (waitReadable), and the buffer is taken from the pool only once data is
// there; an ssh.Channel source (which has no such wait) blocks with this
// one. 1 KiB holds keystrokes, their echo and a few lines of screen, and a
// direction that fills it switches to a full buffer until it goes quiet
// again.
const idleBufferSize = 1024

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
// Splice starts one goroutine and always waits for it: when it returns,
// nothing it started is still running.
func Splice(ctx context.Context, a, b io.ReadWriteCloser) (aToB, bToA int64, err error) {
	var closeOnce sync.Once
	closeBoth := func() {
		closeOnce.Do(func() {
			_ = a.Close()
			_ = b.Close()
		})
	}
	stop := context.AfterFunc(ctx, closeBoth)
	defer stop()

	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := copyHalf(b, a)
		if err != nil {
			closeBoth()
		}
		done <- result{n, err}
	}()
	bToA, errBA := copyHalf(a, b)
	if errBA != nil {
		closeBoth()
	}
	r := <-done
	aToB = r.n
	closeBoth()

	if ctx.Err() != nil {
		return aToB, bToA, ctx.Err()
	}
	// Errors caused by our own Close (the other direction failed first)
	// are noise; report the first real one.
	for _, e := range []error{r.err, errBA} {
		if e != nil && !isClosedErr(e) {
			return aToB, bToA, e
		}
	}
	return aToB, bToA, nil
}

// copyHalf copies src to dst and half-closes dst at EOF. It returns a nil
// error on a clean end of stream.
//
// It reads into a small buffer while the stream is quiet and a full-size
// pooled one while it is busy (a Read filled the small one), giving the big
// one back as soon as a Read comes back short, before blocking again; a
// quiet socket is waited on with no buffer at all (readWaiter). (Our
// own loop rather than io.CopyBuffer, which would also bypass any buffer
// when *net.TCPConn's ReaderFrom/WriterTo are visible.)
func copyHalf(dst, src io.ReadWriteCloser) (int64, error) {
	wait := readWaiter(src)
	var small, big *[]byte
	defer func() {
		if small != nil {
			idleBufferPool.Put(small)
		}
		if big != nil {
			bufferPool.Put(big)
		}
	}()
	var total int64
	for {
		if big == nil && small == nil {
			if wait != nil {
				wait() // quiet: no buffer until there is data
			}
			small = idleBufferPool.Get().(*[]byte)
		}
		var buf []byte
		if big != nil {
			buf = *big
		} else {
			buf = *small
		}
		n, rerr := src.Read(buf)
		if n > 0 {
			wn, werr := dst.Write(buf[:n])
			total += int64(wn)
			if werr != nil {
				return total, werr
			}
			if wn != n {
				return total, io.ErrShortWrite
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return total, rerr
		}
		switch {
		case big == nil && n == len(buf):
			big = bufferPool.Get().(*[]byte)
		case big != nil && n < idleBufferSize:
			bufferPool.Put(big)
			big = nil
		}
		// The small buffer is held across a Read only where nothing else
		// can wait: busy directions use the big one, and a socket is
		// waited on without one.
		if small != nil && (big != nil || wait != nil) {
			idleBufferPool.Put(small)
			small = nil
		}
	}
	if cw, ok := dst.(closeWriter); ok {
		if err := cw.CloseWrite(); err != nil && !isClosedErr(err) {
			return total, err
		}
		return total, nil
	}
	return total, dst.Close()
}

// isClosedErr reports errors that only say "this side is already closed":
// after one direction fails, Splice closes both sides, and the other
// direction's resulting error is noise.
func isClosedErr(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrClosedPipe) || errors.Is(err, os.ErrClosed)
}
