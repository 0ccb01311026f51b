package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/pquerna/otp/totp"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/freeport"
	"github.com/postern-dev/postern/lib/service"
)

const alicePassword = "correct horse battery"

// pshEnv runs the psh binary against an all-in-one cluster with its own
// POSTERN_HOME.
type pshEnv struct {
	c    *allInOne
	home string
	// agentSock is SSH_AUTH_SOCK for psh; empty means none.
	agentSock string
}

func newPshEnv(t testing.TB, c *allInOne) *pshEnv {
	return &pshEnv{c: c, home: filepath.Join(t.TempDir(), "postern-home")}
}

func (e *pshEnv) webAddr() string { return e.c.p.Addr(service.ListenerWeb).String() }

// caCert is the proxy's self-signed web certificate (it is its own CA).
func (e *pshEnv) caCert() string { return filepath.Join(e.c.dataDir, "web", "web.crt") }

func (e *pshEnv) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SSH_AUTH_SOCK=") && !strings.HasPrefix(kv, "POSTERN_HOME=") {
			env = append(env, kv)
		}
	}
	env = append(env, "POSTERN_HOME="+e.home)
	if e.agentSock != "" {
		env = append(env, "SSH_AUTH_SOCK="+e.agentSock)
	}
	return env
}

// withoutEnv returns env without the variable name.
func withoutEnv(env []string, name string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

func (e *pshEnv) cmd(stdin string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin("psh"), args...)
	cmd.Env = e.env()
	cmd.Stdin = strings.NewReader(stdin)
	return cmd
}

// run returns stdout, stderr and the exit code.
func (e *pshEnv) run(t testing.TB, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := e.cmd(stdin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if err != nil {
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, "psh %v: %s", args, errOut.String())
		code = exitErr.ExitCode()
	}
	return out.String(), errOut.String(), code
}

func (e *pshEnv) mustRun(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	out, errOut, code := e.run(t, stdin, args...)
	require.Equal(t, 0, code, "psh %v: %s", args, errOut)
	return out
}

func (e *pshEnv) login(t testing.TB, user, stdin string) {
	t.Helper()
	e.mustRun(t, stdin, "login", "--proxy", e.webAddr(), "--user", user, "--cacert", e.caCert())
}

// requireOneLineError checks psh's error convention: one "ERROR:" line.
func requireOneLineError(t *testing.T, stderr string, contains string) {
	t.Helper()
	s := strings.TrimSpace(stderr)
	require.True(t, strings.HasPrefix(s, "ERROR: "), "stderr: %q", stderr)
	require.NotContains(t, s, "\n", "one line: %q", stderr)
	require.Contains(t, s, contains)
}

