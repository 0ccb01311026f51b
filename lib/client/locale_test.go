package client

import (
	"bytes"
	"context"
	"net"
	"os/user"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

func TestLocaleEnv(t *testing.T) {
	got := localeEnv([]string{"LANG=de_DE.UTF-8", "LC_TIME=C", "LC_=x", "LANGUAGE=de", "PATH=/bin", "LC_CTYPE=", "TERM=xterm", "lc_all=x"})
	require.Equal(t, [][2]string{{"LANG", "de_DE.UTF-8"}, {"LC_TIME", "C"}}, got)
}

// TestRunSessionSendsLocale: psh's session on a real node gets the
// user's LANG and LC_* (and nothing else of the environment); without
// them the node's default applies.
func TestRunSessionSendsLocale(t *testing.T) {
	me, err := user.Current()
	require.NoError(t, err)
	userCA, hostCA := srvtest.NewCA(t), srvtest.NewCA(t)
	ap := srvtest.NewAccessPoint()
	ap.SetCA(userCA.CertAuthority("example", services.UserCA))
	ap.SetCA(hostCA.CertAuthority("example", services.HostCA))
	ap.UpsertRole(srvtest.AccessRole())
	logger := logrus.New()
	logger.SetOutput(&bytes.Buffer{})
	installed := map[string]bool{"C.UTF-8": true, "de_DE.UTF-8": true}
	node, err := srv.New(srv.Config{
		ClusterName: "example",
		HostSigners: []ssh.Signer{hostCA.HostSigner(t, "node-uuid", "127.0.0.1")},
		AccessPoint: ap,
		GetNode:     func() services.Node { return services.Node{UUID: "node-uuid", Hostname: "node1", Cluster: "example"} },
		LookupLogin: func(login string) (*srv.Login, error) {
			l, err := srv.LookupOSLogin(login)
			if err == nil {
				l.Shell = "/bin/sh"
			}
			return l, err
		},
		AgentSocketDir: t.TempDir(),
		Locale:         srv.LocaleConfig{Default: "C.UTF-8", Installed: func(n string) bool { return installed[n] }},
		Deps:           observe.Deps{Logger: logger.WithField("component", "node")},
	})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- node.Serve(ln) }()
	t.Cleanup(func() {
		require.NoError(t, node.Close())
		<-served
	})
	signer := userCA.UserSigner(t, srvtest.UserCert{User: "alice", Logins: []string{me.Username}, Cluster: "example"})
	clt, err := ssh.Dial("tcp", ln.Addr().String(), &ssh.ClientConfig{
		User: me.Username, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hostCA.HostKeyCallback(), Timeout: 10 * time.Second,
	})
	require.NoError(t, err)
	defer clt.Close()

	run := func() string {
		var out, errOut bytes.Buffer
		f := false
		require.NoError(t, RunSession(context.Background(), clt, SessionConfig{
			Command: []string{`echo "LANG=$LANG LC_TIME=$LC_TIME FOO=$POSTERN_NOT_SENT"`}, TTY: &f, Stdout: &out, Stderr: &errOut,
		}))
		require.Empty(t, errOut.String())
		return strings.TrimSpace(out.String())
	}
	t.Setenv("LANG", "de_DE.UTF-8")
	t.Setenv("LC_TIME", "C")
	t.Setenv("POSTERN_NOT_SENT", "x")
	require.Equal(t, "LANG=de_DE.UTF-8 LC_TIME=C FOO=", run())

	t.Setenv("LANG", "")
	t.Setenv("LC_TIME", "")
	require.Equal(t, "LANG=C.UTF-8 LC_TIME= FOO=", run(), "the node's default")
}
