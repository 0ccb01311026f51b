// Package webterm is the wire protocol of the web terminal (GET
// /webapi/terminal): the websocket's frames, the terminal params and the
// first message. It is a leaf: it imports nothing of Postern's servers, so
// a client (the browser's twin in Go tests, a future CLI) can speak it
// without linking the proxy.
//
// # Framing
//
// Every binary message is one frame: a type byte, then the payload. The
// first message on the socket is text, AuthMessage as JSON; the server
// answers the text {"status":"ok"} and then binary frames.
//
// # Sequenced output and resume
//
// A client that sends "ack" in its first message (any value, 0 for a new
// terminal) speaks the resumable dialect; one that omits it gets the
// original one (raw FrameData, and the terminal ends with its socket).
// In the resumable dialect:
//
//   - Server FrameData payloads are an 8-byte big-endian unsigned sequence
//     number followed by terminal bytes. The sequence number is the offset
//     of the payload's first byte in the terminal's output stream, which
//     starts at 0 and counts every byte the shell ever wrote. So a frame
//     (seq, data) covers offsets [seq, seq+len(data)); frames are
//     contiguous and never overlap.
//   - The client sends FrameAck with an 8-byte big-endian offset: every
//     byte below it has been handed to its terminal emulator (which
//     renders what it was given, so this is what a resume needs). Acks
//     only move forward. They are advisory today: the server keeps the
//     last 1 MiB whatever the acks say, and a resume carries its own ack.
//   - Right after {"status":"ok"} and after every resume the server sends
//     FrameSession (Session as JSON): the terminal's id, the next resume
//     token, the offset output continues from and how many input bytes the
//     server has received in total.
//   - To resume, the first message carries the token and "resume" (the
//     last token of FrameSession) and "ack" (the client's offset; 0 for a
//     page that reloaded and has an empty terminal). The client answers
//     each FrameSession with an empty FrameSession: it holds the new
//     token. Until then the token it resumed with stays valid (a socket
//     lost before the client read FrameSession must not leave it holding
//     only a used token); after it, that token is used. A token is bound
//     to the web session that opened the terminal, and
//     refused (websocket close 1008, "resume refused: ...") when it is
//     unknown, used, of an ended terminal, or of another web session. The server replays [ack, end) exactly when its buffer still
//     holds it; otherwise it sends FrameRepaint (8-byte offset the repaint
//     stands for, then escape sequences that redraw the current screen,
//     alternate screen, cursor and modes) after which the client resets
//     its terminal, writes the repaint and continues from that offset, and
//     a FrameNotice saying what scrolled away.
//   - On a resume, Session.Replay marks where the replayed output ends;
//     the client must not answer the terminal queries in output below it
//     (nor in a FrameRepaint), and answers those from Replay on.
//   - Browser FrameData stays raw; the server counts the input bytes it
//     passed to the shell, and Session.Input tells a resuming client where
//     to continue: it sends the bytes beyond Input that it still holds and
//     tells the user about any it no longer holds. No keystroke reaches the
//     shell twice.
package webterm

import (
	"encoding/binary"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api"
)

// TerminalSubprotocol is the websocket subprotocol of GET /webapi/terminal.
// A client must offer it: a future incompatible framing gets a new name
// instead of confusing old pages.
const TerminalSubprotocol = "postern.v1"

// Frame types: the first byte of every binary message (docs/reference.md).
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
	// FrameAck carries the client's rendered offset (8 bytes, big
	// endian), browser to server, resumable dialect only.
	FrameAck byte = 'a'
	// FrameSession carries Session as JSON, server to browser; the
	// browser answers it empty (package doc: resume).
	FrameSession byte = 's'
	// FrameRepaint carries an 8-byte big-endian offset and a screen
	// repaint, server to browser (package doc).
	FrameRepaint byte = 'R'
	// FrameNotice carries one line of text to show beside the terminal
	// (not in it: it would corrupt a full-screen program), server to
	// browser.
	FrameNotice byte = 'n'
	// FrameEndSession, empty, browser to server: a moderator of a joined
	// session (GET /webapi/sessions/{id}/join) ends it for everyone, as
	// psh join's `Ctrl-] t` does; from anyone else it is refused.
	FrameEndSession byte = 't'
)

// seqLen is the size of a sequence number or offset on the wire.
const seqLen = 8

// EncodeSeqFrame builds a frame whose payload is an offset followed by
// data (FrameData in the resumable dialect, FrameRepaint, FrameAck).
func EncodeSeqFrame(t byte, seq uint64, data []byte) []byte {
	out := make([]byte, 1+seqLen+len(data))
	out[0] = t
	binary.BigEndian.PutUint64(out[1:], seq)
	copy(out[1+seqLen:], data)
	return out
}

// DecodeSeq splits a sequenced payload into its offset and data.
func DecodeSeq(payload []byte) (uint64, []byte, error) {
	if len(payload) < seqLen {
		return 0, nil, trace.BadParameter("sequenced payload of %d bytes is shorter than its %d-byte offset", len(payload), seqLen)
	}
	return binary.BigEndian.Uint64(payload), payload[seqLen:], nil
}

