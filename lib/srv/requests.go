package srv

import (
	"syscall"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"
)

// Payloads of channel and global requests (RFC 4254). They come from the
// client, so each parser is fuzzed (FuzzParseRequests).

// ptyRequest is a pty-req (RFC 4254 section 6.2).
type ptyRequest struct {
	Term     string
	Columns  uint32
	Rows     uint32
	WidthPx  uint32
	HeightPx uint32
	Modes    string
}

// windowChange is a window-change (RFC 4254 section 6.7).
type windowChange struct {
	Columns  uint32
	Rows     uint32
	WidthPx  uint32
	HeightPx uint32
}

type envRequest struct {
	Name  string
	Value string
}

type execRequest struct {
	Command string
}

type subsystemRequest struct {
	Name string
}

type signalRequest struct {
	Signal string
}

type exitStatus struct {
	Status uint32
}

type exitSignal struct {
	Signal     string
	CoreDumped bool
	Error      string
	Lang       string
}

// directTCPIPPayload is the extra data of direct-tcpip (section 7.2).
type directTCPIPPayload struct {
	Host       string
	Port       uint32
	OriginHost string
	OriginPort uint32
}

// forwardRequest is tcpip-forward / cancel-tcpip-forward (section 7.1).
type forwardRequest struct {
	Addr string
	Port uint32
}

// forwardedTCPPayload is the extra data of forwarded-tcpip (section 7.2).
type forwardedTCPPayload struct {
	Addr       string
	Port       uint32
	OriginAddr string
	OriginPort uint32
}

// maxTerminalSize bounds pty sizes: the kernel stores them as uint16, and
// a larger value would silently wrap.
const maxTerminalSize = 1<<16 - 1

func parsePtyRequest(payload []byte) (*ptyRequest, error) {
	var p ptyRequest
	if err := ssh.Unmarshal(payload, &p); err != nil {
		return nil, trace.BadParameter("malformed pty-req: %v", err)
	}
	if p.Columns > maxTerminalSize || p.Rows > maxTerminalSize {
		return nil, trace.BadParameter("pty-req: terminal size %dx%d too large", p.Columns, p.Rows)
	}
	return &p, nil
}

func parseWindowChange(payload []byte) (*windowChange, error) {
	var w windowChange
	if err := ssh.Unmarshal(payload, &w); err != nil {
		return nil, trace.BadParameter("malformed window-change: %v", err)
	}
	if w.Columns > maxTerminalSize || w.Rows > maxTerminalSize {
		return nil, trace.BadParameter("window-change: terminal size %dx%d too large", w.Columns, w.Rows)
	}
	return &w, nil
}

// signals are the names RFC 4254 section 6.10 defines.
var signals = map[string]syscall.Signal{
	"ABRT": syscall.SIGABRT, "ALRM": syscall.SIGALRM, "FPE": syscall.SIGFPE,
	"HUP": syscall.SIGHUP, "ILL": syscall.SIGILL, "INT": syscall.SIGINT,
	"KILL": syscall.SIGKILL, "PIPE": syscall.SIGPIPE, "QUIT": syscall.SIGQUIT,
	"SEGV": syscall.SIGSEGV, "TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2,
}

func parseSignal(payload []byte) (syscall.Signal, error) {
	var r signalRequest
	if err := ssh.Unmarshal(payload, &r); err != nil {
		return 0, trace.BadParameter("malformed signal request: %v", err)
	}
	sig, ok := signals[r.Signal]
	if !ok {
		return 0, trace.BadParameter("unknown signal %q", r.Signal)
	}
	return sig, nil
}

// signalName is the RFC 4254 name of sig, for exit-signal.
func signalName(sig syscall.Signal) string {
	for name, s := range signals {
		if s == sig {
			return name
		}
	}
	return "KILL"
}
