package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/config"
)

func TestPackageVersion(t *testing.T) {
	for in, want := range map[string]string{
		"v1.2.3":                   "1.2.3",
		"1.2.3":                    "1.2.3",
		"v1.2.3-dirty":             "1.2.3+dirty",
		"v1.2.3-4-gabc1234":        "1.2.3+4.gabc1234",
		"v1.2.3-4-gabc1234-dirty":  "1.2.3+4.gabc1234.dirty",
		"v1.2.3-rc1":               "1.2.3~rc1",
		"v1.2.3-rc.2-5-gabc1234":   "1.2.3~rc2+5.gabc1234",
		"2586513":                  "0.0.0+git.2586513",
		"2586513-dirty":            "0.0.0+git.2586513.dirty",
		"abcdef0123456789abcdef01": "0.0.0+git.abcdef0123456789abcdef01",
	} {
		got, err := PackageVersion(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "dev", "v1", "release-x"} {
		_, err := PackageVersion(bad)
		require.Error(t, err, bad)
	}
}

func TestFixManPage(t *testing.T) {
	in := ".TH psh 1  \"\"\n.SH \"NAME\"\npsh\n.SH \"SYNOPSIS\"\n.TP\n\\fBpsh\\fR\n\n.SH \"DESCRIPTION\"\nPostern user CLI: log in.\n"
	out := string(FixManPage([]byte(in), "psh", "v1.0.0", "2026-01-02"))
	require.Contains(t, out, ".TH PSH 1 \"2026-01-02\" \"psh v1.0.0\" \"Postern manual\"\n")
	require.Contains(t, out, ".SH \"NAME\"\npsh \\- Postern user CLI: log in\n")
}

// The packaged config is one `postern start` accepts, with the packaged
// data dir and all three roles (postern.service runs as root for the node).
func TestPackagedConfig(t *testing.T) {
	data, err := assets.ReadFile("files/postern.yaml")
	require.NoError(t, err)
	fc, err := config.Parse(data)
	require.NoError(t, err)
	cfg := &config.Config{FileConfig: *fc}
	require.NoError(t, cfg.CheckAndSetDefaults())
	require.Equal(t, DataDir, cfg.DataDir)
	require.ElementsMatch(t, []string{"auth", "proxy", "node"}, cfg.Roles)
}

func TestUnits(t *testing.T) {
	unit, err := assets.ReadFile("files/postern.service")
	require.NoError(t, err)
	for _, line := range []string{
		"Type=notify", "NotifyAccess=main", "ExecStart=/usr/bin/postern start --config /etc/postern/postern.yaml",
		"ExecReload=/bin/kill -HUP $MAINPID", "Restart=on-failure", "LimitNOFILE=1048576", "KillMode=mixed",
		"WantedBy=multi-user.target",
	} {
		require.Contains(t, string(unit), "\n"+line+"\n")
	}
	// Runs as root (node role): no User=, and no sandbox its logins would inherit.
	require.NotContains(t, string(unit), "\nUser=")
	require.NotContains(t, string(unit), "\nNoNewPrivileges=")
	dropin, err := assets.ReadFile("files/examples/auth-proxy.conf")
	require.NoError(t, err)
	for _, line := range []string{
		"User=postern", "NoNewPrivileges=yes", "ProtectSystem=strict", "ReadWritePaths=/var/lib/postern",
		"PrivateTmp=yes", "StateDirectoryMode=0700", "ExecStart=",
		"ExecStart=/usr/bin/postern start --config /etc/postern/postern.yaml --roles auth,proxy",
	} {
		require.Contains(t, string(dropin), "\n"+line+"\n")
	}
	node, err := assets.ReadFile("files/examples/node-only.conf")
	require.NoError(t, err)
	require.Contains(t, string(node), "\nExecStart=/usr/bin/postern start --config /etc/postern/postern.yaml --roles node\n")
}

// fakeBinaries are shell scripts answering kingpin's generator flags as
// the real binaries do (the real ones: scripts/check-package.sh).
func fakeBinaries(t *testing.T) string {
	dir := t.TempDir()
	for _, b := range Binaries {
		script := fmt.Sprintf(`#!/bin/sh
case "$1" in
--help-man) printf '.TH %[1]s 1  ""\n.SH "NAME"\n%[1]s\n.SH "SYNOPSIS"\n.TP\n\\fB%[1]s\\fR\n\n.SH "DESCRIPTION"\nThe %[1]s command.\n' ;;
--completion-script-bash) echo 'complete -F _%[1]s_bash_autocomplete -o default %[1]s' ;;
--completion-script-zsh) echo '#compdef %[1]s' ;;
*) exit 1 ;;
esac
`, b)
		require.NoError(t, os.WriteFile(filepath.Join(dir, b), []byte(script), 0o755))
	}
	return dir
}

// arMembers reads a .deb (an ar archive) into its members.
func arMembers(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	require.True(t, bytes.HasPrefix(data, []byte("!<arch>\n")))
	out := map[string][]byte{}
	for p := 8; p+60 <= len(data); {
		hdr := data[p : p+60]
		name := strings.TrimSuffix(strings.TrimSpace(string(hdr[0:16])), "/")
		size, err := strconv.Atoi(strings.TrimSpace(string(hdr[48:58])))
		require.NoError(t, err)
		p += 60
		out[name] = data[p : p+size]
		p += size + size%2
	}
	return out
}

type tarEntry struct {
	mode    int64
	typ     byte
	content []byte
}

func untgz(t *testing.T, data []byte) map[string]tarEntry {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	tr := tar.NewReader(zr)
	out := map[string]tarEntry{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		body, err := io.ReadAll(tr)
		require.NoError(t, err)
		out[strings.TrimPrefix(h.Name, ".")] = tarEntry{mode: h.Mode & 0o7777, typ: h.Typeflag, content: body}
	}
}

func TestBuild(t *testing.T) {
	out := t.TempDir()
	o := options{
		version: "v1.2.3-4-gabc1234", binDir: fakeBinaries(t), outDir: out,
		sample: "../../fixtures/postern.yaml", mtime: time.Unix(1767225600, 0), arch: "amd64",
	}
	paths, err := build(o)
	require.NoError(t, err)
	require.Equal(t, []string{
		filepath.Join(out, "postern_1.2.3+4.gabc1234_amd64.deb"),
		filepath.Join(out, "postern_1.2.3+4.gabc1234_amd64.rpm"),
	}, paths)
	left, err := os.ReadDir(out)
	require.NoError(t, err)
	require.Len(t, left, 2, "nothing but the packages is left behind")

	deb, err := os.ReadFile(paths[0])
	require.NoError(t, err)
	members := arMembers(t, deb)
	require.Contains(t, members, "control.tar.gz")
	require.Contains(t, members, "data.tar.gz")
	control := untgz(t, members["control.tar.gz"])
	require.Equal(t, ConfigPath+"\n", string(control["/conffiles"].content))
	require.Contains(t, string(control["/control"].content), "Version: 1.2.3+4.gabc1234\n")
	postinst := string(control["/postinst"].content)
	require.EqualValues(t, 0o755, control["/postinst"].mode)
	require.Contains(t, postinst, "DATA_DIR=/var/lib/postern")
	require.Contains(t, postinst, `chmod 0700 "$DATA_DIR"`)
	require.Contains(t, postinst, "useradd --system")
	require.Contains(t, postinst, "[ -d /run/systemd/system ]")
	for _, name := range []string{"/postinst", "/prerm", "/postrm"} {
		script := filepath.Join(t.TempDir(), "script")
		require.NoError(t, os.WriteFile(script, control[name].content, 0o755))
		out, err := exec.Command("sh", "-n", script).CombinedOutput()
		require.NoError(t, err, "%s does not parse: %s", name, out)
	}
	postrm := string(control["/postrm"].content)
	// remove keeps the data; only purge deletes it.
	remove := postrm[strings.Index(postrm, "\nremove)"):strings.Index(postrm, "\npurge)")]
	require.NotContains(t, remove, "rm -")
	purge := postrm[strings.Index(postrm, "\npurge)"):]
	require.Contains(t, purge, `rm -rf "$DATA_DIR"`)

	data := untgz(t, members["data.tar.gz"])
	want := map[string]int64{
		"/usr/bin/postern":                               0o755,
		"/usr/bin/psh":                                   0o755,
		"/usr/bin/pctl":                                  0o755,
		"/etc/postern/":                                  0o755,
		ConfigPath:                                       0o640,
		"/lib/systemd/system/postern.service":            0o644,
		DocDir + "/examples/postern.yaml":                0o644,
		DocDir + "/examples/systemd/auth-proxy.conf":     0o644,
		DocDir + "/examples/systemd/node-only.conf":      0o644,
		"/usr/share/man/man1/postern.1.gz":               0o644,
		"/usr/share/man/man1/psh.1.gz":                   0o644,
		"/usr/share/man/man1/pctl.1.gz":                  0o644,
		"/usr/share/bash-completion/completions/postern": 0o644,
		"/usr/share/bash-completion/completions/psh":     0o644,
		"/usr/share/bash-completion/completions/pctl":    0o644,
		"/usr/share/zsh/vendor-completions/_postern":     0o644,
		"/usr/share/zsh/vendor-completions/_psh":         0o644,
		"/usr/share/zsh/vendor-completions/_pctl":        0o644,
	}
	for path, mode := range want {
		e, ok := data[path]
		require.True(t, ok, "%s in the .deb", path)
		require.Equal(t, mode, e.mode, "mode of %s", path)
	}
	for path, e := range data {
		if e.typ == tar.TypeDir {
			continue
		}
		_, ok := want[path]
		require.True(t, ok, "unexpected file %s in the .deb", path)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data["/usr/share/man/man1/postern.1.gz"].content))
	require.NoError(t, err)
	man, err := io.ReadAll(zr)
	require.NoError(t, err)
	require.Contains(t, string(man), "postern \\- The postern command\n")
	require.Contains(t, string(man), ".SH \"SIGNALS\"")
	unit, err := assets.ReadFile("files/postern.service")
	require.NoError(t, err)
	require.Equal(t, unit, data["/lib/systemd/system/postern.service"].content)

	rpm, err := os.ReadFile(paths[1])
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(rpm, []byte{0xed, 0xab, 0xee, 0xdb}), "an RPM lead")
	// RPM headers keep directory and base names apart.
	for _, name := range []string{"/usr/lib/systemd/system/", "postern.service", "/usr/share/zsh/site-functions/", "/etc/postern/", "postern.yaml", "useradd --system"} {
		require.True(t, bytes.Contains(rpm, []byte(name)), "the RPM header has %s", name)
	}
}

func TestMissingBinary(t *testing.T) {
	dir := fakeBinaries(t)
	require.NoError(t, os.Remove(filepath.Join(dir, "pctl")))
	_, err := build(options{version: "v1.0.0", binDir: dir, outDir: t.TempDir(), sample: "../../fixtures/postern.yaml", arch: "amd64"})
	require.ErrorContains(t, err, "no executable pctl")
}

// The RPM scriptlets are put together like the deb's: they must parse too.
func TestRPMScriptsParse(t *testing.T) {
	common, err := assets.ReadFile("files/common.sh")
	require.NoError(t, err)
	for _, name := range []string{"post", "preun", "postun"} {
		body, err := assets.ReadFile("files/rpm/" + name)
		require.NoError(t, err)
		script := filepath.Join(t.TempDir(), name)
		require.NoError(t, os.WriteFile(script, append(append([]byte("#!/bin/sh\n"), common...), body...), 0o755))
		out, err := exec.Command("sh", "-n", script).CombinedOutput()
		require.NoError(t, err, "%s: %s", name, out)
	}
}
