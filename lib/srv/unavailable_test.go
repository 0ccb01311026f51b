package srv

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// downAccessPoint is the access point of a process whose auth server (or
// its backend) stops answering: calls fail the way the auth client's do
// then. A fake of the narrow AccessPoint interface only.
type downAccessPoint struct {
	AccessPoint
	caDown, rolesDown atomic.Bool
}

var errAuthDown = trace.ConnectionProblem(nil, "the auth server's backend is unavailable: etcd: context deadline exceeded")

func (a *downAccessPoint) GetCertAuthority(ctx context.Context, cluster string, t services.CertAuthType, withSecrets bool) (*services.CertAuthority, error) {
	if a.caDown.Load() {
		return nil, errAuthDown
	}
	return a.AccessPoint.GetCertAuthority(ctx, cluster, t, withSecrets)
}

func (a *downAccessPoint) GetRole(ctx context.Context, name string) (*services.Role, error) {
	if a.rolesDown.Load() {
		return nil, errAuthDown
	}
	return a.AccessPoint.GetRole(ctx, name)
}

// TestAuthUnavailableBanner is issue 10 item 13 on the SSH ports: when
// the server cannot check a valid certificate because auth is down, the
// client is told so in an authentication banner (OpenSSH prints it before
// "Permission denied"), on the node port and the proxy port alike; when
// auth answers, a refusal carries no banner.
func TestAuthUnavailableBanner(t *testing.T) {
	for _, mode := range []string{"node", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			var ap *downAccessPoint
			e := newTestEnv(t, func(c *Config) {
				ap = &downAccessPoint{AccessPoint: c.AccessPoint}
				c.AccessPoint = ap
				if mode == "proxy" {
					c.Proxy = &fakeProxy{target: "127.0.0.1:1", seen: make(chan *authz.Identity, 4)}
					c.GetNode = nil
				}
			})
			dial := func(s ssh.Signer) (string, error) {
				var banner atomic.Value
				banner.Store("")
				cfg := e.clientConfig(e.me, s)
				cfg.BannerCallback = func(msg string) error {
					banner.Store(banner.Load().(string) + msg)
					return nil
				}
				c, err := ssh.Dial("tcp", e.addr, cfg)
				if err == nil {
					c.Close()
				}
				return banner.Load().(string), err
			}
			good := e.signer(e.me)

			banner, err := dial(good)
			require.NoError(t, err)
			require.Empty(t, banner)

			ap.caDown.Store(true)
			banner, err = dial(good)
			require.ErrorContains(t, err, "unable to authenticate")
			require.Equal(t, MsgAuthUnavailable, banner)
			e.requireLog("Cannot fetch the user CA: the auth server or its backend is unavailable.")
			ap.caDown.Store(false)

			ap.rolesDown.Store(true)
			banner, err = dial(good)
			require.ErrorContains(t, err, "unable to authenticate")
			require.Equal(t, MsgAuthUnavailable, banner)
			ap.rolesDown.Store(false)

			// A certificate the server can check and refuses (expired):
			// no banner, just the usual denial. (A login the roles do
			// not grant is explained: TestAuthDenials.)
			banner, err = dial(e.userCA.UserSigner(t, srvtest.UserCert{User: "alice", Logins: []string{e.me}, Cluster: testCluster, Now: e.clock.Now().Add(-2 * time.Hour), TTL: time.Hour}))
			require.ErrorContains(t, err, "unable to authenticate")
			require.Empty(t, banner)
		})
	}
}
