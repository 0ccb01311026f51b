package integration

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
)

// floodIdle opens n raw TCP connections from source to addr that send
// nothing (the attack: idle sockets held open on a port that authenticates
// later), and returns them.
func floodIdle(t *testing.T, source, addr string, n int) []net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 5 * time.Second}
	conns := make([]net.Conn, 0, n)
	for range n {
		c, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return conns
}

// stillOpen reports, for each connection, whether the server still holds
// it: nothing read and no end within wait. A refused connection ends at
// once (after a refusal line on an SSH port).
func stillOpen(conns []net.Conn, wait time.Duration) []bool {
	open := make([]bool, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(wait))
			_, err := io.Copy(io.Discard, c)
			var ne net.Error
			open[i] = errors.As(err, &ne) && ne.Timeout()
		}()
	}
	wg.Wait()
	return open
}

func count(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// TestIdleFloodOnTunnelAndPeerPorts is the descriptor exhaustion attack on
// the tunnel and peer ports: hundreds of idle TCP connections from one
// address, then from several. Each port holds at most
// max_handshakes_per_ip of one address's unauthenticated connections and
// max_handshakes in all (the rest are closed at accept), closes the ones it
// held when the handshake deadline passes, and meanwhile `ssh -J` through
// the proxy SSH port still works, on a process whose descriptor budget
// (max_descriptors 200) the flood would have spent many times over.
func TestIdleFloodOnTunnelAndPeerPorts(t *testing.T) {
	const perIP, total, deadline = 20, 50, 3 * time.Second
	c := newAllInOneWith(t, func(cfg *config.Config) {
		cfg.Limits.MaxDescriptors = 200
		cfg.Limits.MaxHandshakesPerIP = perIP
		cfg.Limits.MaxHandshakes = total
		cfg.Limits.HandshakeTimeout = deadline
	})
	tunnelAddr := c.p.Addr(service.ListenerTunnel).String()
	peerAddr := c.p.Addr(service.ListenerPeer).String()
	sshAddr := c.p.Addr(service.ListenerProxySSH).String()
	cfg := c.clientConfig(t)
	cfg.Timeout = 5 * time.Second

	// One address: capped at perIP on each port.
	start := time.Now()
	tun := floodIdle(t, "127.0.0.2", tunnelAddr, 150)
	peer := floodIdle(t, "127.0.0.2", peerAddr, 150)
	tunOpen, peerOpen := stillOpen(tun, 500*time.Millisecond), stillOpen(peer, 500*time.Millisecond)
	require.Equal(t, perIP, count(tunOpen), "idle connections from one address held by the tunnel port")
	require.Equal(t, perIP, count(peerOpen), "idle connections from one address held by the peer port")

	// More addresses: capped at total on each port.
	var more []net.Conn
	for _, src := range []string{"127.0.0.3", "127.0.0.4", "127.0.0.5"} {
		more = append(more, floodIdle(t, src, tunnelAddr, 2*perIP)...)
		more = append(more, floodIdle(t, src, peerAddr, 2*perIP)...)
	}
	moreOpen := stillOpen(more, 500*time.Millisecond)
	require.Equal(t, 2*(total-perIP), count(moreOpen), "held in all: %d per port", total)

	// Meanwhile the SSH port serves sessions (each costs the budget 4
	// descriptors here: the proxy's two and the node's two).
	for i := range 5 {
		clt, err := jumpVia(t, cfg, sshAddr, c.hostname+":0")
		require.NoError(t, err, "ssh -J %d while the tunnel and peer ports are flooded", i)
		out, err := run(t, clt, "echo ok")
		require.NoError(t, err)
		require.Equal(t, "ok\n", out)
	}

	// The ones held are closed at the handshake deadline.
	var held []net.Conn
	for i, open := range tunOpen {
		if open {
			held = append(held, tun[i])
		}
	}
	for i, open := range peerOpen {
		if open {
			held = append(held, peer[i])
		}
	}
	require.Zero(t, count(stillOpen(held, time.Until(start.Add(deadline+3*time.Second)))),
		"an idle connection outlived the %v handshake deadline", deadline)
	// And the address may connect again.
	again := floodIdle(t, "127.0.0.2", tunnelAddr, 1)
	require.Equal(t, 1, count(stillOpen(again, 300*time.Millisecond)))
}

// TestDescriptorBudgetSharedByListeners: one budget (max_descriptors 20)
// for the proxy SSH, node, tunnel, peer and web ports. Sessions spend it
// (4 descriptors each in an all-in-one process: the proxy's client socket
// and node dial, the node's socket and pty); once spent, the next `ssh -J`
// and a connection to the tunnel port are both refused at accept, naming
// the budget, while what does not come through a listener (the auth API:
// pctl) goes on working; a session that ends gives its share back to any
// port.
func TestDescriptorBudgetSharedByListeners(t *testing.T) {
	c := newAllInOneWith(t, func(cfg *config.Config) { cfg.Limits.MaxDescriptors = 20 })
	sshAddr := c.p.Addr(service.ListenerProxySSH).String()
	tunnelAddr := c.p.Addr(service.ListenerTunnel).String()
	cfg := c.clientConfig(t)
	cfg.Timeout = 5 * time.Second

	var held []*ssh.Client
	var refusal error
	for range 10 {
		clt, err := jumpVia(t, cfg, sshAddr, c.hostname+":0")
		if err != nil {
			refusal = err
			break
		}
		// A shell holds its pty, as a real session does.
		s, err := clt.NewSession()
		require.NoError(t, err)
		require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
		require.NoError(t, s.Start("sleep 60"))
		held = append(held, clt)
	}
	require.Len(t, held, 5, "20 descriptors, 4 per session")
	require.Error(t, refusal)
	require.Contains(t, refusal.Error(), "the file descriptor budget of 20 is spent (limits.max_descriptors")

	// The tunnel port shares the budget: refused with the reason (an SSH
	// refusal line, which a node's agent shows).
	tc, err := net.DialTimeout("tcp", tunnelAddr, 5*time.Second)
	require.NoError(t, err)
	defer tc.Close()
	_ = tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, _ := bufio.NewReader(tc).ReadString('\n')
	require.Contains(t, line, "too many connections to tunnel: the file descriptor budget of 20 is spent")

	// Nothing else in the process ran out.
	mustPctl(t, c.dataDir, "", "nodes", "ls")

	require.NoError(t, held[0].Close())
	require.Eventually(t, func() bool {
		tc, err := net.Dial("tcp", tunnelAddr)
		if err != nil {
			return false
		}
		defer tc.Close()
		open := stillOpen([]net.Conn{tc}, 200*time.Millisecond)
		return open[0]
	}, 10*time.Second, 50*time.Millisecond, "a session that ended makes room on another port")
}
