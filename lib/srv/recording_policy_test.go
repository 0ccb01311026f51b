package srv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/recording/recpolicy/recpolicytest"
	"github.com/postern-dev/postern/lib/services"
)

// TestRecordingDecisionTable runs the recording decisions both doors
// share (recpolicytest.Cases; lib/web runs the same table through the
// proxy's web terminal) through a node's sessions: the same decision, the
// same session.start recording fields, the same access.denied fields.
func TestRecordingDecisionTable(t *testing.T) {
	for i, tc := range recpolicytest.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			audit := events.NewRecorder()
			e := newTestEnv(t, func(c *Config) {
				r, err := NewRecorder(RecorderConfig{Spool: recording.DirStorage{Dir: t.TempDir()}, Settings: func(context.Context) (*services.ClusterNetworkingConfig, error) {
					return tc.Settings()
				}})
				require.NoError(t, err)
				c.Recorder = r
				c.Audit = audit
			})
			roles := []string{"access"}
			if tc.RoleMode != "" {
				e.ap.UpsertRole(roleWithRecording(recpolicytest.Role, tc.RoleMode))
				roles = append(roles, recpolicytest.Role)
			}
			c := e.dialWithRoles(t, roles...)
			cmd := fmt.Sprintf("echo recpolicy-%d", i)
			if !tc.Refused {
				start, _ := ptyRun(t, c, audit, cmd)
				require.Equal(t, tc.StartFields(), recpolicytest.Pick(start.Fields, recpolicytest.RecordingStartKeys))
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			s, err := c.NewSession()
			require.NoError(t, err)
			defer s.Close()
			require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
			_, err = s.Output(cmd)
			require.Error(t, err, "a refused session does not run")
			denied, err := audit.Wait(ctx, events.AccessDenied, func(ev events.Event) bool { return ev.Fields[events.FieldTarget] == cmd })
			require.NoError(t, err)
			require.Equal(t, tc.Reason, denied.Fields[events.FieldReason])
			require.Equal(t, tc.RequiredBy(), denied.Fields["required_by"])
			require.Equal(t, "ssh", denied.Fields[events.FieldMethod])
			require.Equal(t, "session", denied.Fields[events.FieldKind])
			require.Equal(t, recpolicytest.Sorted(recpolicytest.RefusedKeys), recpolicytest.Keys(denied.Fields, events.FieldConnID))
		})
	}
}