func TestPshLoginAndSSH(t *testing.T) {
	c := newAllInOne(t)
	e := newPshEnv(t, c)

	t.Run("wrong password", func(t *testing.T) {
		_, errOut, code := e.run(t, "wrong\n", "login", "--proxy", e.webAddr(), "--user", "alice", "--cacert", e.caCert())
		require.Equal(t, 1, code)
		requireOneLineError(t, errOut, "invalid credentials")
		require.NoDirExists(t, filepath.Join(e.home, "keys"), "no partial credentials")
		require.NoFileExists(t, filepath.Join(e.home, "profile.yaml"))
	})

	e.login(t, "alice", alicePassword+"\n")
	keyPath := filepath.Join(e.home, "keys", e.webAddr(), "alice")
	for _, f := range []string{keyPath, keyPath + ".pub", keyPath + "-cert.pub", filepath.Join(e.home, "known_hosts"), filepath.Join(e.home, "profile.yaml")} {
		st, err := os.Stat(f)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), f)
	}
	st, err := os.Stat(filepath.Dir(keyPath))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())

	t.Run("status", func(t *testing.T) {
		out := e.mustRun(t, "", "status")
		require.Contains(t, out, "User:        alice")
		require.Contains(t, out, "Cluster:     "+clusterName)
		require.Contains(t, out, "Logins:      "+c.login)
		require.Contains(t, out, "Roles:       access")
		require.Contains(t, out, "Valid until:")
	})

	t.Run("ls", func(t *testing.T) {
		out := e.mustRun(t, "", "ls")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2, out)
		require.Regexp(t, `^HOSTNAME\s+ADDRESS\s+LABELS`, lines[0])
		require.Regexp(t, `^node-1\s+`+regexp.QuoteMeta(c.p.Addr(service.ListenerNode).String())+`\s+env=it\s+`, lines[1])

		out = e.mustRun(t, "", "ls", "--format", "json")
		var nodes []map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &nodes), out)
		require.Len(t, nodes, 1)
		require.Equal(t, "node-1", nodes[0]["hostname"])
		require.Equal(t, c.p.HostUUID(), nodes[0]["uuid"])
		require.Equal(t, []any{c.login}, nodes[0]["logins"])
	})

	t.Run("ssh exec and exit status", func(t *testing.T) {
		out, errOut, code := e.run(t, "", "ssh", "node-1", "echo out; echo err >&2; exit 3")
		require.Equal(t, 3, code, errOut)
		require.Equal(t, "out\n", out)
		// Only a suffix: the login's shell start-up files may print
		// (root's pyenv init on shared machines).
		require.True(t, strings.HasSuffix(errOut, "err\n"), "stderr: %q", errOut)

		out = e.mustRun(t, "", "ssh", c.login+"@node-1", "echo", "$SSH_POSTERN_USER")
		require.Equal(t, "alice\n", out)

		// stdin reaches the command, with half-close.
		out = e.mustRun(t, "abc", "ssh", "node-1", "cat; echo done")
		require.Equal(t, "abcdone\n", out)

		nodePort := strconv.Itoa(c.p.Addr(service.ListenerNode).(*net.TCPAddr).Port)
		out = e.mustRun(t, "", "ssh", "-p", nodePort, "--cluster", clusterName, "node-1", "echo port")
		require.Equal(t, "port\n", out)
	})

	t.Run("ssh errors", func(t *testing.T) {
		_, errOut, code := e.run(t, "", "ssh", "nope", "true")
		require.Equal(t, 255, code)
		requireOneLineError(t, errOut, `node "nope" not found in cluster "it"`)

		_, errOut, code = e.run(t, "", "ssh", "--cluster", "elsewhere", "node-1", "true")
		require.Equal(t, 255, code)
		requireOneLineError(t, errOut, "elsewhere")

		// The ProxyCommand tunnel passes the proxy's reason to stderr
		// (OpenSSH shows it) and exits non-zero.
		_, errOut, code = e.run(t, "", "proxy", "ssh", c.login+"@nope:22")
		require.Equal(t, 1, code, errOut)
		require.Contains(t, errOut, `node "nope" not found in cluster "it"`)
	})

	t.Run("ssh with a pty", func(t *testing.T) {
		cmd := e.cmd("", "ssh", "node-1")
		cmd.Stdin = nil
		ptmx, output, readDone := startOnPty(t, cmd, 30, 101)
		var err error
		_, err = ptmx.Write([]byte("tty >/dev/null && echo IS-A-TTY; stty size; echo $((6*7))X\n"))
		require.NoError(t, err)
		require.Eventually(t, func() bool { return strings.Contains(output(), "42X") }, 120*time.Second, 20*time.Millisecond, "output: %q", output())
		require.Contains(t, output(), "IS-A-TTY")
		require.Contains(t, output(), "30 101")
		_, err = ptmx.Write([]byte("exit 5\n"))
		require.NoError(t, err)
		err = cmd.Wait()
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, output())
		require.Equal(t, 5, exitErr.ExitCode())
		ptmx.Close()
		<-readDone
	})

	t.Run("local forward", func(t *testing.T) {
		echo := startEcho(t)
		lport := freePort(t)
		cmd := e.cmd("", "ssh", "-L", fmt.Sprintf("%d:%s", lport, echo), "node-1", "cat")
		cmd.Stdin = nil
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		require.NoError(t, cmd.Start())
		var conn net.Conn
		require.Eventually(t, func() bool {
			conn, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", lport))
			return err == nil
		}, 20*time.Second, 20*time.Millisecond)
		_, err = conn.Write([]byte("ping"))
		require.NoError(t, err)
		got := make([]byte, 4)
		_, err = io.ReadFull(conn, got)
		require.NoError(t, err)
		require.Equal(t, "ping", string(got))
		conn.Close()
		stdin.Close()
		require.NoError(t, cmd.Wait(), errOut.String())
	})

	t.Run("remote forward", func(t *testing.T) {
		echo := startEcho(t)
		rport := freePort(t)
		script := fmt.Sprintf("exec 3<>/dev/tcp/127.0.0.1/%d; echo hi >&3; head -c3 <&3", rport)
		out := e.mustRun(t, "", "ssh", "-R", fmt.Sprintf("127.0.0.1:%d:%s", rport, echo), "node-1", "bash -c '"+script+"'")
		require.Equal(t, "hi\n", out)
	})

	t.Run("agent forwarding with a real ssh-agent", func(t *testing.T) {
		requireOpenSSH(t, "ssh-agent", "ssh-add")
		sock := startAgent(t)
		ae := &pshEnv{c: c, home: filepath.Join(t.TempDir(), "home"), agentSock: sock}
		ae.login(t, "alice", alicePassword+"\n")
		list := exec.Command("ssh-add", "-l")
		list.Env = ae.env()
		out, err := list.CombinedOutput()
		require.NoError(t, err, string(out))
		require.Contains(t, string(out), "ED25519-CERT", "login added the certificate")

		out2 := ae.mustRun(t, "", "ssh", "-A", "node-1", "ssh-add -l; ssh-add -l")
		require.Equal(t, 2, strings.Count(out2, "(ED25519-CERT)"), out2)

		_, _, code := ae.run(t, "", "ssh", "node-1", "ssh-add -l")
		require.NotEqual(t, 0, code, "no agent on the node without -A")
	})

	t.Run("config for OpenSSH", func(t *testing.T) {
		requireOpenSSH(t, "ssh", "scp")
		cfg := e.mustRun(t, "", "config")
		require.Contains(t, cfg, "CertificateFile")
		// The test cluster "it" is Italy's TLD, and the proxy is at
		// 127.0.0.1: blocks for those would capture every *.it host and
		// every `ssh 127.0.0.1`. The proxy gets an alias instead.
		require.NotRegexp(t, `(?m)^Host .*\*\.`+clusterName+`\b`, cfg)
		require.NotRegexp(t, `(?m)^Host .*\b127\.0\.0\.1\b`, cfg)
		alias := clusterName + "-proxy"
		require.Contains(t, cfg, "Host "+alias+"\n    HostName 127.0.0.1\n")
		// The user's own block for the node, through the alias: the
		// proxy block's key, certificate and known_hosts apply to the
		// jump, the node's are repeated here.
		keyFile := filepath.Join(e.home, "keys", e.webAddr(), "alice")
		nodeBlock := fmt.Sprintf("Host node-1\n    ProxyJump %s\n    IdentityFile %s\n    CertificateFile %s-cert.pub\n    IdentitiesOnly yes\n    UserKnownHostsFile %s\n",
			alias, keyFile, keyFile, filepath.Join(e.home, "known_hosts"))
		path := filepath.Join(t.TempDir(), "ssh_config")
		require.NoError(t, os.WriteFile(path, []byte(cfg+nodeBlock+"Host *\n    StrictHostKeyChecking yes\n    GlobalKnownHostsFile /dev/null\n    BatchMode yes\n    LogLevel ERROR\n"), 0o600))
		target := c.login + "@node-1"

		ssh := exec.Command("ssh", "-F", path, target, "echo via-openssh $SSH_POSTERN_USER")
		ssh.Env = withoutEnv(e.env(), "POSTERN_HOME")
		out, err := output(ssh)
		require.NoError(t, err, string(out))
		require.Equal(t, "via-openssh alice\n", string(out))

		dir := t.TempDir()
		src := filepath.Join(dir, "src")
		data := bytes.Repeat([]byte("psh-scp-"), 64*1024)
		require.NoError(t, os.WriteFile(src, data, 0o600))
		scp := exec.Command("scp", "-F", path, src, target+":"+filepath.Join(dir, "dst"))
		scp.Env = e.env()
		out, err = scp.CombinedOutput()
		require.NoError(t, err, string(out))
		got, err := os.ReadFile(filepath.Join(dir, "dst"))
		require.NoError(t, err)
		require.True(t, bytes.Equal(data, got))

		if _, err := exec.LookPath("rsync"); err == nil {
			rs := exec.Command("rsync", "-e", "ssh -F "+path, src, target+":"+filepath.Join(dir, "rsynced"))
			rs.Env = e.env()
			out, err = rs.CombinedOutput()
			require.NoError(t, err, string(out))
			got, err = os.ReadFile(filepath.Join(dir, "rsynced"))
			require.NoError(t, err)
			require.True(t, bytes.Equal(data, got))
		}

		// psh proxy ssh as an explicit ProxyCommand, plain host name.
		pc := fmt.Sprintf("ProxyCommand=%s proxy ssh %%r@%%h:%%p", bin("psh"))
		keyPath := filepath.Join(e.home, "keys", e.webAddr(), "alice")
		ssh = exec.Command("ssh", "-F", "/dev/null", "-o", pc, "-o", "IdentityFile="+keyPath, "-o", "CertificateFile="+keyPath+"-cert.pub",
			"-o", "UserKnownHostsFile="+filepath.Join(e.home, "known_hosts"), "-o", "GlobalKnownHostsFile=/dev/null",
			"-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", c.login+"@node-1", "echo proxycommand")
		ssh.Env = e.env()
		out, err = output(ssh)
		require.NoError(t, err, string(out))
		require.Equal(t, "proxycommand\n", string(out))
	})

	t.Run("logout", func(t *testing.T) {
		out := e.mustRun(t, "", "logout")
		require.Contains(t, out, "Logged out alice")
		require.NoFileExists(t, keyPath)
		require.NoFileExists(t, keyPath+"-cert.pub")
		require.NoFileExists(t, filepath.Join(e.home, "profile.yaml"))
		for _, args := range [][]string{{"ls"}, {"status"}, {"ssh", "node-1", "true"}, {"config"}} {
			_, errOut, code := e.run(t, "", args...)
			want := 1
			if args[0] == "ssh" {
				want = 255 // as OpenSSH: psh ssh never ran the command
			}
			require.Equal(t, want, code)
			requireOneLineError(t, errOut, "psh login")
		}
	})
}

