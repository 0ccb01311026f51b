package recpolicy_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording/recpolicy"
	"github.com/postern-dev/postern/lib/recording/recpolicy/recpolicytest"
	"github.com/postern-dev/postern/lib/services"
)

// TestDecideTable: the shared table, decided for either recorder, gives
// the table's decision (the doors' tests then check that their callers
// do not bend it).
func TestDecideTable(t *testing.T) {
	for _, tc := range recpolicytest.Cases {
		for _, recorder := range []string{recpolicy.Node, recpolicy.Proxy} {
			t.Run(tc.Name+"/"+recorder, func(t *testing.T) {
				in := recpolicy.Input{Recorder: recorder, Settings: func(context.Context) (*services.ClusterNetworkingConfig, error) { return tc.Settings() }}
				if tc.RoleMode != "" {
					in.Mode, in.Role = tc.RoleMode, recpolicytest.Role
				}
				d := recpolicy.Decide(context.Background(), in)
				require.Equal(t, tc.Recorded, d.Record)
				require.Equal(t, tc.Refused, d.Refused)
				require.Equal(t, tc.RequiredBy(), d.RequiredBy)
				if tc.Refused {
					require.Equal(t, tc.Reason, d.RefusalReason())
					require.True(t, strings.HasPrefix(d.Err().Error(), tc.Reason))
				} else if !tc.Recorded {
					require.Equal(t, tc.Reason, d.Reason)
				}
				if tc.Refused {
					return // no session.start
				}
				f := events.Fields{}
				recpolicy.AddStartFields(f, d, int64(services.DefaultMaxRecordingBytes))
				require.Equal(t, tc.StartFields(), f)
			})
		}
	}
}

// TestNoRecorderAndLeafRequire: a recorder that does not record leaves
// the session unrecorded, or refuses it when a role (a leaf's too)
// requires the recording; a failed start does the same.
func TestNoRecorderAndLeafRequire(t *testing.T) {
	d := recpolicy.Decide(context.Background(), recpolicy.Input{Recorder: recpolicy.Proxy})
	require.False(t, d.Record)
	require.False(t, d.Refused)
	require.Equal(t, "this proxy does not record sessions", d.Reason)

	d = recpolicy.Decide(context.Background(), recpolicy.Input{Recorder: recpolicy.Proxy, LeafRequiredBy: "leafaudit", LeafCluster: "leaf1"})
	require.True(t, d.Refused)
	require.Equal(t, `session recording is required by role "leafaudit" of cluster "leaf1" and this proxy does not record sessions`, d.RefusalReason())

	ok := recpolicy.Decide(context.Background(), recpolicy.Input{Recorder: recpolicy.Node, Mode: services.RecordingRequire, Role: "audited",
		Settings: func(context.Context) (*services.ClusterNetworkingConfig, error) {
			return services.DefaultClusterNetworkingConfig(), nil
		}})
	require.True(t, ok.Record)
	failed := ok.StartFailed(recpolicy.ReasonSpoolUnwritable(recpolicy.Node))
	require.True(t, failed.Refused)
	require.Equal(t, `session recording is required by role "audited" and the node's recording spool cannot be written`, failed.RefusalReason())
	require.Equal(t, `session recording is required by role "audited" and the recording could not be stored on the node (its spool is full or cannot be written); the session is ended`, ok.EndedMessage())
}

// TestEventFieldNames: every recording event names its session with the
// same fields whichever door emits it.
func TestEventFieldNames(t *testing.T) {
	sub := recpolicy.Subject{Method: "web", Kind: "terminal", SessionID: "s", Target: "node1", Login: "l", RemoteAddr: "a", ServerID: "n", ServerHostname: "h"}
	subject := []string{events.FieldMethod, events.FieldKind, events.FieldSessionID, events.FieldTarget, events.FieldLogin, events.FieldRemoteAddr, events.FieldServerID, events.FieldServerHostname}
	with := func(extra ...string) []string {
		return recpolicytest.Sorted(append(append([]string(nil), subject...), extra...))
	}
	require.Equal(t, with(events.FieldReason, "required_by"), recpolicytest.Keys(recpolicy.FailedFields(sub, recpolicy.Proxy, "audited")))
	require.Equal(t, with(events.FieldReason), recpolicytest.Keys(recpolicy.FailedFields(sub, recpolicy.Proxy, "")))
	require.Equal(t, with("max_recording_bytes"), recpolicytest.Keys(recpolicy.CappedFields(sub, 1)))
	require.Equal(t, recpolicytest.Sorted(recpolicytest.RefusedKeys), recpolicytest.Keys(recpolicy.RefusedFields(sub, recpolicy.Decision{RequiredBy: "audited"})))
}

// TestLeaf: the decision is the doors' to call; it links neither the SSH
// server nor the web server (nor the SSH proxy).
func TestLeaf(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/postern-dev/postern/lib/services", "the listing is not recpolicy's")
	for _, dep := range deps {
		for _, door := range []string{"lib/srv", "lib/web", "lib/proxy"} {
			p := "github.com/postern-dev/postern/" + door
			require.False(t, dep == p || strings.HasPrefix(dep, p+"/"), "recpolicy links %s", dep)
		}
	}
}
