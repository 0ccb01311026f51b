package client

import (
	"context"
	"net"
	"sync"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/utils"
)

// Forwarder runs -L and -R forwards for one node connection. It owns its
// listeners and every copy goroutine; Close stops them and waits.
type Forwarder struct {
	clt *ssh.Client
	// mu guards listeners and conns.
	mu        sync.Mutex
	listeners []net.Listener
	conns     map[net.Conn]struct{}
	closed    bool
	wg        sync.WaitGroup
	// OnError reports a forward that failed (one connection); nil drops.
	OnError func(error)
}

// NewForwarder makes a forwarder for clt.
func NewForwarder(clt *ssh.Client) *Forwarder {
	return &Forwarder{clt: clt, conns: map[net.Conn]struct{}{}}
}

// Local starts -L: listen on the local bind address, and for each
// connection open a direct-tcpip channel to HOST:HOSTPORT from the node.
func (f *Forwarder) Local(spec ForwardSpec) (net.Addr, error) {
	ln, err := net.Listen("tcp", spec.bind())
	if err != nil {
		return nil, trace.Wrap(err, "-L %s", spec.bind())
	}
	f.serve(ln, func() (net.Conn, error) { return f.clt.Dial("tcp", spec.target()) })
	return ln.Addr(), nil
}

// Remote starts -R: ask the node to listen (tcpip-forward), and connect
// each forwarded connection to HOST:HOSTPORT from here.
func (f *Forwarder) Remote(spec ForwardSpec) (net.Addr, error) {
	ln, err := f.clt.Listen("tcp", spec.bind())
	if err != nil {
		return nil, trace.Wrap(err, "-R %s refused", spec.bind())
	}
	f.serve(ln, func() (net.Conn, error) { return net.Dial("tcp", spec.target()) })
	return ln.Addr(), nil
}

func (f *Forwarder) serve(ln net.Listener, dial func() (net.Conn, error)) {
	f.serveConn(ln, func(net.Conn) (net.Conn, error) { return dial() })
}

// serveConn accepts on ln and splices each connection with what dial
// returns for it (dial may talk to the connection first, as -D does).
func (f *Forwarder) serveConn(ln net.Listener, dial func(in net.Conn) (net.Conn, error)) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		ln.Close()
		return
	}
	f.listeners = append(f.listeners, ln)
	f.wg.Add(1)
	f.mu.Unlock()
	go func() {
		defer f.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			if !f.track(in) {
				in.Close()
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer f.untrack(in)
				out, err := dial(in)
				if err != nil {
					in.Close()
					if f.OnError != nil {
						f.OnError(err)
					}
					return
				}
				if !f.track(out) {
					in.Close()
					out.Close()
					return
				}
				defer f.untrack(out)
				// The forwarder owns the splice (Close ends it through track), not the accept.
				if _, _, err := utils.Splice(context.Background(), in, out); err != nil && f.OnError != nil {
					f.OnError(err)
				}
			}()
		}
	}()
}

func (f *Forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	c.Close()
}

// Close stops listening, closes forwarded connections and waits.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	f.closed = true
	for _, ln := range f.listeners {
		ln.Close()
	}
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	return nil
}
