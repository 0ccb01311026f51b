package srv

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"golang.org/x/sys/unix"
)

const (
	// ptyDrainGrace bounds how long output is still read from a pty after
	// the session's process exited. The kernel returns EIO once every
	// holder of the terminal is gone; a background job that keeps it open
	// must not keep the session (and the client) waiting, as OpenSSH does
	// not either.
	ptyDrainGrace = time.Second
	// hangUpGrace is how long a process gets to exit after SIGHUP when
	// its channel or connection went away, before SIGKILL: a shell saves
	// its history in that time.
	hangUpGrace = 2 * time.Second
)

// waitExited parks the goroutine in the runtime's poller until process pid
// has exited, so that the Wait after it returns at once. Without it the
// goroutine would block in waitid(2), a system call that holds an OS thread
// for as long as the session's process runs: a node with thousands of idle
// shells would run thousands of threads. A pidfd becomes readable when its
// process exits; where pidfds are unavailable (Linux < 5.3) Wait blocks as
// before. Safe against pid reuse: the process is our unreaped child, so
// its pid cannot be reused until Wait reaps it.
func waitExited(pid int) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	raw, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Read(func(fd uintptr) bool {
		// Level check first: an exit before the poller saw the fd.
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return n != 0 || err != nil
	})
}

// procSpec is what to run and as whom.
type procSpec struct {
	path string
	args []string // argv, including argv[0]
	env  []string
	dir  string
	// cred is nil when the process keeps the server's identity.
	cred *syscall.Credential
	// pty is nil for pipes (stdout and stderr kept apart).
	pty *ptyRequest
}

// process is a running session process and its stdio plumbing.
type process struct {
	cmd  *exec.Cmd
	ptmx *os.File // nil without a pty
	// closers end the output copies once the process is gone (the read
	// ends of the pipes, or the pty master).
	closers []io.Closer
	// outputDone is closed when stdout and stderr (or the pty) are drained.
	outputDone chan struct{}
	// exited is closed when the process has been reaped.
	exited chan struct{}
}

