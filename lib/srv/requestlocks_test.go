package srv

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// TestRequestLockEndsItsConnections: a lock on an access request id ends
// the open connections whose certificate carries that id (the grant
// ended), refuses new ones, and leaves the same user's connections with
// another certificate alone.
func TestRequestLockEndsItsConnections(t *testing.T) {
	e := newLockEnv(t)
	id := services.NewAccessRequestID()
	granted := e.userCA.UserSigner(t, srvtest.UserCert{User: "alice", Logins: []string{e.me}, Cluster: testCluster, Now: e.clock.Now(),
		Extensions: func() map[string]string {
			ext := srvtest.DefaultPermits()
			ext[services.CertExtensionRequestID] = id
			return ext
		}()})
	withGrant, err := e.dialAs(e.me, granted)
	require.NoError(t, err)
	sess, err := withGrant.NewSession()
	require.NoError(t, err)
	stderr, err := sess.StderrPipe()
	require.NoError(t, err)
	errOut := watchOutput(stderr)
	require.NoError(t, sess.Start("sleep 600"))
	own := e.dial() // alice's own certificate
	defer own.Close()

	ended := make(chan error, 1)
	go func() { ended <- withGrant.Wait() }()
	e.lock(t, services.Lock{Target: services.LockTarget{AccessRequest: id}, Message: "the access request was denied"})
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection of the ended grant was not ended")
	}
	require.Contains(t, errOut.waitFor(t, "denied"), "access request "+id)

	_, banner, err := e.dialWithBanner(e.me, granted)
	require.Error(t, err)
	require.Contains(t, banner, "access request "+id)
	_, _, err = run(t, own, "true")
	require.NoError(t, err, "the user's connection without the grant must survive")
}
