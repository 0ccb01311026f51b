package web

import (
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api"
)

// TerminalSubprotocol is the websocket subprotocol of GET /webapi/terminal.
// A client must offer it: a future incompatible framing gets a new name
// instead of confusing old pages.
const TerminalSubprotocol = "postern.v1"

// Frame types: the first byte of every binary message (SPEC.md, Web).
const (
	// FrameData carries terminal bytes, both ways.
	FrameData byte = 'r'
	// FrameResize carries {"cols","rows"} from the browser.
	FrameResize byte = 'w'
	// FrameError carries an error text to show, server to browser.
	FrameError byte = 'e'
	// FrameClose carries {"code","reason"}: the browser asks to end the
	// session, or the server says why it ended (code is the remote exit
	// status, or -1 when there is none).
	FrameClose byte = 'c'
	// FramePing carries an opaque timestamp; the peer answers FramePong
	// with the same payload, so the sender measures the round trip.
	FramePing byte = 'p'
	// FramePong answers FramePing.
	FramePong byte = 'P'
)

// MaxFrameSize bounds one websocket message. Keystrokes and pastes are
// small; 64 KiB is a large paste, and a bound keeps a hostile page from
// making the proxy buffer megabytes per message. Larger messages close the
// socket with 1009 (message too big).
const MaxFrameSize = 64 << 10

// maxTermDimension bounds cols and rows: more than any real screen, small
// enough that a pty-req never asks the node for an absurd buffer.
const maxTermDimension = 1000

// Frame is one decoded message.
type Frame struct {
	Type    byte
	Payload []byte
}

// DecodeFrame splits a binary message into its type and payload. The type
// is not checked: unknown types are the caller's to ignore (a newer page
// may send frames this proxy does not know).
func DecodeFrame(msg []byte) (Frame, error) {
	if len(msg) == 0 {
		return Frame{}, trace.BadParameter("empty frame")
	}
	if len(msg) > MaxFrameSize {
		return Frame{}, trace.LimitExceeded("frame of %d bytes exceeds %d", len(msg), MaxFrameSize)
	}
	return Frame{Type: msg[0], Payload: msg[1:]}, nil
}

// EncodeFrame is the inverse of DecodeFrame.
func EncodeFrame(t byte, payload []byte) []byte {
	out := make([]byte, 1+len(payload))
	out[0] = t
	copy(out[1:], payload)
	return out
}

// TermSize is the payload of FrameResize and part of the terminal params.
type TermSize struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// Check validates a size.
func (t TermSize) Check() error {
	if t.Cols < 1 || t.Rows < 1 || t.Cols > maxTermDimension || t.Rows > maxTermDimension {
		return trace.BadParameter("terminal size %dx%d out of range 1..%d", t.Cols, t.Rows, maxTermDimension)
	}
	return nil
}

// DecodeResize parses a FrameResize payload.
func DecodeResize(payload []byte) (TermSize, error) {
	var size TermSize
	if err := strictJSON(payload, &size); err != nil {
		return TermSize{}, trace.BadParameter("invalid resize: %v", err)
	}
	return size, trace.Wrap(size.Check())
}

// CloseMessage is the payload of FrameClose.
type CloseMessage struct {
	Code   int    `json:"code"`
	Reason string `json:"reason"`
}

// TerminalParams is the `params` query parameter of GET /webapi/terminal.
type TerminalParams struct {
	Host    string `json:"host"`
	Login   string `json:"login"`
	Cols    int    `json:"cols"`
	Rows    int    `json:"rows"`
	Cluster string `json:"cluster"`
}

// maxParams bounds the params JSON (it travels in the URL).
const maxParams = 2048

// DecodeTerminalParams parses and checks the terminal params.
func DecodeTerminalParams(s string) (*TerminalParams, error) {
	if len(s) > maxParams {
		return nil, trace.BadParameter("terminal params too long")
	}
	var p TerminalParams
	if err := strictJSON([]byte(s), &p); err != nil {
		return nil, trace.BadParameter("invalid terminal params: %v", err)
	}
	if p.Host == "" {
		return nil, trace.BadParameter("invalid terminal params: missing host")
	}
	if p.Login == "" {
		return nil, trace.BadParameter("invalid terminal params: missing login")
	}
	if err := (TermSize{Cols: p.Cols, Rows: p.Rows}).Check(); err != nil {
		return nil, trace.Wrap(err)
	}
	return &p, nil
}

// authMessage is the first client message.
type authMessage struct {
	Token string `json:"token"`
}

// strictJSON decodes exactly one object with no unknown fields: the one
// strict decoder, api.UnmarshalStrict.
func strictJSON(data []byte, v any) error {
	return trace.Wrap(api.UnmarshalStrict(data, v))
}
