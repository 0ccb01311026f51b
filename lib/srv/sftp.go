package srv

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/gravitational/trace"
	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
)

// The sftp subsystem must run with the login's identity, or files would be
// created as root. Two ways, chosen per session:
//
//   - The login is the account the node runs as (the usual non-root node,
//     or root logging in as root): the pkg/sftp server runs in-process on
//     the channel. No identity switch is needed, and it costs nothing.
//   - A root node serving another login: the node re-executes its own
//     binary (/proc/self/exe) with the hidden first argument
//     SFTPChildArg. The child starts as root, drops to the login's
//     groups, gid and uid (setgroups/setgid/setuid apply to all threads
//     since Go 1.16) before reading a single byte, and serves sftp on its
//     stdin/stdout, which the parent splices to the channel exactly like an
//     exec session. Dropping privileges inside the child, instead of
//     exec'ing as the login, keeps this working when the binary sits in a
//     directory the login cannot traverse (a `go test` binary does).
//
// The child path costs one process per sftp session, like OpenSSH's
// sftp-server. Every binary that embeds a Server must call
// RunReexecChild first thing in main (and TestMain).

// SFTPChildArg is the hidden argv[1] of the sftp child process.
const SFTPChildArg = "__postern-sftp-child"

// RunReexecChild serves the sftp child when this process was started as
// one, and exits; otherwise it returns at once. Call it first in main.
func RunReexecChild() {
	if len(os.Args) < 2 || os.Args[1] != SFTPChildArg {
		return
	}
	if err := runSFTPChild(os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "postern sftp: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runSFTPChild: args are uid, gid, comma-separated groups, home.
func runSFTPChild(args []string) error {
	if len(args) != 4 {
		return trace.BadParameter("want uid gid groups home, got %d arguments", len(args))
	}
	uid, err := strconv.Atoi(args[0])
	if err != nil {
		return trace.BadParameter("bad uid %q", args[0])
	}
	gid, err := strconv.Atoi(args[1])
	if err != nil {
		return trace.BadParameter("bad gid %q", args[1])
	}
	var groups []int
	for _, g := range strings.Split(args[2], ",") {
		if g == "" {
			continue
		}
		v, err := strconv.Atoi(g)
		if err != nil {
			return trace.BadParameter("bad group %q", g)
		}
		groups = append(groups, v)
	}
	if os.Geteuid() == 0 {
		// Order matters: groups and gid can only change while still root.
		if err := syscall.Setgroups(groups); err != nil {
			return trace.Wrap(err, "setgroups")
		}
		if err := syscall.Setgid(gid); err != nil {
			return trace.Wrap(err, "setgid")
		}
		if err := syscall.Setuid(uid); err != nil {
			return trace.Wrap(err, "setuid")
		}
	}
	if os.Geteuid() != uid || os.Getegid() != gid {
		return trace.AccessDenied("could not switch to uid %d gid %d", uid, gid)
	}
	home := homeOrRoot(args[3])
	_ = os.Chdir(home)
	return serveSFTP(stdio{os.Stdin, os.Stdout}, home)
}

type stdio struct {
	io.Reader
	io.WriteCloser
}

// serveSFTP serves one sftp session on rwc until the client closes it.
func serveSFTP(rwc io.ReadWriteCloser, home string) error {
	server, err := sftp.NewServer(rwc, sftp.WithServerWorkingDirectory(home))
	if err != nil {
		return trace.Wrap(err)
	}
	defer server.Close()
	if err := server.Serve(); err != nil && err != io.EOF {
		return trace.Wrap(err)
	}
	return nil
}

// startNodeSubsystem answers a subsystem request on a node (the session
// is already claimed): sftp is the one subsystem a node serves.
func (s *session) startNodeSubsystem(req *ssh.Request, name string) {
	if name != "sftp" {
		s.refuse(req, trace.BadParameter("unknown subsystem %q", name))
		return
	}
	login, cred, err := s.c.resolveLogin()
	if err != nil {
		s.refuse(req, err)
		return
	}
	if cred == nil || isCurrentUser(login) {
		rec, err := s.startRecording(procSpec{})
		if err != nil {
			s.refuse(req, err)
			return
		}
		s.mu.Lock()
		s.rec = rec
		s.mu.Unlock()
		reply(req, true)
		s.log.Info("SFTP session started (in process).")
		s.emitStart(false)
		served := make(chan struct{})
		if rec != nil {
			s.goCopy(func() { s.watchRecording(served, func() { _ = s.ch.Close() }) })
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer close(served)
			st := exitCode(0)
			if err := serveSFTP(sftpChannel{s.ch}, homeOrRoot(login.Home)); err != nil {
				s.log.WithError(err).Debug("SFTP session failed.")
				st = exitCode(1)
			}
			s.finish(st)
		}()
		return
	}
	groups := make([]string, 0, len(login.Groups))
	for _, g := range login.Groups {
		groups = append(groups, strconv.FormatUint(uint64(g), 10))
	}
	s.run(req, procSpec{
		path: "/proc/self/exe",
		args: []string{"postern", SFTPChildArg,
			strconv.FormatUint(uint64(login.UID), 10), strconv.FormatUint(uint64(login.GID), 10),
			strings.Join(groups, ","), login.Home},
		env: []string{"HOME=" + login.Home, "USER=" + login.Name, "PATH=" + defaultPath},
		dir: "/",
	})
}

// sftpChannel makes pkg/sftp's final Close half-close instead: the exit
// status still has to be sent on the channel after the server is done.
type sftpChannel struct {
	ch trackedChannel
}

func (c sftpChannel) Read(p []byte) (int, error)  { return c.ch.Read(p) }
func (c sftpChannel) Write(p []byte) (int, error) { return c.ch.Write(p) }
func (c sftpChannel) Close() error                { return nil }
