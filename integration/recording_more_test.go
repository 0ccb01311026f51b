package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/service"
)

// nodeProcess is a `postern start --roles node` child joined to c.
type nodeProcess struct {
	args   []string
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan error
}

func startNodeProcess(t *testing.T, c *allInOne, name, dataDir string) *nodeProcess {
	t.Helper()
	m := joinRe.FindStringSubmatch(mustPctl(t, c.dataDir, "", "tokens", "add", "--type", "node"))
	require.NotNil(t, m)
	n := &nodeProcess{args: []string{"start", "--roles", "node", "--data-dir", dataDir,
		"--auth-server", c.p.Addr(service.ListenerAuth).String(), "--token", m[1], "--ca-pin", m[2],
		"--nodename", name, "--node-addr", "127.0.0.1:0", "--diag-addr", "127.0.0.1:0"}}
	n.start(t)
	return n
}

func (n *nodeProcess) start(t *testing.T) {
	t.Helper()
	n.stderr = &syncBuffer{}
	n.cmd = exec.Command(bin("postern"), n.args...)
	n.cmd.Stderr = n.stderr
	n.done = make(chan error, 1)
	require.NoError(t, n.cmd.Start())
	cmd, done := n.cmd, n.done
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
}

// kill9 SIGKILLs the node and waits for it.
func (n *nodeProcess) kill9(t *testing.T) {
	t.Helper()
	require.NoError(t, n.cmd.Process.Kill())
	err := <-n.done
	n.done <- err
}

