package client

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// TestRunSessionRefusalSaysWhy: a server that explains a refused exec on
// stderr (and then refuses) gets its reason shown as psh's one line, with
// OpenSSH's 255; without a reason psh says what was refused. Nothing of
// the refusal leaks onto the user's stderr as well.
func TestRunSessionRefusalSaysWhy(t *testing.T) {
	for _, reason := range []string{"postern: the recording spool is not writable\r\n", ""} {
		clt := startTestProxy(t, func(p *testProxy, nch ssh.NewChannel) {
			ch, reqs, err := nch.Accept()
			if err != nil {
				return
			}
			defer ch.Close()
			for req := range reqs {
				if req.Type == "exec" {
					_, _ = ch.Stderr().Write([]byte(reason))
				}
				_ = req.Reply(req.Type != "exec", nil)
			}
		})
		var stdout, stderr bytes.Buffer
		err := RunSession(context.Background(), clt, SessionConfig{Command: []string{"true"}, Stdout: &stdout, Stderr: &stderr})
		var exit *ExitStatusError
		require.True(t, errors.As(err, &exit), "%v", err)
		require.Equal(t, 255, exit.Status)
		if reason != "" {
			require.Equal(t, "the recording spool is not writable", exit.Message)
		} else {
			require.Equal(t, "the node refused to run the command: command true failed", exit.Message)
		}
		require.Empty(t, stderr.String())
	}
}
