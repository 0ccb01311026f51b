package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/backend/etcdbk/etcdtest"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/freeport"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/recording/s3test"
)

// chaosEnv is the variable that turns TestChaosFull on (`make chaos`).
const chaosEnv = "POSTERN_CHAOS"

// TestChaosShort is the CI form of the fault-injection test (see
// chaosCluster): an auth server SIGKILLed and restarted, an auth server
// SIGSTOPped and SIGCONTed, one etcd member down, one after another with
// recovery in between, under load. After each fault every session that
// succeeded must have its session.start and session.end in the audit log
// and a complete recording that verifies, read through either auth
// server. docs/reliability.md describes it.
func TestChaosShort(t *testing.T) {
	c := startChaosCluster(t)
	c.run(t, []chaosFault{c.authKill(0), c.authStop(1), c.etcdMemberDown(2)})
}

// TestChaosFull is every fault of docs/reliability.md, in turn: it runs
// only with POSTERN_CHAOS=1 (`make chaos`), for about five minutes (a
// minute more per fault that loses sessions: the check waits for
// stragglers).
func TestChaosFull(t *testing.T) {
	if os.Getenv(chaosEnv) != "1" {
		t.Skipf("the full fault-injection run takes about five minutes: set %s=1 to run it (make chaos); TestChaosShort is its CI form", chaosEnv)
	}
	c := startChaosCluster(t)
	c.run(t, []chaosFault{
		c.authKill(0), c.authStop(1), c.proxyKill(0), c.etcdMemberDown(2),
		c.etcdQuorumLost(), c.etcdLeaderStopped(), c.rollingRestart(),
	})
}

// chaosCluster is what the chaos tests break: a three-member etcd; two
// auth servers, real `postern start --roles auth` processes on fixed
// ports, keeping recordings in one S3 bucket (a real S3 server,
// s3test); two proxy processes joined to both auth servers; and a node
// in a network namespace that nothing can connect into, reached only
// through its tunnels to both proxies. Clients are x/crypto/ssh doing
// what `ssh -J proxy natted` does.
type chaosCluster struct {
	etcd     *etcdtest.Cluster
	auths    []*daemon
	authAddr []string
	proxies  []*proxyDaemon
	ns       *netNS
	node     *nsNode
	nodeUUID string
	identity *auth.Identity
	cfg      *ssh.ClientConfig
	// since bounds the audit searches: nothing of interest is older.
	since time.Time
	seq   atomic.Int64
}

const (
	chaosTarget = "natted:0"
	// sessionBound is the longest one short session may take, dial to
	// exit status, before it counts as failed.
	sessionBound = 30 * time.Second
	// recoveryBound is how long after a fault ends a new session through
	// each proxy and every proxy's /readyz must be back.
	recoveryBound = 90 * time.Second
	// auditBound is how long after a fault's sessions ended their events
	// and recordings may take to show through both auth servers.
	auditBound = 60 * time.Second
)