// startProcess starts spec in its own session (setsid), with the pty as
// controlling terminal when there is one, and starts the goroutines that
// copy its stdio to and from the channel (counted in s.wg).
func (s *session) startProcess(spec procSpec) (*process, error) {
	cmd := &exec.Cmd{Path: spec.path, Args: spec.args, Env: spec.env, Dir: spec.dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: spec.cred}
	p := &process{cmd: cmd, outputDone: make(chan struct{}), exited: make(chan struct{})}
	var outputs sync.WaitGroup

	if spec.pty != nil {
		ptmx, tty, err := openPTY()
		if err != nil {
			return nil, err
		}
		if err := setWinsize(ptmx, spec.pty.Columns, spec.pty.Rows, spec.pty.WidthPx, spec.pty.HeightPx); err != nil {
			ptmx.Close()
			tty.Close()
			return nil, trace.Wrap(err)
		}
		if spec.cred != nil {
			// The login owns its terminal, as with login(1): mesg and
			// write(1) rely on it.
			_ = tty.Chown(int(spec.cred.Uid), int(spec.cred.Gid))
			_ = tty.Chmod(0o620)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		cmd.SysProcAttr.Setctty = true
		cmd.SysProcAttr.Ctty = 0 // fd 0 in the child: the tty
		cmd.Env = append(cmd.Env, "SSH_TTY="+tty.Name())
		p.ptmx = ptmx
		p.closers = []io.Closer{ptmx}
		if err := cmd.Start(); err != nil {
			ptmx.Close()
			tty.Close()
			return nil, trace.Wrap(err)
		}
		tty.Close()
		out, in := io.Writer(&s.chOut), io.Writer(ptmx)
		if s.rec != nil {
			out, in = s.outputRecorder(out, s.rec, s.ptyOutputRecorder(s.rec, ptmx, s.c.cfg.Clock)), s.outputRecorder(in, s.rec, s.rec.Input)
		}
		out, in, copyIn := s.openRoom(out, in, spec.pty)
		outputs.Add(1)
		s.goCopy(func() {
			defer outputs.Done()
			// Ends with EIO when the last holder of the tty closes it.
			_, _ = io.Copy(out, ptmx)
		})
		if copyIn {
			s.goCopy(func() { _, _ = io.Copy(in, s.ch) })
		}
	} else {
		stdinR, stdinW, err := os.Pipe()
		if err != nil {
			return nil, trace.Wrap(err)
		}
		stdoutR, stdoutW, err := os.Pipe()
		if err != nil {
			closeAll(stdinR, stdinW)
			return nil, trace.Wrap(err)
		}
		stderrR, stderrW, err := os.Pipe()
		if err != nil {
			closeAll(stdinR, stdinW, stdoutR, stdoutW)
			return nil, trace.Wrap(err)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, stdoutW, stderrW
		parentEnds := []*os.File{stdinR, stdoutW, stderrW} // the child's ends, closed in the parent after start
		if err := cmd.Start(); err != nil {
			closeAll(stdinR, stdinW, stdoutR, stdoutW, stderrR, stderrW)
			return nil, trace.Wrap(err)
		}
		closeAll(parentEnds...)
		p.closers = []io.Closer{stdoutR, stderrR, stdinW}
		stdout, stderr := io.Writer(s.ch), io.Writer(s.ch.Stderr())
		if s.recordsOutput() {
			stdout, stderr = s.outputRecorder(stdout, s.rec, s.rec.Output), s.outputRecorder(stderr, s.rec, s.rec.Output)
		}
		outputs.Add(2)
		s.goCopy(func() {
			defer outputs.Done()
			_, _ = io.Copy(stdout, stdoutR)
		})
		s.goCopy(func() {
			defer outputs.Done()
			_, _ = io.Copy(stderr, stderrR)
		})
		// Half-close: the client's EOF becomes EOF on the process's stdin
		// while its output keeps flowing.
		s.goCopy(func() {
			_, _ = io.Copy(stdinW, s.ch)
			_ = stdinW.Close()
		})
	}
	s.goCopy(func() {
		outputs.Wait()
		close(p.outputDone)
	})
	return p, nil
}

// goCopy starts a stdio copy owned by the session.
func (s *session) goCopy(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// wait reaps the process, lets its output drain, and reports how it ended.
// Output is drained fully without a pty (like OpenSSH, a background job
// holding stdout keeps the session open) unless the session ends; with a
// pty for at most ptyDrainGrace.
func (p *process) wait(ctx context.Context, clock clockwork.Clock) exitResult {
	waitExited(p.cmd.Process.Pid)
	err := p.cmd.Wait()
	close(p.exited)
	if p.ptmx != nil {
		timer := clock.NewTimer(ptyDrainGrace)
		select {
		case <-p.outputDone:
		case <-timer.Chan():
		case <-ctx.Done():
		}
		timer.Stop()
	} else {
		select {
		case <-p.outputDone:
		case <-ctx.Done():
		}
	}
	for _, c := range p.closers {
		_ = c.Close()
	}
	<-p.outputDone

	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		return exitCode(255)
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		return exitCode(p.cmd.ProcessState.ExitCode())
	}
	if ws.Signaled() {
		return exitResult{signal: signalName(ws.Signal()), core: ws.CoreDump()}
	}
	return exitCode(ws.ExitStatus())
}

// kill signals the process group (the process is its session leader).
func (p *process) kill(sig syscall.Signal) error {
	select {
	case <-p.exited:
		return trace.NotFound("process already exited")
	default:
	}
	return trace.ConvertSystemError(syscall.Kill(-p.cmd.Process.Pid, sig))
}

// hangUp is what a vanished client means for its process: SIGHUP, as a
// terminal hang-up would send, then SIGKILL after hangUpGrace.
func (p *process) hangUp(clock clockwork.Clock) {
	if p.kill(syscall.SIGHUP) != nil {
		return
	}
	timer := clock.NewTimer(hangUpGrace)
	defer timer.Stop()
	select {
	case <-p.exited:
	case <-timer.Chan():
		_ = p.kill(syscall.SIGKILL)
	}
}
