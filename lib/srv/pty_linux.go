package srv

import (
	"os"
	"syscall"

	"github.com/creack/pty"
	"github.com/gravitational/trace"
	"golang.org/x/sys/unix"
)

// openPTY allocates a pty whose master is non-blocking and registered with
// the runtime poller. creack/pty leaves the master in blocking mode (its
// ioctls go through File.Fd), and a blocking read cannot be interrupted by
// Close: a background job holding the terminal would then pin the
// session's copy goroutine forever. A pollable master can be closed under
// a blocked Read, which is how wait() bounds the drain.
func openPTY() (ptmx, tty *os.File, err error) {
	p, t, err := pty.Open()
	if err != nil {
		return nil, nil, trace.Wrap(err, "allocating a pty")
	}
	fd, err := syscall.Dup(int(p.Fd()))
	p.Close()
	if err != nil {
		t.Close()
		return nil, nil, trace.ConvertSystemError(err)
	}
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		t.Close()
		return nil, nil, trace.ConvertSystemError(err)
	}
	return os.NewFile(uintptr(fd), "/dev/ptmx"), t, nil
}

// setWinsize sets the terminal size through the poller-aware raw
// connection (File.Fd would switch the master back to blocking mode); the
// kernel then sends SIGWINCH to the terminal's foreground process group.
func setWinsize(f *os.File, cols, rows, wpx, hpx uint32) error {
	ws := &unix.Winsize{Col: clamp16(cols), Row: clamp16(rows), Xpixel: clamp16(wpx), Ypixel: clamp16(hpx)}
	rc, err := f.SyscallConn()
	if err != nil {
		return trace.Wrap(err)
	}
	var ioctlErr error
	if err := rc.Control(func(fd uintptr) {
		ioctlErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, ws)
	}); err != nil {
		return trace.Wrap(err)
	}
	return trace.ConvertSystemError(ioctlErr)
}

func clamp16(v uint32) uint16 {
	if v > maxTerminalSize {
		return maxTerminalSize
	}
	return uint16(v)
}

// getWinsize reads the pty's size (columns, rows).
func getWinsize(f *os.File) (uint32, uint32, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, 0, trace.Wrap(err)
	}
	var ws *unix.Winsize
	var ioctlErr error
	if err := rc.Control(func(fd uintptr) {
		ws, ioctlErr = unix.IoctlGetWinsize(int(fd), unix.TIOCGWINSZ)
	}); err != nil {
		return 0, 0, trace.Wrap(err)
	}
	if ioctlErr != nil {
		return 0, 0, trace.ConvertSystemError(ioctlErr)
	}
	return uint32(ws.Col), uint32(ws.Row), nil
}