func startChaosCluster(t *testing.T) *chaosCluster {
	t.Helper()
	c := &chaosCluster{since: time.Now().Add(-time.Minute)}
	c.ns = newNetNS(t)
	cfgFile := s3RecordingsConfig(t, s3test.Start(t, s3test.Options{TLS: true}))
	c.etcd = etcdtest.StartCluster(t, 3)
	c.authAddr = []string{freeport.Addr(t), freeport.Addr(t)}
	for _, addr := range c.authAddr {
		c.auths = append(c.auths, launchDaemon(t, t.TempDir(), "--roles", "auth", "--backend", "etcd",
			"--etcd-endpoints", strings.Join(c.etcd.Endpoints, ","), "--config", cfgFile, "--auth-addr", addr))
	}
	for _, d := range c.auths {
		d.wait(t)
	}
	authDir := c.auths[0].dataDir
	id, err := auth.ReadIdentity(config.AdminIdentityDir(authDir))
	require.NoError(t, err)
	c.identity = id

	u, err := user.Current()
	require.NoError(t, err)
	mustPctl(t, authDir, alicePassword+"\n", "users", "add", "alice", "--logins", u.Username)
	keyPath := filepath.Join(t.TempDir(), "alice")
	mustPctl(t, authDir, "", "auth", "sign", "--user", "alice", "--ttl", "1h", "--out", keyPath)
	c.cfg = (&allInOne{login: u.Username, keyPath: keyPath}).clientConfig(t)

	// Each proxy lists both auth servers, in opposite orders.
	list := c.authAddr[0] + "," + c.authAddr[1]
	rlist := c.authAddr[1] + "," + c.authAddr[0]
	c.proxies = []*proxyDaemon{
		startNSProxyDaemonVia(t, authDir, list, "edge-a", c.ns.hostIP),
		startNSProxyDaemonVia(t, authDir, rlist, "edge-b", c.ns.hostIP),
	}
	clt := clientOf(t, c.auths[1], c.authAddr[1])
	waitProxies(t, clt, 2)
	rec, n := startNSNodeVia(t, c.ns, authDir, c.proxies[0].webAddr, clt, "natted")
	c.node, c.nodeUUID = n, rec.UUID
	c.waitTunnels(t, clt)
	return c
}

// waitTunnels waits until the node holds a tunnel to both proxies.
func (c *chaosCluster) waitTunnels(t *testing.T, clt *auth.Client) {
	t.Helper()
	var holders []string
	require.Eventually(t, func() bool {
		tcs, err := clt.GetTunnelConnections(context.Background())
		if err != nil {
			return false
		}
		holders = nil
		for _, tc := range tcs {
			if tc.NodeUUID == c.nodeUUID && !slices.Contains(holders, tc.ProxyUUID) {
				holders = append(holders, tc.ProxyUUID)
			}
		}
		return len(holders) == len(c.proxies)
	}, 60*time.Second, 100*time.Millisecond, "the node has a tunnel to each proxy, not just %v; its log:\n%s", &holders, c.node.stderr)
}

// session is one short session through proxy i, bounded by sessionBound
// (a deadline on the connection to the proxy, which carries everything):
// it runs `echo marker` on the node and checks the answer.
func (c *chaosCluster) session(i int, marker string) error {
	addr := c.proxies[i].sshAddr
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(sessionBound))
	pc, chans, reqs, err := ssh.NewClientConn(nc, addr, c.cfg)
	if err != nil {
		return fmt.Errorf("proxy handshake: %w", err)
	}
	proxy := ssh.NewClient(pc, chans, reqs)
	defer proxy.Close()
	conn, err := proxy.Dial("tcp", chaosTarget)
	if err != nil {
		return fmt.Errorf("dial node: %w", err)
	}
	sconn, nchans, nreqs, err := ssh.NewClientConn(conn, chaosTarget, c.cfg)
	if err != nil {
		return fmt.Errorf("node handshake: %w", err)
	}
	node := ssh.NewClient(sconn, nchans, nreqs)
	defer node.Close()
	s, err := node.NewSession()
	if err != nil {
		return fmt.Errorf("session: %w", err)
	}
	defer s.Close()
	out, err := s.Output("echo " + marker)
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if string(out) != marker+"\n" {
		return fmt.Errorf("exec: got %q", out)
	}
	return nil
}

// chaosFault is one fault: inject breaks something, heal undoes it (a
// restart, SIGCONT); the load runs from before inject until after heal.
type chaosFault struct {
	name   string
	hold   time.Duration // between inject and heal
	inject func(t *testing.T)
	heal   func(t *testing.T)
	// noLong: the fault ends every session through a proxy by design (it
	// restarts them), so no long session is held through it.
	noLong bool
	// stoppedAuth, with checkDuring, is the auth server the fault stops:
	// the sessions that ended in the first checkDuring of the fault must
	// be audited and recorded through the other auth server by the end of
	// hold, before the stopped one comes back (its clients failed over).
	stoppedAuth int
	checkDuring time.Duration
	// noFailures: the cluster is built to ride this fault out (another
	// auth server, an etcd quorum, or the proxies' last good view of the
	// cluster without one), so no short session may fail. A fault that
	// takes a proxy away drops the sessions through it: those count.
	noFailures bool
}

