// Package peer is proxy peering (several proxies and auth servers): a
// proxy that has no tunnel from a node asks a peer proxy that
// holds one to dial it, the shape of seed 003's "routing kas -> gateway
// kas -> agent". The Server listens on peer_addr (default 0.0.0.0:3021);
// the Client keeps one connection per peer and opens one stream per dial.
//
// Trust: mutual TLS with the cluster's TLS CA. Both ends present their
// proxy identity (the X.509 certificate of role proxy that auth issued at
// join, CN = the proxy's UUID) and both ends check the other's: signed by
// the cluster CA, valid now, role (O) proxy, cluster (OU) ours; the dialing
// end also checks that CN is the UUID it meant to reach (the one named in
// the tunnel_connection lease it routes by). The check is ours rather than
// crypto/tls's hostname verification on purpose: a peer is identified by
// its UUID, not a DNS name, and proxy certificates are client-only (only
// the auth server's carries the server-auth key usage, which is what pins
// auth.postern), so the verifier asks for the client-auth usage on both
// sides. Nodes, admins and auth hold certificates of the same CA; only
// role proxy is admitted.
//
// Multiplexing: github.com/hashicorp/yamux over the TLS connection. It is
// small, long-lived (Consul, Nomad, Vault), has per-stream flow control, and
// its Close is exactly a half-close (FIN; the stream stays readable until
// the other side's FIN), which the spliced SSH connections need. HTTP/2
// streams would do too, but half-close and raw bytes there mean fighting
// request/response semantics (bodies, trailers, flushes) for nothing.
//
// A stream starts with a DialRequest frame, answered by a DialResponse
// frame, then carries the raw bytes of the user's connection to the node.
// A peered dial is served only from a tunnel on the receiving proxy, never
// routed again: the Server has no Router, so loops cannot be built.
package peer

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"strings"
	"unicode"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/observe"
)

// DefaultListenAddr is peer_addr's default.
const DefaultListenAddr = "0.0.0.0:3021"

// RoleProxy is the only role admitted on the peer port.
const RoleProxy = "proxy"

// maxFrame bounds a request or response frame: node UUIDs and addresses
// are short, and a peer must not make us allocate on its say-so.
const maxFrame = 4096

// Field limits of a DialRequest.
const (
	maxUUID = 256
	maxAddr = 512
)

// DialRequest is the first frame of a stream: which node to dial over the
// receiving proxy's tunnel, and for whom (for the node's audit log).
type DialRequest struct {
	// NodeUUID is the node whose tunnel the receiving proxy must hold.
	NodeUUID string `json:"node_uuid"`
	// Source is the client's address as the first proxy saw it.
	Source string `json:"source,omitempty"`
	// Destination is the target the client asked for.
	Destination string `json:"destination,omitempty"`
	// Meta is the dialing proxy's trace context and connection id. Only
	// sent on a connection that negotiated ALPNv2: an older peer
	// decodes frames strictly and would refuse the dial.
	Meta *observe.DialMeta `json:"meta,omitempty"`
}

// ALPNv2 is the TLS ALPN protocol of a peer that takes
// DialRequest.Meta. A peer without it (an older proxy) negotiates none,
// and is sent version 1 requests (no Meta); both ends offer it, so a
// mixed cluster keeps peering during an upgrade.
const ALPNv2 = "postern-peer/2"

// meta is the request's dial metadata with what is malformed dropped,
// and the error naming it: a bad field costs the trace, never the dial.
func (r DialRequest) meta() (observe.DialMeta, error) {
	if r.Meta == nil {
		return observe.DialMeta{}, nil
	}
	m, err := r.Meta.Sanitize()
	return m, trace.Wrap(err)
}

// Check validates a request; its error names the bad field.
func (r DialRequest) Check() error {
	if r.NodeUUID == "" {
		return trace.BadParameter("peer dial request: missing node_uuid")
	}
	if len(r.NodeUUID) > maxUUID || !printable(r.NodeUUID) || strings.ContainsAny(r.NodeUUID, "/ ") {
		return trace.BadParameter("peer dial request: node_uuid %q is not a UUID", r.NodeUUID)
	}
	if len(r.Source) > maxAddr || !printable(r.Source) {
		return trace.BadParameter("peer dial request: source is not an address")
	}
	if len(r.Destination) > maxAddr || !printable(r.Destination) {
		return trace.BadParameter("peer dial request: destination is not an address")
	}
	return nil
}

func printable(s string) bool {
	for _, r := range s {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// DialResponse answers a DialRequest: an empty Error means the node is
// connected and raw bytes follow.
type DialResponse struct {
	// Error says why the dial failed, for the first proxy to pass on.
	Error string `json:"error,omitempty"`
	// Kind classifies Error: "not_found" (no tunnel from that node here),
	// "bad_parameter", "connection_problem".
	Kind string `json:"kind,omitempty"`
}

// Kinds of DialResponse.Kind.
const (
	kindNotFound          = "not_found"
	kindBadParameter      = "bad_parameter"
	kindConnectionProblem = "connection_problem"
)

func responseFor(err error) DialResponse {
	if err == nil {
		return DialResponse{}
	}
	kind := kindConnectionProblem
	switch {
	case trace.IsNotFound(err):
		kind = kindNotFound
	case trace.IsBadParameter(err):
		kind = kindBadParameter
	}
	return DialResponse{Error: trace.UserMessage(err), Kind: kind}
}

// Err turns a failed response back into a classified error.
func (r DialResponse) Err() error {
	if r.Error == "" && r.Kind == "" {
		return nil
	}
	switch r.Kind {
	case kindNotFound:
		return trace.NotFound("%s", r.Error)
	case kindBadParameter:
		return trace.BadParameter("%s", r.Error)
	}
	return trace.ConnectionProblem(nil, "%s", r.Error)
}

// A frame is a 2-byte big-endian length and that many bytes of JSON.
func writeFrame(w io.Writer, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return trace.Wrap(err)
	}
	if len(data) > maxFrame {
		return trace.BadParameter("peer frame of %d bytes exceeds %d", len(data), maxFrame)
	}
	buf := make([]byte, 2+len(data))
	binary.BigEndian.PutUint16(buf, uint16(len(data)))
	copy(buf[2:], data)
	_, err = w.Write(buf)
	return trace.Wrap(err)
}

func readFrame(r io.Reader, v any) error {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return trace.BadParameter("peer frame: reading its length: %v", err)
	}
	n := int(binary.BigEndian.Uint16(hdr[:]))
	if n == 0 || n > maxFrame {
		return trace.BadParameter("peer frame: length %d is not in 1..%d", n, maxFrame)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r, data); err != nil {
		return trace.BadParameter("peer frame: short body (%d bytes announced): %v", n, err)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return trace.BadParameter("peer frame: not the expected JSON: %v", err)
	}
	if dec.More() {
		return trace.BadParameter("peer frame: trailing data after the JSON object")
	}
	return nil
}

// ParseDialRequest reads and validates a stream's first frame.
func ParseDialRequest(r io.Reader) (DialRequest, error) {
	var req DialRequest
	if err := readFrame(r, &req); err != nil {
		return DialRequest{}, trace.Wrap(err)
	}
	if err := req.Check(); err != nil {
		return DialRequest{}, trace.Wrap(err)
	}
	return req, nil
}
