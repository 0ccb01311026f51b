package integration

// The chaos tests' load (short sessions through both proxies, long
// line-fed shells) and their faults (chaos_test.go runs them and checks
// what must hold).

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/backend/etcdbk/etcdtest"
)

// load starts a short session every tick, alternately through each
// proxy, at most 4 at once, until stop is called; stop waits for the
// sessions in flight. Sessions that succeed are in *ok (their command).
type load struct {
	mu            sync.Mutex
	total, failed int
	ok            []string
	okAt          []time.Time // when each of ok ended
	errs          []string
	stop          context.CancelFunc
	done          sync.WaitGroup
}

func (c *chaosCluster) startLoad(phase int) *load {
	l := &load{}
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	inFlight := make(chan struct{}, 4)
	l.done.Add(1)
	go func() {
		defer l.done.Done()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			select {
			case inFlight <- struct{}{}:
			default:
				continue // a skipped tick is not a session
			}
			marker := fmt.Sprintf("chaos-%d-%d", phase, c.seq.Add(1))
			l.done.Add(1)
			go func() {
				defer l.done.Done()
				defer func() { <-inFlight }()
				err := c.session(i%len(c.proxies), marker)
				l.mu.Lock()
				defer l.mu.Unlock()
				l.total++
				if err != nil {
					l.failed++
					if len(l.errs) < 3 {
						l.errs = append(l.errs, fmt.Sprintf("via proxy %d: %v", i%len(c.proxies), err))
					}
					return
				}
				l.ok = append(l.ok, "echo "+marker)
				l.okAt = append(l.okAt, time.Now())
			}()
		}
	}()
	return l
}

func (l *load) finish() {
	l.stop()
	l.done.Wait()
}

// longSession is an interactive shell (`sh -s MARKER`, fed line by line)
// held open through a fault.
type longSession struct {
	cmd string
	ls  *lineSession
	clt *ssh.Client
	err error
}

func (c *chaosCluster) openLong(t *testing.T, i int, marker string) *longSession {
	t.Helper()
	l := &longSession{cmd: "sh -s " + marker}
	l.clt, l.err = jumpVia(t, c.cfg, c.proxies[i].sshAddr, chaosTarget)
	if l.err != nil {
		return l
	}
	l.ls = startLineSession(t, l.clt, l.cmd)
	l.check("up")
	return l
}

// check runs echo in the shell; the first error sticks.
func (l *longSession) check(word string) {
	if l.err != nil {
		return
	}
	marker := strings.TrimPrefix(l.cmd, "sh -s ")
	got, err := l.ls.roundTrip("echo " + marker + "-" + word)
	if err == nil && got != marker+"-"+word+"\n" {
		err = fmt.Errorf("got %q", got)
	}
	l.err = err
}

// end exits the shell and waits for the session's end.
func (l *longSession) end() {
	l.check("still-up")
	if l.err != nil {
		return
	}
	_, _ = l.ls.in.Write([]byte("exit\n"))
	done := make(chan error, 1)
	go func() { done <- l.ls.s.Wait() }()
	select {
	case l.err = <-done:
	case <-time.After(20 * time.Second):
		l.err = fmt.Errorf("the shell did not end within 20s of exit")
	}
	l.clt.Close()
}

func (c *chaosCluster) authKill(i int) chaosFault {
	return chaosFault{
		name:       fmt.Sprintf("auth server %d SIGKILL, restart", i+1),
		hold:       5 * time.Second,
		noFailures: true,
		inject:     func(t *testing.T) { c.auths[i].kill9(t) },
		heal:       func(t *testing.T) { c.auths[i].restart(t) },
	}
}

