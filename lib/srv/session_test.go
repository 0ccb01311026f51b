package srv

import (
	"bytes"
	"crypto/rand"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/pkg/sftp"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

func TestExecExitStatusAndStreams(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()

	out, _, err := run(t, c, "echo hello")
	require.NoError(t, err)
	require.Equal(t, "hello\n", out)

	out, errOut, err := run(t, c, "echo to-out; echo to-err >&2; exit 3")
	var exitErr *ssh.ExitError
	require.ErrorAs(t, err, &exitErr)
	require.Equal(t, 3, exitErr.ExitStatus())
	require.Equal(t, "to-out\n", out, "stdout and stderr stay apart without a pty")
	require.Equal(t, "to-err\n", errOut)
}

func TestSessionEnvironment(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Setenv("LANG", "C.UTF-8"))
	require.NoError(t, s.Setenv("LC_TIME", "C"))
	// Outside the allow-list: refused, not fatal.
	require.Error(t, s.Setenv("LD_PRELOAD", "/tmp/evil.so"))
	require.Error(t, s.Setenv("FOO", "bar"))
	out, err := s.Output(`echo "LANG=$LANG LC_TIME=$LC_TIME FOO=$FOO LD=$LD_PRELOAD"; ` +
		`echo "uuid=$SSH_POSTERN_HOST_UUID cluster=$SSH_POSTERN_CLUSTER_NAME user=$SSH_POSTERN_USER"; ` +
		`echo "sid=$SSH_SESSION_ID"; echo "home=$HOME usr=$USER logname=$LOGNAME shell=$SHELL"; pwd; echo "path=$PATH"`)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, 6, string(out))
	require.Equal(t, "LANG=C.UTF-8 LC_TIME=C FOO= LD=", lines[0])
	require.Equal(t, "uuid=5f1c-node-uuid cluster=example user=alice", lines[1])
	require.Regexp(t, `^sid=[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`, lines[2])
	me, err := user.Current()
	require.NoError(t, err)
	require.Equal(t, "home="+me.HomeDir+" usr="+me.Username+" logname="+me.Username+" shell=/bin/sh", lines[3])
	require.Equal(t, me.HomeDir, lines[4], "sessions start in the login's home")
	require.Equal(t, "path="+defaultPath, lines[5])
	e.requireLog("Ignored env request outside the allow-list", "LD_PRELOAD")
}

func TestPTY(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.RequestPty("xterm-256color", 24, 80, ssh.TerminalModes{}))
	out, err := s.Output(`tty; echo "term=$TERM"; stty size`)
	require.NoError(t, err)
	require.Regexp(t, regexp.MustCompile(`^/dev/pts/\d+\r\nterm=xterm-256color\r\n24 80\r\n$`), string(out))
}

func TestWindowChangeReachesProgram(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	w := watchOutput(stdout)
	require.NoError(t, s.Start(`trap 'echo "size: $(stty size)"; exit 0' WINCH; echo ready; while :; do sleep 0.05; done`))
	w.waitFor(t, "ready")
	require.NoError(t, s.WindowChange(50, 132))
	w.waitFor(t, "size: 50 132")
	require.NoError(t, s.Wait())
}

func TestHalfCloseStdin(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	stdin, err := s.StdinPipe()
	require.NoError(t, err)
	var out bytes.Buffer
	s.Stdout = &out
	require.NoError(t, s.Start("cat; echo done"))
	_, err = stdin.Write([]byte("abc"))
	require.NoError(t, err)
	require.NoError(t, stdin.Close()) // EOF on the channel, not a close
	require.NoError(t, s.Wait())
	require.Equal(t, "abcdone\n", out.String())
}

