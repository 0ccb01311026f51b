package integration

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/events"
)

// junkConns opens n connections from source to addr (at most 64 at
// once), each sending 16 junk bytes, half-closing and reading until the
// server hangs up: the server has audited, or counted, each refusal by
// then.
func junkConns(t *testing.T, source, addr string, n int) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 5 * time.Second}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := d.Dial("tcp", addr)
			if err != nil {
				t.Errorf("dial %s: %v", addr, err)
				return
			}
			defer c.Close()
			_, _ = c.Write([]byte("0123456789abcdef"))
			_ = c.(*net.TCPConn).CloseWrite()
			_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
			_, _ = io.Copy(io.Discard, c)
		}()
	}
	wg.Wait()
}

// refusalsFrom are the access.denied and conn.refused events of the
// tunnel and peer ports whose remote address is source.
func refusalsFrom(evs []events.Event, source string) []events.Event {
	var out []events.Event
	for _, e := range evs {
		addr, _ := e.Fields[events.FieldRemoteAddr].(string)
		if !strings.HasPrefix(addr, source+":") {
			continue
		}
		kind, _ := e.Fields[events.FieldKind].(string)
		listener, _ := e.Fields[events.FieldListener].(string)
		if (e.Type == events.AccessDenied && (kind == "tunnel" || kind == "peer")) ||
			(e.Type == events.ConnRefused && (listener == "tunnel" || listener == "peer")) {
			out = append(out, e)
		}
	}
	return out
}

// firstOf is a few of evs, for a failure message that stays readable.
func firstOf(evs []events.Event) []events.Event { return evs[:min(len(evs), 3)] }

func countOf(e events.Event) int {
	switch n := e.Fields[events.FieldCount].(type) {
	case float64:
		return int(n)
	case int:
		return n
	case int64:
		return int(n)
	case json.Number:
		i, _ := n.Int64()
		return int(i)
	}
	return 0
}

// TestJunkFloodOnTunnelAndPeerPortsIsCoalesced is the audit flood: a real
// `postern start` process, 3000 connections from one address sending 16
// junk bytes to each of the tunnel and peer ports. The audit log gets a
// bounded handful of events for them (the first failed handshake of each
// port at once, with its reason; whatever the connection caps refused at
// accept, once), not one per connection; another address's first failure
// is still audited at once; and the repeats are one summary per port
// carrying their count, written when the window ends (here: at shutdown).
func TestJunkFloodOnTunnelAndPeerPortsIsCoalesced(t *testing.T) {
	const n, bound = 3000, 10
	dir := t.TempDir()
	tunnelAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	peerAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	d := startDaemonAt(t, dir, tunnelAddr, peerAddr)
	for _, addr := range []string{tunnelAddr, peerAddr} {
		require.Eventually(t, func() bool {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				c.Close()
			}
			return err == nil
		}, 20*time.Second, 50*time.Millisecond, "%s listens", addr)
	}
	// The readiness probes above came from 127.0.0.1; the flood comes
	// from 127.0.0.2.
	start := time.Now()
	junkConns(t, "127.0.0.2", tunnelAddr, n)
	junkConns(t, "127.0.0.2", peerAddr, n)
	t.Logf("%d junk connections to each port in %v", n, time.Since(start))
	// Another address during the flood: its first is audited at once.
	// The audit log is written in order, so once these are searchable,
	// everything the flood caused before them is too.
	junkConns(t, "127.0.0.3", tunnelAddr, 1)
	junkConns(t, "127.0.0.3", peerAddr, 1)
	var all []events.Event
	require.Eventually(t, func() bool {
		all = eventsLs(t, dir)
		return len(refusalsFrom(all, "127.0.0.3")) == 2
	}, 20*time.Second, 100*time.Millisecond, "the other address's refusals are audited at once")

	flood := refusalsFrom(all, "127.0.0.2")
	require.LessOrEqual(t, len(flood), bound, "audit events for %d junk connections per port (the first: %v)", n, firstOf(flood))
	var tunnelFirst, peerFirst bool
	for _, e := range flood {
		if e.Type != events.AccessDenied {
			continue
		}
		require.Equal(t, 1, countOf(e), "reported at once: %v", e)
		reason, _ := e.Fields[events.FieldReason].(string)
		switch e.Fields[events.FieldKind] {
		case "tunnel":
			tunnelFirst = true
			require.Contains(t, reason, "tunnel handshake failed")
		case "peer":
			peerFirst = true
			require.Contains(t, reason, "peer TLS handshake failed")
		}
	}
	require.True(t, tunnelFirst && peerFirst, "the first failed handshake of each port is audited at once: %v", flood)

	// SIGTERM: the servers close, writing the window's summaries before
	// the audit log closes.
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-d.done:
		d.done <- err
		require.NoError(t, err, "exit after SIGTERM: %s", d.stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatal("postern did not exit after SIGTERM")
	}
	data, err := os.ReadFile(filepath.Join(dir, "log", "events.log"))
	require.NoError(t, err)
	var logged []events.Event
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var e events.Event
		require.NoError(t, json.Unmarshal([]byte(line), &e), line)
		logged = append(logged, e)
	}
	flood = refusalsFrom(logged, "127.0.0.2")
	require.LessOrEqual(t, len(flood), bound, "events.log entries for %d junk connections per port (the first: %v)", n, firstOf(flood))
	summaries := map[string]int{}
	for _, e := range flood {
		reason, _ := e.Fields[events.FieldReason].(string)
		if e.Type == events.AccessDenied && strings.Contains(reason, "more times within 1m0s; the latest: ") {
			summaries[e.Fields[events.FieldKind].(string)] = countOf(e)
		}
	}
	t.Logf("summaries: %v; events for the flood: %d", summaries, len(flood))
	require.Greater(t, summaries["tunnel"], 1, "the tunnel port's repeats are summed up: %v", flood)
	require.Greater(t, summaries["peer"], 1, "the peer port's repeats are summed up: %v", flood)
}
