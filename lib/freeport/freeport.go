// Package freeport picks loopback TCP ports for tests whose servers must
// be told a port before they listen: an etcd member's peer URL is written
// into every member's initial-cluster setting, OpenSSH's -L takes a number,
// and a daemon restarted in a test must come back on the port its clients
// know.
//
// The usual trick, listening on port 0 and closing, hands out a port from
// the ephemeral range. The kernel gives that same range to every other
// port-0 listener and to the local end of every outgoing connection, and
// `go test ./...` runs packages in parallel, so between the pick and the
// bind another test takes the port often enough to turn CI red (seen: an
// etcd member failing with "bind: address already in use"). A port below
// the ephemeral range is only ever taken by an explicit bind, and the
// ports handed out here are random, checked free by binding, and never
// handed out twice by one process.
//
// RefusedAddr is the other half: an address that must refuse connections
// (a node that is gone) for the whole test.
package freeport

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// lowest is the bottom of the range picked from: clear of the well-known
// ports and of the 1024-9999 band where development servers cluster.
const lowest = 10000

var (
	mu     sync.Mutex
	picked = map[int]bool{}
)

// Port returns a loopback TCP port that is free now, outside the
// ephemeral range when this system says where that range is. It fails
// the test when none can be found.
func Port(tb testing.TB) int {
	tb.Helper()
	lo, hi := pickRange()
	mu.Lock()
	defer mu.Unlock()
	if hi > lo {
		for i := 0; i < 200; i++ {
			p := lo + rand.IntN(hi-lo)
			if picked[p] || !free(p) {
				continue
			}
			picked[p] = true
			return p
		}
	}
	// No range below the ephemeral one (or all of it busy): the kernel's
	// pick, with the race this package exists to avoid.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("freeport: no free loopback port: %v", err)
	}
	defer ln.Close()
	p := ln.Addr().(*net.TCPAddr).Port
	picked[p] = true
	return p
}

// Addr is Port as "127.0.0.1:PORT".
func Addr(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(Port(tb)))
}

// free reports whether port can be bound on loopback now.
func free(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// pickRange is [lowest, start of the ephemeral range), from Linux's
// ip_local_port_range; empty where that cannot be read.
func pickRange() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0
	}
	start, err := strconv.Atoi(f[0])
	if err != nil {
		return 0, 0
	}
	return rangeBelow(start)
}

// rangeBelow is the pick range for an ephemeral range starting at start:
// empty when start leaves no room above lowest.
func rangeBelow(start int) (lo, hi int) {
	if start <= lowest {
		return 0, 0
	}
	return lowest, start
}
