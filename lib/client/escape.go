package client

import (
	"errors"
	"io"
)

// errEscapeDisconnect ends the stdin copy when the user typed ~. .
var errEscapeDisconnect = errors.New("disconnected by the ~. escape")

// escapeReader implements OpenSSH's escape sequences on an interactive
// session's stdin: the escape character (~) is special only right after
// a newline (or as the very first byte), so a ~ inside a line is typed as
// is. ~. disconnects (onDisconnect, then the copy ends); ~~ sends one ~;
// ~ before anything else sends both bytes, as OpenSSH does.
type escapeReader struct {
	r            io.Reader
	esc          byte
	onDisconnect func()
	// atLineStart: the last byte passed on ended a line (or none has).
	atLineStart bool
	// pending: an escape character was read at a line start and is held
	// until the next byte says what it is.
	pending bool
	buf     []byte
	// out is filtered input not yet read; err the input's error, returned
	// once out is drained.
	out  []byte
	err  error
	done bool
}

func newEscapeReader(r io.Reader, esc byte, onDisconnect func()) *escapeReader {
	return &escapeReader{r: r, esc: esc, onDisconnect: onDisconnect, atLineStart: true, buf: make([]byte, 4096)}
}

func (e *escapeReader) Read(p []byte) (int, error) {
	for len(e.out) == 0 {
		if e.done {
			return 0, errEscapeDisconnect
		}
		n, err := e.r.Read(e.buf)
		e.filter(e.buf[:n])
		if err != nil && len(e.out) == 0 {
			return 0, err
		}
		if err != nil {
			e.err = err
		}
	}
	n := copy(p, e.out)
	e.out = e.out[n:]
	if len(e.out) == 0 && e.err != nil {
		return n, e.err
	}
	return n, nil
}

// filter passes in through the escape rules into e.out.
func (e *escapeReader) filter(in []byte) {
	for _, b := range in {
		if e.done {
			return
		}
		if e.pending {
			e.pending = false
			switch b {
			case '.':
				e.done = true
				e.onDisconnect()
				return
			case e.esc:
				e.out = append(e.out, e.esc)
				e.atLineStart = false
				continue
			default:
				e.out = append(e.out, e.esc)
			}
		} else if e.atLineStart && b == e.esc {
			e.pending = true
			continue
		}
		e.out = append(e.out, b)
		e.atLineStart = b == '\r' || b == '\n'
	}
}
