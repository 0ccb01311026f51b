package srv

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// TestMissingLoginSaysWhy: a login the roles grant but this machine does
// not have is explained on stderr of an accepted request, which then ends
// with exit status 255: OpenSSH drops the stderr of a refused exec and
// prints only "exec request failed", so the user would never learn why.
// Shells and commands alike.
func TestMissingLoginSaysWhy(t *testing.T) {
	e := newTestEnv(t)
	const login = "postern-no-such-login"
	c, err := e.dialAs(login, e.signer(login))
	require.NoError(t, err)
	defer c.Close()
	for _, shell := range []bool{false, true} {
		_, errOut, err := run(t, c, "echo must-not-run")
		if shell {
			s, serr := c.NewSession()
			require.NoError(t, serr)
			// Wait waits for the copy: read after it.
			var stderr bytes.Buffer
			s.Stderr = &stderr
			require.NoError(t, s.Shell(), "the shell request is accepted")
			err = s.Wait()
			errOut = stderr.String()
			s.Close()
		}
		var exit *ssh.ExitError
		require.ErrorAs(t, err, &exit, "shell %v", shell)
		require.Equal(t, 255, exit.ExitStatus())
		require.Equal(t, "postern: login \""+login+"\" does not exist on this node\r\n", errOut)
	}
}
