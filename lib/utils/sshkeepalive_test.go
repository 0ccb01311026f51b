package utils

import (
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// freezableRelay forwards TCP to target until frozen; then it stops
// reading and writing both ways while keeping the connections open: a
// peer that froze after the handshake (SIGSTOP, a paused VM).
type freezableRelay struct {
	ln     net.Listener
	target string
	frozen chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

func newFreezableRelay(t *testing.T, target string) *freezableRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &freezableRelay{ln: ln, target: target, frozen: make(chan struct{})}
	r.wg.Go(r.serve)
	t.Cleanup(func() {
		ln.Close()
		r.freeze()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *freezableRelay) freeze() { r.once.Do(func() { close(r.frozen) }) }

func (r *freezableRelay) serve() {
	for {
		a, err := r.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", r.target)
		if err != nil {
			a.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, a, b)
		r.mu.Unlock()
		r.wg.Go(func() { r.pipe(b, a) })
		r.wg.Go(func() { r.pipe(a, b) })
	}
}

// pipe copies src to dst one read at a time, and stops forwarding (but
// keeps both open) once frozen.
func (r *freezableRelay) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-r.frozen:
			<-r.frozen
			io.Copy(io.Discard, src) // swallow until closed
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// startSSHServer is an x/crypto SSH server that answers global requests
// (refusing them, as most servers refuse keepalive@openssh.com) and
// reports each one on probes.
func startSSHServer(t *testing.T) (addr string, probes <-chan string) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	signer, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	cfg := &ssh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(signer)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ch := make(chan string, 16)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				sconn, chans, reqs, err := ssh.NewServerConn(c, cfg)
				if err != nil {
					return
				}
				defer sconn.Close()
				go func() {
					for nc := range chans {
						nc.Reject(ssh.Prohibited, "no channels")
					}
				}()
				for req := range reqs {
					select {
					case ch <- req.Type:
					default:
					}
					if req.WantReply {
						req.Reply(false, nil)
					}
				}
			})
		}
	})
	return ln.Addr().String(), ch
}

// TestKeepAliveFrozenPeer: a peer that stops answering after the handshake
// is given up after CountMax unanswered intervals, with the message psh
// prints; one that answers is kept. The intervals are real but short
// (configured through KeepAliveConfig): the test awaits probes and the
// connection's end, and checks the bound.
func TestKeepAliveFrozenPeer(t *testing.T) {
	addr, probes := startSSHServer(t)
	relay := newFreezableRelay(t, addr)
	clt, err := ssh.Dial("tcp", relay.ln.Addr().String(), &ssh.ClientConfig{
		User: "u", HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second,
	})
	require.NoError(t, err)
	defer clt.Close()
	waited := make(chan error, 1)
	go func() { waited <- clt.Wait() }()

	const interval, count = 100 * time.Millisecond, 3
	k := StartSSHKeepAlive(clt, `node "web"`, SSHKeepAliveConfig{Interval: interval, CountMax: count, Clock: clockwork.NewRealClock()})
	defer k.Close()

	// Alive: five probes answered, through as many intervals as it takes
	// to give up twice over; the connection stays.
	timeout := time.After(20 * time.Second)
	for range 5 {
		select {
		case typ := <-probes:
			require.Equal(t, "keepalive@openssh.com", typ)
		case err := <-waited:
			t.Fatalf("a peer that answers was given up: %v (%v)", err, k.Err())
		case <-timeout:
			t.Fatal("no probe reached the server")
		}
	}
	require.NoError(t, k.Err())

	// Frozen: given up after count unanswered intervals, not before.
	relay.freeze()
	start := time.Now()
	select {
	case <-waited:
	case <-timeout:
		t.Fatal("the connection to the frozen peer was not closed")
	}
	took := time.Since(start)
	require.GreaterOrEqual(t, took, (count-1)*interval, "given up too early")
	require.Less(t, took, 10*interval*count, "given up too late")
	require.EqualError(t, k.Err(), `connection to node "web" lost: no answer to keep-alives for 300ms`)
}
