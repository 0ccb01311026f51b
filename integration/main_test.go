// Package integration runs whole Postern clusters in-process on loopback
// ports and drives them with the real binaries (pctl, postern) and real SSH
// clients: x/crypto/ssh, and OpenSSH where it is installed.
package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// binDir holds postern, psh and pctl built once for the whole package.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "postern-it-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	cmd := exec.Command("go", "build", "-o", dir+"/", "../tool/postern", "../tool/pctl", "../tool/psh")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building binaries:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(goleakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func bin(name string) string { return filepath.Join(binDir, name) }

func goleakOptions() []goleak.Option {
	return []goleak.Option{
		// The sqlite driver's and net/http's idle connection reapers are
		// process-wide and stop on their own.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		// Embedded etcd members (etcdtest.StartCluster) leave their peer
		// transports' idle connections open after Close; the serving end
		// is etcd's cmux (lib/backend/etcdbk's TestMain says more).
		goleak.IgnoreAnyFunction("github.com/soheilhy/cmux.(*MuxConn).Read"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
	}
}