func TestPshLoginOTP(t *testing.T) {
	c := newAllInOne(t)
	out := mustPctl(t, c.dataDir, "otp password 1\n", "users", "add", "bob", "--logins", c.login, "--otp")
	m := regexp.MustCompile(`secret=([A-Z2-7]+)`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	// pctl users ls tells an enrolled user from one without OTP, though
	// the auth API never hands out the secret.
	users := mustPctl(t, c.dataDir, "", "users", "ls")
	require.Regexp(t, `(?m)^bob\s.*\sotp\s+local\s*$`, users)
	require.Regexp(t, `(?m)^alice\s.*\s-\s+local\s*$`, users)
	e := newPshEnv(t, c)

	_, errOut, code := e.run(t, "otp password 1\n\n", "login", "--proxy", e.webAddr(), "--user", "bob", "--cacert", e.caCert())
	require.Equal(t, 1, code)
	requireOneLineError(t, errOut, "invalid credentials")

	code6, err := totp.GenerateCode(m[1], time.Now())
	require.NoError(t, err)
	e.login(t, "bob", "otp password 1\n"+code6+"\n")
	require.Contains(t, e.mustRun(t, "", "status"), "User:        bob")

	// A user without OTP leaves the question empty.
	e2 := newPshEnv(t, c)
	e2.login(t, "alice", alicePassword+"\n\n")
}

func TestPshBadInput(t *testing.T) {
	c := newAllInOne(t)
	e := newPshEnv(t, c)

	t.Run("not a Postern proxy", func(t *testing.T) {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, "<html>hello</html>")
		}))
		defer srv.Close()
		addr := strings.TrimPrefix(srv.URL, "https://")
		_, errOut, code := e.run(t, alicePassword+"\n", "login", "--proxy", addr, "--user", "alice", "--insecure")
		require.Equal(t, 1, code)
		require.Contains(t, errOut, "WARNING: --insecure")
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		requireOneLineError(t, lines[len(lines)-1], addr+" is not a Postern proxy")
		require.NoFileExists(t, filepath.Join(e.home, "profile.yaml"))
	})

	t.Run("untrusted TLS certificate", func(t *testing.T) {
		_, errOut, code := e.run(t, alicePassword+"\n", "login", "--proxy", e.webAddr(), "--user", "alice")
		require.Equal(t, 1, code)
		requireOneLineError(t, errOut, "does not verify")
		require.Contains(t, errOut, "--insecure")

		_, errOut, code = e.run(t, alicePassword+"\n", "login", "--proxy", e.webAddr(), "--user", "alice", "--insecure")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, errOut, "WARNING: --insecure")
	})

	t.Run("corrupted profile", func(t *testing.T) {
		require.NoError(t, os.WriteFile(filepath.Join(e.home, "profile.yaml"), []byte("{{{ not yaml"), 0o600))
		_, errOut, code := e.run(t, "", "status")
		require.Equal(t, 1, code)
		requireOneLineError(t, errOut, "is not a psh profile")

		require.NoError(t, os.WriteFile(filepath.Join(e.home, "profile.yaml"), []byte("kind: role\nname: x\n"), 0o600))
		_, errOut, code = e.run(t, "", "ls")
		require.Equal(t, 1, code)
		requireOneLineError(t, errOut, "is not a psh profile")
	})

	t.Run("key with loose permissions", func(t *testing.T) {
		e.login(t, "alice", alicePassword+"\n")
		key := filepath.Join(e.home, "keys", e.webAddr(), "alice")
		require.NoError(t, os.Chmod(key, 0o644))
		_, errOut, code := e.run(t, "", "ssh", "node-1", "true")
		require.Equal(t, 255, code)
		requireOneLineError(t, errOut, "chmod 600")
	})
}