// Session is the payload of FrameSession.
type Session struct {
	// ID names the terminal (the active sessions list uses it).
	ID string `json:"id"`
	// Resume is the token that reattaches to this terminal once; a new
	// one comes with every resume.
	Resume string `json:"resume"`
	// Seq is the offset the output continues from.
	Seq uint64 `json:"seq"`
	// Input is how many input bytes the server has passed to the shell.
	Input uint64 `json:"input"`
	// GraceSeconds is how long the terminal waits for a resume after its
	// socket goes away.
	GraceSeconds int64 `json:"grace_seconds"`
	// Replay is, on a resume, the offset where the output replayed for
	// this attach ends: the bytes below it were sent to an earlier socket
	// or printed while none was attached, and the client writes them with
	// its terminal's answers to queries (device attributes, cursor
	// position, colours) dropped. Those queries were answered when they
	// were live, or nobody was there to answer them; answered again now
	// they would reach the shell as typed input. Output from Replay on is
	// live. Zero on a new terminal's first attach: the shell's start-up
	// output is live (a shell may wait for an answer).
	Replay uint64 `json:"replay,omitempty"`
}

// MaxFrameSize bounds one websocket message. Keystrokes and pastes are
// small; 64 KiB is a large paste, and a bound keeps a hostile page from
// making the proxy buffer megabytes per message. Larger messages close the
// socket with 1009 (message too big).
const MaxFrameSize = 64 << 10

// MaxTermDimension bounds cols and rows: more than any real screen, small
// enough that a pty-req never asks the node for an absurd buffer.
const MaxTermDimension = 1000

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
	if t.Cols < 1 || t.Rows < 1 || t.Cols > MaxTermDimension || t.Rows > MaxTermDimension {
		return trace.BadParameter("terminal size %dx%d out of range 1..%d", t.Cols, t.Rows, MaxTermDimension)
	}
	return nil
}

// DecodeResize parses a FrameResize payload.
func DecodeResize(payload []byte) (TermSize, error) {
	var size TermSize
	if err := api.UnmarshalStrict(payload, &size); err != nil {
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
	// Lang is the browser's locale as a POSIX locale name
	// (en_US.UTF-8), sent to the node as LANG; empty sends none (the
	// node's default applies).
	Lang string `json:"lang,omitempty"`
}

// maxLang bounds TerminalParams.Lang; real names are under 30 bytes.
const maxLang = 64

// checkLang accepts a locale name's charset only: letters, digits and
// _.@+- (no path, no shell syntax). Whether the node has the locale is
// the node's to decide.
func checkLang(v string) error {
	if len(v) > maxLang {
		return trace.BadParameter("invalid terminal params: lang longer than %d bytes", maxLang)
	}
	for _, r := range v {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case r == '_', r == '.', r == '@', r == '+', r == '-':
		default:
			return trace.BadParameter("invalid terminal params: lang %q is not a locale name (letters, digits and _.@+-)", v)
		}
	}
	return nil
}

// maxParams bounds the params JSON (it travels in the URL).
const maxParams = 2048

// DecodeTerminalParams parses and checks the terminal params.
func DecodeTerminalParams(s string) (*TerminalParams, error) {
	if len(s) > maxParams {
		return nil, trace.BadParameter("terminal params too long")
	}
	var p TerminalParams
	if err := api.UnmarshalStrict([]byte(s), &p); err != nil {
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
	if err := checkLang(p.Lang); err != nil {
		return nil, trace.Wrap(err)
	}
	return &p, nil
}

// AuthMessage is the first client message.
type AuthMessage struct {
	// Token is the web session's bearer token.
	Token string `json:"token"`
	// Resume is a resume token from FrameSession; empty opens a new
	// terminal.
	Resume string `json:"resume,omitempty"`
	// Ack is the client's rendered offset; present (even 0) selects the
	// resumable dialect.
	Ack *uint64 `json:"ack,omitempty"`
	// MFAToken is, for a new terminal to a node that needs a fresh
	// second factor per session (require_session_mfa), the token POST
	// /webapi/mfa/session/finish answered: single use, for that node and
	// login, within a minute.
	MFAToken string `json:"mfa_token,omitempty"`
}

// maxAuthMessage bounds the first message.
const maxAuthMessage = 4096

// DecodeAuthMessage parses the first message.
func DecodeAuthMessage(msg []byte) (*AuthMessage, error) {
	if len(msg) > maxAuthMessage {
		return nil, trace.BadParameter("first message too long")
	}
	var m AuthMessage
	if err := api.UnmarshalStrict(msg, &m); err != nil {
		return nil, trace.BadParameter("invalid first message: %v", err)
	}
	if m.Token == "" {
		return nil, trace.BadParameter("invalid first message: missing token")
	}
	if m.Resume != "" && m.Ack == nil {
		return nil, trace.BadParameter("invalid first message: resume without ack")
	}
	return &m, nil
}