func TestSignal(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()

	t.Run("trapped", func(t *testing.T) {
		s, err := c.NewSession()
		require.NoError(t, err)
		defer s.Close()
		stdout, err := s.StdoutPipe()
		require.NoError(t, err)
		w := watchOutput(stdout)
		require.NoError(t, s.Start(`trap 'echo got-usr1; exit 7' USR1; echo ready; while :; do sleep 0.05; done`))
		w.waitFor(t, "ready")
		require.NoError(t, s.Signal(ssh.SIGUSR1))
		w.waitFor(t, "got-usr1")
		var exitErr *ssh.ExitError
		require.ErrorAs(t, s.Wait(), &exitErr)
		require.Equal(t, 7, exitErr.ExitStatus())
	})
	t.Run("exit-signal", func(t *testing.T) {
		s, err := c.NewSession()
		require.NoError(t, err)
		defer s.Close()
		stdout, err := s.StdoutPipe()
		require.NoError(t, err)
		w := watchOutput(stdout)
		// exec: the shell is replaced, so the signal ends the process.
		require.NoError(t, s.Start(`echo ready; exec sleep 60`))
		w.waitFor(t, "ready")
		require.NoError(t, s.Signal(ssh.SIGTERM))
		var exitErr *ssh.ExitError
		require.ErrorAs(t, s.Wait(), &exitErr)
		require.Equal(t, "TERM", exitErr.Signal())
	})
}

func TestX11Refused(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	ok, err := s.SendRequest("x11-req", true, ssh.Marshal(struct {
		Single   bool
		Protocol string
		Cookie   string
		Screen   uint32
	}{false, "MIT-MAGIC-COOKIE-1", "00", 0}))
	require.NoError(t, err)
	require.False(t, ok)
	out, err := s.Output("echo still-works")
	require.NoError(t, err)
	require.Equal(t, "still-works\n", string(out))
}

func TestSFTPPutGet(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	sftpRoundTrip(t, c, t.TempDir(), 5<<20+123)
}

// sftpRoundTrip uploads and downloads size random bytes through sftp.
func sftpRoundTrip(t *testing.T, c *ssh.Client, dir string, size int) string {
	t.Helper()
	client, err := sftp.NewClient(c)
	require.NoError(t, err)
	defer client.Close()
	data := make([]byte, size)
	_, _ = rand.Read(data)
	path := filepath.Join(dir, "blob.bin")
	f, err := client.Create(path)
	require.NoError(t, err)
	_, err = f.ReadFrom(bytes.NewReader(data))
	require.NoError(t, err)
	require.NoError(t, f.Close())

	onDisk, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, onDisk), "uploaded bytes differ")

	g, err := client.Open(path)
	require.NoError(t, err)
	var got bytes.Buffer
	_, err = g.WriteTo(&got)
	require.NoError(t, err)
	require.NoError(t, g.Close())
	require.True(t, bytes.Equal(data, got.Bytes()), "downloaded bytes differ")
	return path
}

// TestRunAsOtherLogin: a root node runs sessions and sftp as the login,
// with its uid, gid and home.
func TestRunAsOtherLogin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch to another login")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no nobody user")
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	home := filepath.Join(t.TempDir(), "nobody-home")
	require.NoError(t, os.Mkdir(home, 0o700))
	require.NoError(t, os.Chown(home, uid, gid))
	// The tempdir's parents must be traversable by nobody.
	for d := filepath.Dir(home); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		require.NoError(t, err)
		require.NoError(t, os.Chmod(d, fi.Mode().Perm()|0o011))
	}
	lookup := func(login string) (*Login, error) {
		l, err := testShell(login)
		if err == nil && login == "nobody" {
			l.Home = home
		}
		return l, err
	}
	e := newTestEnv(t, func(c *Config) { c.LookupLogin = lookup })
	c, err := e.dialAs("nobody", e.signer("nobody"))
	require.NoError(t, err)
	defer c.Close()

	out, _, err := run(t, c, "id -u; id -g; pwd; echo $HOME")
	require.NoError(t, err)
	require.Equal(t, nobody.Uid+"\n"+nobody.Gid+"\n"+home+"\n"+home+"\n", out)

	// sftp runs in the re-executed child as nobody: the file is nobody's.
	path := sftpRoundTrip(t, c, home, 3<<20)
	owner := fileOwner(t, path)
	require.Equal(t, uint32(uid), owner)

	// pty owned by the login.
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	o, err := s.Output(`stat -c %u "$(tty)"`)
	require.NoError(t, err)
	require.Equal(t, nobody.Uid, strings.TrimSpace(string(o)))
}
