package srv

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/party"
)

// TestJoinIsMarkedInTheRecording: a join and a leave are "m" markers in
// the session's recording, between the output around them; the joiner's
// notices are not output.
func TestJoinIsMarkedInTheRecording(t *testing.T) {
	e, spool, audit := recordingEnv(t, services.ClusterNetworkingConfigSpec{})
	e.ap.UpsertRole(auditorRole("auditor", "observer"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o := startOwnerShell(t, e)
	o.typeLine(t, "echo before-$((1+1))")
	o.out.waitFor(t, "before-2")
	j, err := join(t, e, "olga", []string{"access", "auditor"}, party.JoinSubsystem(o.id, party.Observer))
	require.NoError(t, err)
	o.out.waitFor(t, "[postern: olga joined as observer]")
	require.NoError(t, j.s.Close())
	o.out.waitFor(t, "[postern: olga (observer) left]")
	o.typeLine(t, "echo after-$((2+2)); exit")
	require.NoError(t, o.s.Wait())

	end, err := audit.Wait(ctx, events.SessionEnd, func(ev events.Event) bool { return ev.Fields[events.FieldSessionID] == o.id })
	require.NoError(t, err)
	chunks, err := recording.GetChunks(ctx, spool, o.id)
	require.NoError(t, err)
	res, err := recording.Verify(chunks, end.Fields[events.FieldRecordingHash].(string))
	require.NoError(t, err)
	require.True(t, res.Complete)
	var cast bytes.Buffer
	require.NoError(t, recording.Export(&cast, chunks))
	_, evs, err := recording.Parse(cast.Bytes())
	require.NoError(t, err)
	var seq []string
	for _, ev := range evs {
		switch {
		case ev.Code == "m":
			seq = append(seq, "m:"+ev.Data)
		case ev.Code == "o" && bytes.Contains([]byte(ev.Data), []byte("before-2\r\n")):
			seq = append(seq, "o:before")
		case ev.Code == "o" && bytes.Contains([]byte(ev.Data), []byte("after-4\r\n")):
			seq = append(seq, "o:after")
		}
		require.NotContains(t, ev.Data, "[postern: olga", "notices are not the session's output")
	}
	require.Equal(t, []string{"o:before", "m:session.join: olga (observer)", "m:session.leave: olga (observer)", "o:after", "m:exit-status 0"}, seq)
}
