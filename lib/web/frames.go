package web

import "github.com/postern-dev/postern/lib/api/webterm"

// The terminal's wire types live in the leaf package lib/api/webterm; these
// names keep the callers that predate the move (integration tests, bench)
// compiling. New code uses webterm directly.
const (
	TerminalSubprotocol = webterm.TerminalSubprotocol
	FrameData           = webterm.FrameData
	FrameResize         = webterm.FrameResize
	FrameError          = webterm.FrameError
	FrameClose          = webterm.FrameClose
	FramePing           = webterm.FramePing
	FramePong           = webterm.FramePong
	MaxFrameSize        = webterm.MaxFrameSize
)

type (
	Frame          = webterm.Frame
	TermSize       = webterm.TermSize
	CloseMessage   = webterm.CloseMessage
	TerminalParams = webterm.TerminalParams
)

var (
	DecodeFrame          = webterm.DecodeFrame
	EncodeFrame          = webterm.EncodeFrame
	DecodeResize         = webterm.DecodeResize
	DecodeTerminalParams = webterm.DecodeTerminalParams
)
