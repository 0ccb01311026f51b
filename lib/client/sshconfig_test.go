package client

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOpenSSHConfigOwnNamesOnly: the blocks of `psh config`, appended to
// an OpenSSH config, capture only the cluster's own names. The demo
// cluster "local" behind 127.0.0.1 must not send every mDNS host (x.local)
// or `ssh 127.0.0.1` through the proxy, nor a leaf named like a TLD every
// host of that TLD; real OpenSSH (`ssh -G`) is asked what it would do.
func TestOpenSSHConfigOwnNamesOnly(t *testing.T) {
	s := NewStore("/home/a/.postern")
	p := &Profile{Proxy: "127.0.0.1:3080", ProxySSH: "127.0.0.1:3023", User: "alice", Cluster: "local", Clusters: []string{"east", "it", "co.uk"}}
	out, err := s.OpenSSHConfig(p, "/usr/bin/psh")
	require.NoError(t, err)
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "Host ") {
			continue
		}
		for _, pat := range strings.Fields(line)[1:] {
			require.NotContains(t, []string{"*.local", "127.0.0.1", "*.it", "*.co.uk", "localhost"}, pat, out)
		}
	}
	require.Contains(t, out, "Host *.east local-proxy\n")
	require.Contains(t, out, "Host local-proxy\n    HostName 127.0.0.1\n    Port 3023\n")
	require.Contains(t, out, "Host *.east !local-proxy\n")
	require.Contains(t, out, `"local" is a special-use or public suffix`)

	// A cluster named after its host keeps its block, and a proxy with a
	// DNS name keeps its name.
	p = &Profile{Proxy: "bastion.corp.example.com:3080", ProxySSH: "bastion.corp.example.com:3023", User: "alice", Cluster: "mybox"}
	out, err = s.OpenSSHConfig(p, "/usr/bin/psh")
	require.NoError(t, err)
	require.Contains(t, out, "Host *.mybox bastion.corp.example.com\n")
	require.NotContains(t, out, "HostName")

	if _, err := exec.LookPath("ssh"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("OpenSSH ssh is not installed; .ci/run must install openssh-client")
		}
		t.Skip("no OpenSSH ssh to check the config with (apt-get install openssh-client); CI installs it")
	}
	p = &Profile{Proxy: "127.0.0.1:3080", ProxySSH: "127.0.0.1:3023", User: "alice", Cluster: "local", Clusters: []string{"east"}}
	out, err = s.OpenSSHConfig(p, "/usr/bin/psh")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "config")
	require.NoError(t, os.WriteFile(path, []byte(out), 0o600))
	sshG := func(host string) string {
		got, err := exec.Command("ssh", "-G", "-F", path, host).CombinedOutput()
		require.NoError(t, err, string(got))
		return string(got)
	}
	for _, host := range []string{"127.0.0.1", "printer.local", "localhost"} {
		g := sshG(host)
		require.NotContains(t, g, "proxycommand", host)
		require.NotContains(t, g, "/home/a/.postern", host)
	}
	require.Contains(t, sshG("node-1.east"), "proxycommand \"/usr/bin/psh\"")
	g := sshG("local-proxy")
	require.Contains(t, g, "hostname 127.0.0.1\n")
	require.Contains(t, g, "port 3023\n")
	require.Contains(t, g, "certificatefile")
}