// TestPshAmbiguousHost: two nodes named alike; psh shows the proxy's
// candidate list, and the UUID picks one.
func TestPshAmbiguousHost(t *testing.T) {
	c := newAllInOne(t)
	out := mustPctl(t, c.dataDir, "", "tokens", "add", "--type", "node")
	m := joinRe.FindStringSubmatch(out)
	require.NotNil(t, m, out)
	cfg2 := procConfig(t.TempDir(), config.RoleNode)
	cfg2.AuthServer, cfg2.Token, cfg2.CAPin, cfg2.NodeName = c.p.Addr(service.ListenerAuth).String(), m[1], m[2], "node-1"
	second := startProcess(t, cfg2)
	waitNodes(t, adminClient(t, c.dataDir, c.p), 2)

	e := newPshEnv(t, c)
	e.login(t, "alice", alicePassword+"\n")
	require.Eventually(t, func() bool {
		out, _, code := e.run(t, "", "ls", "--format", "json")
		return code == 0 && strings.Count(out, `"hostname": "node-1"`) == 2
	}, 20*time.Second, 50*time.Millisecond)

	_, errOut, code := e.run(t, "", "ssh", "node-1", "true")
	require.Equal(t, 255, code)
	require.Contains(t, errOut, `ERROR: ambiguous host "node-1" matches 2 nodes in cluster "it"`)
	require.Contains(t, errOut, c.p.HostUUID())
	require.Contains(t, errOut, second.HostUUID())

	out = e.mustRun(t, "", "ssh", second.HostUUID(), "echo $SSH_POSTERN_HOST_UUID")
	require.Equal(t, second.HostUUID()+"\n", out)
}

