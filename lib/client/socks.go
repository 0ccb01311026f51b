package client

import (
	"encoding/binary"
	"io"
	"net"
	"strconv"

	"github.com/gravitational/trace"
)

// DynamicSpec is a -D spec: [BIND:]PORT, a local SOCKS5 listener whose
// connections are opened from the node (direct-tcpip), as `ssh -D`.
type DynamicSpec struct {
	BindHost string
	BindPort string
}

// ParseDynamicSpec parses [BIND:]PORT (IPv6 in brackets); the bind address
// defaults to 127.0.0.1, as OpenSSH's without GatewayPorts, and "*" means
// every address.
func ParseDynamicSpec(s string) (DynamicSpec, error) {
	parts, err := splitForward(s)
	if err != nil {
		return DynamicSpec{}, trace.BadParameter("invalid -D %q: %v (want [BIND:]PORT)", s, err)
	}
	var d DynamicSpec
	switch len(parts) {
	case 1:
		d = DynamicSpec{BindHost: "127.0.0.1", BindPort: parts[0]}
	case 2:
		d = DynamicSpec{BindHost: parts[0], BindPort: parts[1]}
	default:
		return DynamicSpec{}, trace.BadParameter("invalid -D %q: want [BIND:]PORT", s)
	}
	if d.BindHost == "" || d.BindHost == "localhost" {
		d.BindHost = "127.0.0.1"
	}
	if d.BindHost == "*" {
		d.BindHost = ""
	}
	if n, err := strconv.Atoi(d.BindPort); err != nil || n < 0 || n > 65535 {
		return DynamicSpec{}, trace.BadParameter("invalid -D %q: port %q is not a number from 0 to 65535", s, d.BindPort)
	}
	return d, nil
}

func (d DynamicSpec) bind() string { return net.JoinHostPort(d.BindHost, d.BindPort) }

// Dynamic starts -D: a SOCKS5 server (RFC 1928, CONNECT without
// authentication, which is what browsers and curl --socks5-hostname use)
// on the bind address; each request is opened from the node, which
// resolves the names, so the traffic leaves from there as with OpenSSH.
func (f *Forwarder) Dynamic(spec DynamicSpec) (net.Addr, error) {
	ln, err := net.Listen("tcp", spec.bind())
	if err != nil {
		return nil, trace.Wrap(err, "-D %s", spec.bind())
	}
	f.serveConn(ln, f.socksConnect)
	return ln.Addr(), nil
}

// SOCKS5 constants (RFC 1928).
const (
	socksVersion     = 5
	socksNoAuth      = 0
	socksNoMethod    = 0xff
	socksConnect     = 1
	socksIPv4        = 1
	socksDomain      = 3
	socksIPv6        = 4
	socksOK          = 0
	socksFailure     = 1
	socksNotAllowed  = 2
	socksCmdNotSupp  = 7
	socksAddrNotSupp = 8
)

// socksConnect runs the SOCKS5 handshake on in and returns the channel to
// the requested destination; a failed request is answered and in is left
// for the caller to close.
func (f *Forwarder) socksConnect(in net.Conn) (net.Conn, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(in, hdr[:]); err != nil {
		return nil, trace.ConnectionProblem(err, "-D: reading the SOCKS greeting: %v", err)
	}
	if hdr[0] != socksVersion {
		return nil, trace.BadParameter("-D: a client spoke SOCKS version %d; only SOCKS5 is supported", hdr[0])
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(in, methods); err != nil {
		return nil, trace.ConnectionProblem(err, "-D: reading the SOCKS methods: %v", err)
	}
	noAuth := false
	for _, m := range methods {
		noAuth = noAuth || m == socksNoAuth
	}
	if !noAuth {
		_, _ = in.Write([]byte{socksVersion, socksNoMethod})
		return nil, trace.BadParameter("-D: the SOCKS client offers no unauthenticated method")
	}
	if _, err := in.Write([]byte{socksVersion, socksNoAuth}); err != nil {
		return nil, trace.ConnectionProblem(err, "-D: %v", err)
	}
	var req [4]byte
	if _, err := io.ReadFull(in, req[:]); err != nil {
		return nil, trace.ConnectionProblem(err, "-D: reading the SOCKS request: %v", err)
	}
	reply := func(code byte) { _, _ = in.Write([]byte{socksVersion, code, 0, socksIPv4, 0, 0, 0, 0, 0, 0}) }
	if req[0] != socksVersion {
		reply(socksFailure)
		return nil, trace.BadParameter("-D: bad SOCKS request version %d", req[0])
	}
	var host string
	switch req[3] {
	case socksIPv4, socksIPv6:
		ip := make([]byte, 4)
		if req[3] == socksIPv6 {
			ip = make([]byte, 16)
		}
		if _, err := io.ReadFull(in, ip); err != nil {
			return nil, trace.ConnectionProblem(err, "-D: %v", err)
		}
		host = net.IP(ip).String()
	case socksDomain:
		var n [1]byte
		if _, err := io.ReadFull(in, n[:]); err != nil {
			return nil, trace.ConnectionProblem(err, "-D: %v", err)
		}
		name := make([]byte, n[0])
		if _, err := io.ReadFull(in, name); err != nil {
			return nil, trace.ConnectionProblem(err, "-D: %v", err)
		}
		host = string(name)
	default:
		reply(socksAddrNotSupp)
		return nil, trace.BadParameter("-D: unsupported SOCKS address type %d", req[3])
	}
	var portBuf [2]byte
	if _, err := io.ReadFull(in, portBuf[:]); err != nil {
		return nil, trace.ConnectionProblem(err, "-D: %v", err)
	}
	if req[1] != socksConnect {
		reply(socksCmdNotSupp)
		return nil, trace.BadParameter("-D: SOCKS command %d is not supported (only CONNECT)", req[1])
	}
	target := net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(portBuf[:]))))
	out, err := f.clt.Dial("tcp", target)
	if err != nil {
		reply(socksNotAllowed)
		return nil, trace.ConnectionProblem(err, "-D: the node could not open %s: %v", target, err)
	}
	reply(socksOK)
	return out, nil
}