// chaosResult is one row of the results table.
type chaosResult struct {
	name                  string
	total, failed         int
	longTotal, longFailed int
	recovery, ready       time.Duration
	verified              int
	problems              []string
	firstErrs             []string
}

// run applies the faults one after another and prints the table; a fault
// that loses events or recordings fails the test (t.Errorf) and the next
// fault still runs, so one run says which faults hold.
func (c *chaosCluster) run(t *testing.T, faults []chaosFault) {
	t.Helper()
	start := time.Now()
	var results []*chaosResult
	defer func() { t.Log(chaosTable(results, time.Since(start))) }()
	for i, f := range faults {
		r := &chaosResult{name: f.name}
		results = append(results, r)
		t.Logf("fault %d: %s", i+1, f.name)
		var longs []*longSession
		if !f.noLong {
			for p := range c.proxies {
				longs = append(longs, c.openLong(t, p, fmt.Sprintf("chaos-long-%d-%d", i, p)))
			}
		}
		l := c.startLoad(i)
		c.waitSessions(t, l, 4)
		f.inject(t)
		injected := time.Now()
		// The fault lasts f.hold, under load: no condition to await.
		if f.checkDuring > 0 {
			time.Sleep(f.checkDuring)
			var early []string
			l.mu.Lock()
			for k, at := range l.okAt {
				if at.After(injected) {
					early = append(early, l.ok[k])
				}
			}
			l.mu.Unlock()
			time.Sleep(f.hold - f.checkDuring)
			other := 1 - f.stoppedAuth
			if problems := c.verify(t, early, []int{other}, time.Second); len(problems) > 0 {
				t.Errorf("fault %q: while auth server %d is still stopped (%v into the fault), of %d sessions that ended in its first %v, some are not audited and recorded through auth server %d (no failover):\n  %s",
					f.name, f.stoppedAuth+1, time.Since(injected).Round(time.Second), len(early), f.checkDuring, other+1, strings.Join(problems, "\n  "))
				r.problems = append(r.problems, "during the stop: "+problems[len(problems)-1])
			}
		} else {
			time.Sleep(f.hold)
		}
		f.heal(t)
		r.recovery, r.ready = c.recover(t, f.name, i)
		c.waitSessions(t, l, 4)
		l.finish()
		ok := l.ok
		r.total, r.failed, r.firstErrs = l.total, l.failed, l.errs
		if f.noFailures && r.failed > 0 {
			t.Errorf("fault %q: %d of %d sessions failed; the cluster rides this fault out, none may fail. First: %s",
				f.name, r.failed, r.total, strings.Join(r.firstErrs, "; "))
			r.problems = append(r.problems, fmt.Sprintf("%d of %d sessions failed", r.failed, r.total))
			t.Logf("the node's log (last lines):\n%s", lastLines(c.node.stderr.String(), 40))
		}
		for _, ls := range longs {
			ls.end()
			r.longTotal++
			if ls.err != nil {
				r.longFailed++
				r.firstErrs = append(r.firstErrs, fmt.Sprintf("long %q: %v", ls.cmd, ls.err))
				continue
			}
			ok = append(ok, ls.cmd)
		}
		for _, e := range r.firstErrs {
			t.Logf("  %s: %s", f.name, e)
		}
		r.verified = len(ok)
		problems := c.verify(t, ok, []int{0, 1}, auditBound)
		if len(problems) > 0 {
			t.Errorf("fault %q: of %d sessions that succeeded, some are not fully audited and recorded:\n  %s",
				f.name, len(ok), strings.Join(problems, "\n  "))
		}
		r.problems = append(r.problems, problems...)
	}
}

// waitSessions waits until the load has n more finished sessions than
// now, successful or not (the load is running: this is progress).
func (c *chaosCluster) waitSessions(t *testing.T, l *load, n int) {
	t.Helper()
	l.mu.Lock()
	want := l.total + n
	l.mu.Unlock()
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.total >= want
	}, 2*sessionBound, 50*time.Millisecond, "the load makes no progress")
}

