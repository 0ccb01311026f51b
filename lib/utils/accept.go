package utils

import (
	"net"

	"github.com/gravitational/trace"
)

// AcceptLoop is the accept loop Postern's SSH servers share (the node and
// proxy SSH server in lib/srv, the reverse tunnel server): accept until
// the listener fails, serve each connection in its own goroutine counted
// by the owner, and tell a shutdown (the owner closed the listener) from
// a failure.
//
// Begin and End are the owner's accounting, normally a WaitGroup's Add
// and Done, with Begin checking under the owner's lock that it is not
// closing: a connection accepted while Close runs is closed at once
// instead of slipping past Close's wait.
type AcceptLoop struct {
	// Listener is accepted on; required.
	Listener net.Listener
	// What names the connections in the error ("SSH connections").
	What string
	// Begin reports whether a new connection may be served (false once
	// the owner is closing) and, if so, counts it; required.
	Begin func() bool
	// Handle serves one connection; End runs after it returns. Required.
	Handle func(net.Conn)
	End    func()
	// Closing reports whether the owner is shutting down; required.
	Closing func() bool
	// ErrClosed is returned when the loop ends because of a shutdown.
	ErrClosed error
}

// Run accepts until the listener fails; it returns ErrClosed after a
// shutdown and a ConnectionProblem otherwise.
func (l AcceptLoop) Run() error {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			if l.Closing() {
				return l.ErrClosed
			}
			return trace.ConnectionProblem(err, "accepting %s on %v", l.What, l.Listener.Addr())
		}
		if !l.Begin() {
			_ = nc.Close()
			return l.ErrClosed
		}
		go func() {
			defer l.End()
			l.Handle(nc)
		}()
	}
}