// TestRecordingSurvivesNodeKill: a node killed with SIGKILL mid-session
// loses at most the last second of the recording. After it restarts, its
// uploader ships what the dead process had spooled: every counter value
// the client saw more than a second before the kill is in the recording,
// which `pctl recordings ls` and `verify` call incomplete and whose
// export ends with the incomplete marker.
func TestRecordingSurvivesNodeKill(t *testing.T) {
	c := newAllInOne(t)
	nodeDir := t.TempDir()
	node := startNodeProcess(t, c, "victim", nodeDir)
	waitNodes(t, adminClient(t, c.dataDir, c.p), 2)
	var clt *ssh.Client
	require.Eventually(t, func() bool {
		var err error
		clt, err = c.viaJump(t, "victim:0")
		return err == nil
	}, 20*time.Second, 50*time.Millisecond)
	s, err := clt.NewSession()
	require.NoError(t, err)
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	const cmd = `i=0; while :; do i=$((i+1)); echo "counter $i"; sleep 0.1; done`
	require.NoError(t, s.Start(cmd))

	// When the client saw each counter value.
	var mu sync.Mutex
	seen := map[int]time.Time{}
	re := regexp.MustCompile(`counter (\d+)`)
	reached := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				v, _ := strconv.Atoi(m[1])
				mu.Lock()
				seen[v] = time.Now()
				mu.Unlock()
				if v == 40 {
					close(reached)
				}
			}
		}
	}()
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the counter did not reach 40")
	}
	killedAt := time.Now()
	node.kill9(t)
	// Every value the client had seen a second before the kill must be
	// recorded. (The 50 ms on top is for the fsync of the chunk that the
	// one-second flush closes, under a loaded test machine.)
	mu.Lock()
	want := 0
	for v, at := range seen {
		if at.Before(killedAt.Add(-time.Second-50*time.Millisecond)) && v > want {
			want = v
		}
	}
	mu.Unlock()
	require.Greater(t, want, 20)

	// Restarted with the same data dir: same identity, same spool.
	node.start(t)
	sidRe := regexp.MustCompile(`(?m)^([0-9a-f-]{36})\s.*\bvictim\b`)
	// The recording as auth holds it: its id from the list, its export,
	// and whether that export reaches counter want. pctl reports failure
	// as an error (never t.Fatal), so this may run on Eventually's
	// goroutine.
	uploaded := func() (sid, text string, ok bool) {
		ls, _, _ := pctl(t, c.dataDir, "", "recordings", "ls")
		m := sidRe.FindStringSubmatch(ls)
		if m == nil {
			return "", "", false
		}
		out, _, err := pctl(t, c.dataDir, "", "recordings", "export", m[1])
		return m[1], out, err == nil && strings.Contains(out, fmt.Sprintf(`"counter %d\r\n"`, want))
	}
	if !assert.Eventually(t, func() bool { _, _, ok := uploaded(); return ok }, 40*time.Second, 200*time.Millisecond) {
		sid, text, _ := uploaded()
		ls, _, _ := pctl(t, c.dataDir, "", "recordings", "ls")
		t.Fatalf("the restarted node did not upload the recording up to counter %d (session %q)\nnode: %s\nrecordings:\n%s\nexport tail: %q",
			want, sid, lastLines(node.stderr.String(), 15), ls, lastLines(text, 3))
	}
	sid, text, _ := uploaded()

	h, evs, err := recording.Parse([]byte(text))
	require.NoError(t, err)
	require.Equal(t, sid, h.SessionID)
	var out strings.Builder
	for _, e := range evs {
		if e.Code == "o" {
			out.WriteString(e.Data)
		}
	}
	var got []int
	for _, m := range re.FindAllStringSubmatch(out.String(), -1) {
		v, _ := strconv.Atoi(m[1])
		got = append(got, v)
	}
	for i := 1; i <= want; i++ {
		require.Equal(t, i, got[i-1], "every counter value in order up to %d", want)
	}
	mu.Lock()
	lastSeen := 0
	for v := range seen {
		lastSeen = max(lastSeen, v)
	}
	mu.Unlock()
	t.Logf("client saw up to %d; recorded up to %d; required %d (a second before the kill)", lastSeen, got[len(got)-1], want)

	last := evs[len(evs)-1]
	require.Equal(t, "m", last.Code)
	require.Equal(t, recording.IncompleteMarker, last.Data, "the export says the recording is incomplete")
	ls := mustPctl(t, c.dataDir, "", "recordings", "ls")
	require.Regexp(t, sid+`.*\bfalse\b`, ls, "listed as not complete")
	require.Contains(t, mustPctl(t, c.dataDir, "", "recordings", "verify", sid), "INCOMPLETE")
	// Nothing is left in the spool once auth has it.
	require.Eventually(t, func() bool {
		ents, _ := os.ReadDir(filepath.Join(nodeDir, "recordings", sid))
		return len(ents) == 0
	}, 20*time.Second, 100*time.Millisecond)
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// TestOpenSSHSessionRecorded: the OpenSSH client, `ssh -tt -J`, runs a
// session that prints a counter every 100ms, resizes its terminal from
// inside (`stty cols 100`), runs vim briefly and exits 3. `psh play
// --format text` shows every counter value in order, the resize and the
// exit status marker.
func TestOpenSSHSessionRecorded(t *testing.T) {
	requireOpenSSH(t, "ssh")
	vim, _ := exec.LookPath("vim")
	if vim == "" {
		vim, _ = exec.LookPath("vim.tiny")
	}
	if vim == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("vim is not installed; .ci/run must install vim-tiny")
		}
		t.Skip("vim is not installed (apt-get install vim-tiny); CI installs it")
	}
	c := newAllInOne(t)
	cfg := c.opensshConfig(t, "")
	script := `for i in $(seq 1 10); do echo "counter $i"; sleep 0.1; done; ` +
		`stty cols 100; ` +
		vim + ` -u NONE -N -n -c 'call setline(1, "VIM-WAS-HERE")' -c redraw -c 'sleep 300m' -c 'qa!'; ` +
		`for i in $(seq 11 20); do echo "counter $i"; sleep 0.1; done; exit 3`
	cmd := exec.Command("ssh", "-F", cfg, "-J", "proxy", "-tt", c.hostname, script)
	cmd.Env = append(os.Environ(), "TERM=xterm")
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, string(out))
	require.Equal(t, 3, exitErr.ExitCode(), string(out))
	require.Contains(t, string(out), "counter 20")

	complete := regexp.MustCompile(`\btrue\b`)
	sidOf := func() string {
		ls, _, _ := pctl(t, c.dataDir, "", "recordings", "ls")
		for _, line := range strings.Split(ls, "\n") {
			if strings.Contains(line, "seq 11 20") && complete.MatchString(line) {
				return strings.Fields(line)[0]
			}
		}
		return ""
	}
	require.Eventually(t, func() bool { return sidOf() != "" }, 30*time.Second, 200*time.Millisecond, "no complete recording of the session")
	sid := sidOf()
	alice := newPshEnv(t, c)
	alice.login(t, "alice", alicePassword+"\n")
	require.Contains(t, alice.mustRun(t, "", "recordings", "ls", "--since", "1h", "--user", "alice", "--node", c.hostname), sid)
	require.NotContains(t, alice.mustRun(t, "", "recordings", "ls", "--user", "bob"), sid)
	require.NotContains(t, alice.mustRun(t, "", "recordings", "ls", "--node", "elsewhere"), sid)
	played := alice.mustRun(t, "", "play", sid, "--format", "text")
	var want []string
	for i := 1; i <= 20; i++ {
		want = append(want, fmt.Sprintf("counter %d", i))
	}
	require.Equal(t, want, regexp.MustCompile(`counter \d+`).FindAllString(played, -1), played)
	require.Regexp(t, `\[resize [0-9.]+s\] 100x24\b`, played, "stty cols 100 is recorded")
	require.Contains(t, played, "VIM-WAS-HERE", "vim's screen is recorded")
	require.Regexp(t, `\[marker [0-9.]+s\] exit-status 3\n$`, played)
	t.Logf("psh play --format text:\n%s", lastLines(played, 12))

	// `ssh -tt` from a pipe asks for a terminal of 0x0, which asciicast
	// players refuse: the recording says 80x24.
	cast := alice.mustRun(t, "", "play", sid, "--format", "asciicast")
	header, _, _ := strings.Cut(cast, "\n")
	require.Contains(t, header, `"width":80,"height":24`, header)
}

