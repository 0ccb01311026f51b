package sessionapi

import (
	"encoding/json"
	"io"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"
)

// maxListBytes bounds a node's answer to the `sessions` subsystem.
const maxListBytes = 4 << 20

// List asks a node's `sessions` subsystem, over a connection made as the
// user, for the live sessions that user may join. psh and the proxy's web
// API both list this way, so the node's answer is read in one place.
// node names the node in errors.
func List(client *ssh.Client, node string) ([]Info, error) {
	sess, err := client.NewSession()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	defer sess.Close()
	out, err := sess.StdoutPipe()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := sess.RequestSubsystem(ListSubsystem); err != nil {
		return nil, trace.Wrap(err)
	}
	data, err := io.ReadAll(io.LimitReader(out, maxListBytes))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var infos []Info
	if err := json.Unmarshal(data, &infos); err != nil {
		return nil, trace.BadParameter("node %s sent an invalid session list: %v", node, err)
	}
	return infos, nil
}