// recover measures, from the moment the fault ended, how long until a new
// session succeeds through each proxy and until every proxy's /readyz is
// 200. It fails the test (fatally: later faults would measure this one)
// when either takes longer than recoveryBound.
func (c *chaosCluster) recover(t *testing.T, name string, phase int) (session, ready time.Duration) {
	t.Helper()
	healed := time.Now()
	var wg sync.WaitGroup
	wg.Add(2)
	var sessionErr, readyErr error
	go func() {
		defer wg.Done()
		for p := range c.proxies {
			for {
				err := c.session(p, fmt.Sprintf("chaos-probe-%d-%d", phase, p))
				if err == nil {
					break
				}
				if time.Since(healed) > recoveryBound {
					sessionErr = fmt.Errorf("no session through proxy %d: %w", p, err)
					return
				}
				time.Sleep(200 * time.Millisecond) // a retry interval, as a client's
			}
		}
		session = time.Since(healed)
	}()
	go func() {
		defer wg.Done()
		for p := range c.proxies {
			for {
				resp, err := http.Get("http://" + c.proxies[p].diagAddr + "/readyz")
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						break
					}
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
				if time.Since(healed) > recoveryBound {
					readyErr = fmt.Errorf("proxy %d /readyz: %w", p, err)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		ready = time.Since(healed)
	}()
	wg.Wait()
	require.NoError(t, sessionErr, "fault %q: new sessions did not recover within %v", name, recoveryBound)
	require.NoError(t, readyErr, "fault %q: readiness did not recover within %v", name, recoveryBound)
	return session, ready
}

// verify checks, through the API of each auth server in auths, that
// every command in cmds (a session that succeeded) has a session.start
// and a session.end, and a complete recording that verifies against the
// hash session.end carries; it waits up to bound for stragglers (uploads
// run after the session). It returns what is missing, per auth server;
// and runs `pctl recordings verify` on one of them through the last.
func (c *chaosCluster) verify(t *testing.T, cmds []string, auths []int, bound time.Duration) []string {
	t.Helper()
	var problems []string
	for _, a := range auths {
		clt, err := auth.NewClient(auth.ClientConfig{Addr: c.authAddr[a], Identity: c.identity, Timeout: 20 * time.Second})
		require.NoError(t, err)
		pending := slices.Clone(cmds)
		var why map[string]string
		deadline := time.Now().Add(bound)
		for len(pending) > 0 {
			why = c.check(clt, pending)
			pending = pending[:0]
			for cmd := range why {
				pending = append(pending, cmd)
			}
			if len(pending) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond) // polling the audit log and the store
		}
		clt.Close()
		slices.Sort(pending)
		for i, cmd := range pending {
			if i == 5 {
				problems = append(problems, fmt.Sprintf("through auth server %d: and %d more", a+1, len(pending)-5))
				break
			}
			problems = append(problems, fmt.Sprintf("through auth server %d: %q: %s", a+1, cmd, why[cmd]))
		}
		if len(pending) > 0 {
			problems = append(problems, fmt.Sprintf("through auth server %d: %d of %d sessions incomplete after %v", a+1, len(pending), len(cmds), bound))
		}
	}
	last := auths[len(auths)-1]
	if len(problems) == 0 && len(cmds) > 0 {
		// The CLI an auditor would use, on one session.
		clt, err := auth.NewClient(auth.ClientConfig{Addr: c.authAddr[last], Identity: c.identity, Timeout: 20 * time.Second})
		require.NoError(t, err)
		defer clt.Close()
		starts, err := clt.SearchEvents(context.Background(), c.since, events.SessionStart, 10000)
		require.NoError(t, err)
		for _, e := range starts {
			if e.Fields[events.FieldCommand] == cmds[0] {
				out, errOut, err := pctl(t, c.auths[last].dataDir, "", "recordings", "verify", fmt.Sprint(e.Fields[events.FieldSessionID]))
				if err != nil || !strings.Contains(out, "hash chain intact") {
					problems = append(problems, fmt.Sprintf("pctl recordings verify %q: %s%s %v", cmds[0], out, errOut, err))
				}
				break
			}
		}
	}
	return problems
}

// check returns, for each command of cmds not yet fully audited and
// recorded through clt, what is missing.
func (c *chaosCluster) check(clt *auth.Client, cmds []string) map[string]string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	why := map[string]string{}
	fail := func(reason string) map[string]string {
		for _, cmd := range cmds {
			why[cmd] = reason
		}
		return why
	}
	starts, err := clt.SearchEvents(ctx, c.since, events.SessionStart, 10000)
	if err != nil {
		return fail(fmt.Sprintf("searching session.start: %v", err))
	}
	ends, err := clt.SearchEvents(ctx, c.since, events.SessionEnd, 10000)
	if err != nil {
		return fail(fmt.Sprintf("searching session.end: %v", err))
	}
	metas, err := clt.ListRecordings(ctx)
	if err != nil {
		return fail(fmt.Sprintf("listing recordings: %v", err))
	}
	sidOf := map[string]string{}
	for _, e := range starts {
		if cmd, ok := e.Fields[events.FieldCommand].(string); ok {
			sidOf[cmd], _ = e.Fields[events.FieldSessionID].(string)
		}
	}
	hashOf := map[string]string{}
	ended := map[string]bool{}
	for _, e := range ends {
		sid, _ := e.Fields[events.FieldSessionID].(string)
		ended[sid] = true
		hashOf[sid], _ = e.Fields[events.FieldRecordingHash].(string)
	}
	complete := map[string]bool{}
	for _, m := range metas {
		complete[m.SessionID] = m.Complete
	}
	for _, cmd := range cmds {
		sid, ok := sidOf[cmd]
		switch {
		case !ok:
			why[cmd] = "no session.start"
		case !ended[sid]:
			why[cmd] = "no session.end for session " + sid
		case hashOf[sid] == "":
			why[cmd] = "session.end of " + sid + " carries no recording hash"
		case !complete[sid]:
			why[cmd] = "recording " + sid + " missing or incomplete in the store"
		default:
			var chunks []recording.Chunk
			err := clt.GetRecording(ctx, sid, func(ch recording.Chunk) error { chunks = append(chunks, ch); return nil })
			if err != nil {
				why[cmd] = fmt.Sprintf("reading recording %s: %v", sid, err)
				continue
			}
			res, err := recording.Verify(chunks, hashOf[sid])
			if err != nil {
				why[cmd] = fmt.Sprintf("recording %s does not verify: %v", sid, err)
			} else if !res.Complete {
				why[cmd] = "recording " + sid + " verifies but is not complete"
			}
		}
	}
	return why
}

// chaosTable is the results as a Markdown table, for docs/reliability.md.
func chaosTable(results []*chaosResult, took time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos results (%d faults, %v in all):\n\n", len(results), took.Round(time.Second))
	b.WriteString("| Fault | Short sessions failed/total | Long sessions cut/total | New session after | /readyz 200 after | Sessions checked | Audit and recordings |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		held := "all complete"
		if len(r.problems) > 0 {
			held = "FAILED: " + strings.ReplaceAll(r.problems[len(r.problems)-1], "|", "/")
			if r.problems[0] != r.problems[len(r.problems)-1] && !strings.HasPrefix(r.problems[0], "through") {
				held = "FAILED: " + strings.ReplaceAll(r.problems[0], "|", "/") + "; " + strings.TrimPrefix(held, "FAILED: ")
			}
		}
		long := fmt.Sprintf("%d/%d", r.longFailed, r.longTotal)
		if r.longTotal == 0 {
			long = "n/a"
		}
		fmt.Fprintf(&b, "| %s | %d/%d | %s | %v | %v | %d | %s |\n", r.name, r.failed, r.total, long,
			r.recovery.Round(100*time.Millisecond), r.ready.Round(100*time.Millisecond), r.verified, held)
	}
	return b.String()
}

// The faults.