// startEcho serves a TCP echo on loopback until the test ends.
func startEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				_, _ = io.Copy(conn, conn)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// freePort returns a free loopback port (-L needs a number on the command
// line; a restarted daemon needs the port its clients know), picked where
// parallel tests cannot take it before it is bound.
func freePort(t *testing.T) int {
	t.Helper()
	return freeport.Port(t)
}

// startAgent runs `ssh-agent -D` on a socket in a temp dir.
func startAgent(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	agent := exec.Command("ssh-agent", "-D", "-a", sock)
	require.NoError(t, agent.Start())
	t.Cleanup(func() { agent.Process.Kill(); agent.Wait() })
	require.Eventually(t, func() bool { _, err := os.Stat(sock); return err == nil }, 10*time.Second, 20*time.Millisecond)
	return sock
}

// output runs cmd and returns its stdout; stderr goes into the error.
func output(cmd *exec.Cmd) ([]byte, error) {
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%v: %s", err, errOut.String())
	}
	return out, nil
}

// startOnPty starts cmd on a new pty of rows x cols and collects what it
// prints: output reads it so far, readDone closes once the pty is closed
// (or the process's side is gone). The test closes ptmx (also on cleanup).
func startOnPty(t *testing.T, cmd *exec.Cmd, rows, cols uint16) (ptmx *os.File, output func() string, readDone <-chan struct{}) {
	t.Helper()
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	require.NoError(t, err)
	t.Cleanup(func() { ptmx.Close() })
	var buf syncBuffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		b := make([]byte, 4096)
		for {
			n, err := ptmx.Read(b)
			buf.Write(b[:n])
			if err != nil {
				return
			}
		}
	}()
	return ptmx, buf.String, done
}
