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

// spliceBufferSize is the copy buffer of one splice direction. 32 KiB is
// x/crypto/ssh's maximum channel packet payload, so one Read from a channel
// never needs more, and io.Copy's own default is the same size.
const spliceBufferSize = 32 * 1024

// bufferPool recycles splice buffers: a proxy carries thousands of
// long-lived pipes, and most of them are idle, so allocating a buffer per
// direction per connection would be the dominant per-session cost.
var bufferPool = sync.Pool{New: func() any {
	b := make([]byte, spliceBufferSize)
	return &b
}}

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

// copyHalf copies src to dst with a pooled buffer and half-closes dst at
// EOF. It returns a nil error on a clean end of stream.
func copyHalf(dst, src io.ReadWriteCloser) (int64, error) {
	bufp := bufferPool.Get().(*[]byte)
	defer bufferPool.Put(bufp)
	// io.CopyBuffer ignores the buffer when dst implements io.ReaderFrom or
	// src implements io.WriterTo (*net.TCPConn does both) and allocates
	// its own; hiding those methods keeps the pooled buffer in use.
	n, err := io.CopyBuffer(writerOnly{dst}, readerOnly{src}, *bufp)
	if err != nil {
		return n, err
	}
	if cw, ok := dst.(closeWriter); ok {
		if err := cw.CloseWrite(); err != nil && !isClosedErr(err) {
			return n, err
		}
		return n, nil
	}
	return n, dst.Close()
}

type writerOnly struct{ io.Writer }

type readerOnly struct{ io.Reader }

// isClosedErr reports errors that only say "this side is already closed":
// after one direction fails, Splice closes both sides, and the other
// direction's resulting error is noise.
func isClosedErr(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrClosedPipe) || errors.Is(err, os.ErrClosed)
}
