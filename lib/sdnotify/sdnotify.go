// Package sdnotify tells systemd (or any service manager speaking its
// notify protocol) about the daemon's state: READY=1 once every listener
// accepts, RELOADING=1 and READY=1 around a SIGHUP reload, STOPPING=1 when a
// shutdown starts. It speaks the documented datagram protocol (sd_notify(3)):
// one datagram of newline-separated KEY=VALUE lines to the unix socket named
// by $NOTIFY_SOCKET. Outside a Type=notify unit there is no socket and every
// call is a no-op.
package sdnotify

import (
	"fmt"
	"net"
	"os"
	"strings"
	"sync"

	"github.com/gravitational/trace"
	"golang.org/x/sys/unix"
)

// SocketEnv names the socket the service manager listens on.
const SocketEnv = "NOTIFY_SOCKET"

// Notifier sends state changes; the zero value and nil send nothing.
type Notifier struct {
	mu   sync.Mutex
	addr *net.UnixAddr
}

// FromEnv reads $NOTIFY_SOCKET and removes it from the environment, so
// that the processes this daemon starts (login shells, the sftp child)
// neither inherit it nor can pose as the daemon. Call it once, early.
func FromEnv() *Notifier {
	path := os.Getenv(SocketEnv)
	os.Unsetenv(SocketEnv)
	return New(path)
}

// New is a notifier sending to the socket at path: a filesystem path, or
// an abstract socket name starting with '@'. An empty path sends nothing.
func New(path string) *Notifier {
	if path == "" {
		return &Notifier{}
	}
	// Go maps a leading '@' to Linux's abstract namespace itself.
	return &Notifier{addr: &net.UnixAddr{Name: path, Net: "unixgram"}}
}

// Enabled reports whether a service manager is listening.
func (n *Notifier) Enabled() bool { return n != nil && n.addr != nil }

// Ready says start-up is over (Type=notify units are "active" from here),
// or that a reload finished; status is shown by `systemctl status`.
func (n *Notifier) Ready(status string) error {
	return n.Send("READY=1", "STATUS="+status)
}

// Reloading says a reload started. MONOTONIC_USEC is what Type=notify-reload
// units need to match the reload to their request; Type=notify ignores it.
func (n *Notifier) Reloading() error {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return n.Send("RELOADING=1")
	}
	return n.Send("RELOADING=1", fmt.Sprintf("MONOTONIC_USEC=%d", ts.Nano()/1000))
}

// Stopping says a shutdown started (sessions are draining).
func (n *Notifier) Stopping(status string) error {
	return n.Send("STOPPING=1", "STATUS="+status)
}

// Status updates the free-form status line only.
func (n *Notifier) Status(status string) error {
	return n.Send("STATUS=" + status)
}

// Send writes one datagram of the given KEY=VALUE lines.
func (n *Notifier) Send(lines ...string) error {
	if !n.Enabled() {
		return nil
	}
	for i, l := range lines {
		// A newline inside a value would start a new assignment.
		lines[i] = strings.ReplaceAll(l, "\n", " ")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	conn, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return trace.ConnectionProblem(err, "notifying the service manager on %s: %v", n.addr.Name, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(strings.Join(lines, "\n") + "\n")); err != nil {
		return trace.ConnectionProblem(err, "notifying the service manager on %s: %v", n.addr.Name, err)
	}
	return nil
}