func (c *chaosCluster) authStop(i int) chaosFault {
	// Held well past auth.DefaultClientTimeout (30s), the bound of one
	// call to it: its clients must have failed over by then.
	return chaosFault{
		name:        fmt.Sprintf("auth server %d SIGSTOP, SIGCONT", i+1),
		hold:        45 * time.Second,
		stoppedAuth: i,
		checkDuring: 5 * time.Second,
		noFailures:  true,
		inject: func(t *testing.T) {
			require.NoError(t, c.auths[i].cmd.Process.Signal(syscall.SIGSTOP))
		},
		heal: func(t *testing.T) {
			require.NoError(t, c.auths[i].cmd.Process.Signal(syscall.SIGCONT))
		},
	}
}

func (c *chaosCluster) proxyKill(i int) chaosFault {
	return chaosFault{
		name:   fmt.Sprintf("proxy %d SIGKILL, restart", i+1),
		hold:   5 * time.Second,
		inject: func(t *testing.T) { c.proxies[i].kill9(t) },
		heal: func(t *testing.T) {
			c.proxies[i].start(t)
			c.waitTunnels(t, clientOf(t, c.auths[0], c.authAddr[0]))
		},
	}
}

func (c *chaosCluster) etcdMemberDown(i int) chaosFault {
	return chaosFault{
		name:       fmt.Sprintf("etcd member %d down", i+1),
		hold:       8 * time.Second,
		noFailures: true,
		inject:     func(t *testing.T) { c.etcd.Members[i].Stop() },
		heal:       func(t *testing.T) { c.etcd.Members[i].Restart(t) },
	}
}

func (c *chaosCluster) etcdQuorumLost() chaosFault {
	return chaosFault{
		name:       "etcd quorum lost (2 of 3 down)",
		hold:       15 * time.Second,
		noFailures: true,
		inject: func(t *testing.T) {
			c.etcd.Members[0].Stop()
			c.etcd.Members[1].Stop()
		},
		heal: func(t *testing.T) {
			// The first one back restores the quorum (2 of 3).
			c.etcd.Members[0].Restart(t)
			c.etcd.Members[1].Restart(t)
		},
	}
}

// etcdLeaderStopped stops the member that leads (the embedded members run
// in this process, so Stop is the nearest thing to SIGSTOP: the leader
// goes silent and the others elect another).
func (c *chaosCluster) etcdLeaderStopped() chaosFault {
	var leader *etcdtest.Server
	return chaosFault{
		name:       "etcd leader stopped",
		hold:       8 * time.Second,
		noFailures: true,
		inject: func(t *testing.T) {
			require.Eventually(t, func() bool {
				for _, m := range c.etcd.Members {
					if m.Etcd != nil && m.Etcd.Server.Leader() == m.Etcd.Server.MemberID() {
						leader = m
						return true
					}
				}
				return false
			}, 30*time.Second, 100*time.Millisecond, "etcd has a leader")
			t.Logf("stopping the etcd leader, %s", leader)
			leader.Stop()
		},
		heal: func(t *testing.T) { leader.Restart(t) },
	}
}

// rollingRestart restarts every part in turn, each back before the next
// goes: the etcd members, the auth servers (SIGTERM), the proxies
// (SIGTERM: they drain), the node (SIGTERM). Long sessions are not held:
// a proxy's or the node's restart ends the sessions through it.
func (c *chaosCluster) rollingRestart() chaosFault {
	return chaosFault{
		name:   "rolling restart of everything",
		noLong: true,
		inject: func(t *testing.T) {
			for _, m := range c.etcd.Members {
				m.Restart(t)
			}
			for _, d := range c.auths {
				require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
				d.restart(t)
			}
			clt := clientOf(t, c.auths[0], c.authAddr[0])
			for _, p := range c.proxies {
				require.NoError(t, p.node.cmd.Process.Signal(syscall.SIGTERM))
				err := <-p.node.done
				p.node.done <- err
				p.start(t)
				c.waitTunnels(t, clt)
			}
			require.NoError(t, c.node.cmd.Process.Signal(syscall.SIGTERM))
			err := <-c.node.done
			c.node.done <- err
			c.node.start(t, c.ns, c.node.args)
			c.waitTunnels(t, clt)
		},
		heal: func(t *testing.T) {},
	}
}
