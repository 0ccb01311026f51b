package party

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// blockingWriter holds every write until released.
type blockingWriter struct {
	release chan struct{}
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *blockingWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestNoticesNeverBlock: a sender never waits for a writer that is not
// taking anything; once it does, it gets every notice in order; past
// the bound, notices are dropped, not held.
func TestNoticesNeverBlock(t *testing.T) {
	w := &blockingWriter{release: make(chan struct{})}
	n := NewNotices(w, 64)
	var want bytes.Buffer
	for i := range 10 {
		msg := fmt.Sprintf("n%d;", i) // 3 bytes each: all fit
		n.Send(msg)
		want.WriteString(msg)
	}
	n.Send(string(make([]byte, 65))) // over the bound: dropped
	close(w.release)
	n.Close(nil)
	require.Equal(t, want.String(), w.String())
	n.Send("late") // after Close: dropped
	require.Equal(t, want.String(), w.String())
}

// TestNoticesCloseDoesNotHang: Close gives up on a writer that never
// returns once done is closed.
func TestNoticesCloseDoesNotHang(t *testing.T) {
	w := &blockingWriter{release: make(chan struct{})}
	n := NewNotices(w, 0)
	n.Send("joined")
	done := make(chan struct{})
	close(done)
	n.Close(done)
	close(w.release) // lets the writer end (goleak)
	n.Close(nil)
	require.Equal(t, "joined", w.String())
}
