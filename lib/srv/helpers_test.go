package srv

import (
	"bytes"
	"context"
	"io"
	"net"
	"os/user"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

func TestMain(m *testing.M) {
	// The sftp child (see sftp.go) is this test binary re-executed.
	RunReexecChild()
	goleak.VerifyTestMain(m)
}

const testCluster = "example"

// testEnv is a node server on 127.0.0.1:0 with its CAs and access point.
type testEnv struct {
	t      testing.TB
	userCA *srvtest.CA
	hostCA *srvtest.CA
	ap     *srvtest.AccessPoint
	clock  clockwork.Clock
	srv    *Server
	addr   string
	logs   *logtest.Hook
	me     string // the OS user running the tests

	nodeMu sync.Mutex
	node   services.Node
}

// testShell makes every login's shell /bin/sh: root's bash here sources a
// slow ~/.bashrc when it sees SSH_CLIENT, and nobody's shell is nologin.
func testShell(login string) (*Login, error) {
	l, err := LookupOSLogin(login)
	if err != nil {
		return nil, err
	}
	l.Shell = "/bin/sh"
	return l, nil
}

func newTestEnv(t *testing.T, opts ...func(*Config)) *testEnv {
	t.Helper()
	return newTestEnvTB(t, opts...)
}

func newTestEnvTB(t testing.TB, opts ...func(*Config)) *testEnv {
	t.Helper()
	me, err := user.Current()
	require.NoError(t, err)
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	e := &testEnv{
		t:      t,
		userCA: srvtest.NewCA(t),
		hostCA: srvtest.NewCA(t),
		ap:     srvtest.NewAccessPoint(),
		logs:   hook,
		me:     me.Username,
		node: services.Node{
			UUID: "5f1c-node-uuid", Hostname: "node1", Cluster: testCluster,
			Labels: map[string]string{"env": "test"},
		},
	}
	e.ap.SetCA(e.userCA.CertAuthority(testCluster, services.UserCA))
	e.ap.SetCA(e.hostCA.CertAuthority(testCluster, services.HostCA))
	e.ap.UpsertRole(srvtest.AccessRole())
	cfg := Config{
		ClusterName: testCluster,
		HostSigners: []ssh.Signer{e.hostCA.HostSigner(t, e.node.UUID, "node1", "127.0.0.1")},
		AccessPoint: e.ap,
		GetNode: func() services.Node {
			e.nodeMu.Lock()
			defer e.nodeMu.Unlock()
			return e.node
		},
		LookupLogin:    testShell,
		AgentSocketDir: t.TempDir(),
		Deps:           observe.Deps{Logger: logger.WithField("component", "node")},
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	e.clock = cfg.Clock
	e.srv, err = New(cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e.addr = ln.Addr().String()
	served := make(chan error, 1)
	go func() { served <- e.srv.Serve(ln) }()
	t.Cleanup(func() {
		require.NoError(t, e.srv.Close())
		require.ErrorIs(t, <-served, ErrServerClosed)
	})
	return e
}

// signer returns a certificate for the test user with logins.
func (e *testEnv) signer(logins ...string) ssh.Signer {
	return e.userCA.UserSigner(e.t, srvtest.UserCert{User: "alice", Logins: logins, Cluster: testCluster, Now: e.clock.Now()})
}

func (e *testEnv) clientConfig(login string, s ssh.Signer) *ssh.ClientConfig {
	return &ssh.ClientConfig{
		User:            login,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(s)},
		HostKeyCallback: e.hostCA.HostKeyCallback(),
		Timeout:         10 * time.Second,
	}
}

func (e *testEnv) dialAs(login string, s ssh.Signer) (*ssh.Client, error) {
	return ssh.Dial("tcp", e.addr, e.clientConfig(login, s))
}

// dial connects as the current OS user with a valid certificate.
func (e *testEnv) dial() *ssh.Client {
	e.t.Helper()
	c, err := e.dialAs(e.me, e.signer(e.me))
	require.NoError(e.t, err)
	e.t.Cleanup(func() { c.Close() })
	return c
}

// run executes cmd in a new session and returns stdout, stderr, error.
func run(t *testing.T, c *ssh.Client, cmd string) (string, string, error) {
	t.Helper()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	var out, errb bytes.Buffer
	s.Stdout, s.Stderr = &out, &errb
	err = s.Run(cmd)
	return out.String(), errb.String(), err
}

// requireLog waits for a log entry whose message and fields contain all
// of parts: the server logs asynchronously to the client's view.
func (e *testEnv) requireLog(parts ...string) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		for _, entry := range e.logs.AllEntries() {
			s, _ := entry.String()
			ok := true
			for _, p := range parts {
				if !strings.Contains(s, p) {
					ok = false
					break
				}
			}
			if ok {
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "no log entry with %q", parts)
}

// waitFor reads r until the accumulated output contains want.
type outputWatcher struct {
	mu     sync.Mutex
	cond   *sync.Cond
	buf    bytes.Buffer
	closed bool
}

func watchOutput(r io.Reader) *outputWatcher {
	w := &outputWatcher{}
	w.cond = sync.NewCond(&w.mu)
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := r.Read(b)
			w.mu.Lock()
			w.buf.Write(b[:n])
			if err != nil {
				w.closed = true
			}
			w.cond.Broadcast()
			w.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return w
}

// waitFor blocks until the output contains want (or the stream ended).
func (w *outputWatcher) waitFor(t *testing.T, want string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		w.mu.Lock()
		w.cond.Broadcast()
		w.mu.Unlock()
	})
	defer stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for !strings.Contains(w.buf.String(), want) {
		if w.closed || ctx.Err() != nil {
			t.Fatalf("output never contained %q; got %q", want, w.buf.String())
		}
		w.cond.Wait()
	}
	return w.buf.String()
}

func (w *outputWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