// TestRecordingCapStopsRecordingNotSession: `head -c 300M /dev/urandom`
// in a session with max_recording_bytes at 4 MiB: the recording stops at
// the cap with a marker and a recording.capped audit event, the session
// goes on (and its exit status is still recorded), and the disk holds
// about the cap, not 300 MB.
func TestRecordingCapStopsRecordingNotSession(t *testing.T) {
	c := newAllInOne(t)
	const capBytes = 4 << 20
	netCfg := filepath.Join(t.TempDir(), "net.yaml")
	require.NoError(t, os.WriteFile(netCfg, []byte(fmt.Sprintf("kind: cluster_networking_config\nmetadata:\n  name: cluster_networking_config\nspec:\n  max_recording_bytes: %d\n", capBytes)), 0o600))
	mustPctl(t, c.dataDir, "", "create", "-f", netCfg)

	clt, err := c.viaJump(t, c.hostname+":0")
	require.NoError(t, err)
	s, err := clt.NewSession()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	const cmd = `head -c 300M /dev/urandom; echo; echo "SURVIVED-$((40+2))"; exit 7`
	start := time.Now()
	require.NoError(t, s.Start(cmd))
	var tail bytes.Buffer
	n, err := io.Copy(tailWriter{&tail, 4096}, stdout)
	require.NoError(t, err)
	var exitErr *ssh.ExitError
	require.ErrorAs(t, s.Wait(), &exitErr)
	require.Equal(t, 7, exitErr.ExitStatus(), "the session went on past the cap")
	require.Contains(t, tail.String(), "SURVIVED-42")
	require.Greater(t, n, int64(300<<20), "all of the output reached the client")
	t.Logf("%d MB through the session in %v", n>>20, time.Since(start))

	cappedSID := func() (sid string) {
		for _, e := range eventsLs(t, c.dataDir) {
			if e.Type == events.RecordingCapped {
				sid, _ = e.Fields[events.FieldSessionID].(string)
			}
		}
		return sid
	}
	require.Eventually(t, func() bool { return cappedSID() != "" }, 30*time.Second, 100*time.Millisecond, "no recording.capped audit event")
	sid := cappedSID()
	exportDone := func() []byte {
		out, _, err := pctl(t, c.dataDir, "", "recordings", "export", sid)
		if err == nil && strings.Contains(out, "exit-status 7") {
			return []byte(out)
		}
		return nil
	}
	require.Eventually(t, func() bool { return exportDone() != nil }, 30*time.Second, 200*time.Millisecond, "the capped recording did not reach auth complete")
	cast := exportDone()
	_, evs, err := recording.Parse(cast)
	require.NoError(t, err)
	var marks []string
	for _, e := range evs {
		if e.Code == "m" {
			marks = append(marks, e.Data)
		}
	}
	require.Equal(t, []string{"exec: " + cmd, fmt.Sprintf("recording stopped: max_recording_bytes (%d) reached", capBytes), "exit-status 7"}, marks)
	require.NotContains(t, string(cast), "SURVIVED-42", "nothing after the cap is recorded")
	require.Less(t, len(cast), capBytes+(1<<20), "the recording holds about the cap")
	var onDisk int64
	require.NoError(t, filepath.Walk(filepath.Join(c.dataDir, "auth", "recordings", sid), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			onDisk += fi.Size()
		}
		return err
	}))
	t.Logf("recording: %d bytes of events, %d bytes on the auth server's disk", len(cast), onDisk)
	require.Less(t, onDisk, int64(2*capBytes), "disk use is bounded by the cap")
	require.Contains(t, mustPctl(t, c.dataDir, "", "recordings", "verify", sid), "OK")
}

// tailWriter keeps the last n bytes written to b.
type tailWriter struct {
	b *bytes.Buffer
	n int
}

func (w tailWriter) Write(p []byte) (int, error) {
	w.b.Write(p)
	if over := w.b.Len() - w.n; over > 0 {
		w.b.Next(over)
		rest := append([]byte(nil), w.b.Bytes()...)
		w.b.Reset()
		w.b.Write(rest)
	}
	return len(p), nil
}
