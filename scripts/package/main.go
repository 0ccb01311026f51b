// Command package builds Postern's .deb and .rpm (`make package`) with
// nfpm as a library: the three binaries, the packaged config (a conffile),
// the systemd unit and its drop-in examples, man pages and bash and zsh
// completions generated from the binaries' own kingpin definitions, and the
// maintainer scripts (files/). It is a build tool, never shipped.
//
//	go run ./scripts/package --version "$(git describe --tags --always --dirty)" --bin-dir build/package/bin --out build
package main

import (
	"bytes"
	"compress/gzip"
	"embed"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
	_ "github.com/goreleaser/nfpm/v2/rpm" // registers the rpm packager
)

//go:embed files
var assets embed.FS

// Binaries are the three commands, installed in /usr/bin.
var Binaries = []string{"postern", "psh", "pctl"}

// Formats are the packages written, in order.
var Formats = []string{"deb", "rpm"}

// Paths in the packages.
const (
	ConfigPath = "/etc/postern/postern.yaml"
	DataDir    = "/var/lib/postern"
	DocDir     = "/usr/share/doc/postern"
)

type options struct {
	// version is `git describe --tags --always --dirty` (what the binaries
	// print); the package version is made from it (PackageVersion).
	version string
	binDir  string
	outDir  string
	// sample is the full commented config, shipped as an example.
	sample string
	// mtime stamps every file (the last commit's time: reproducible).
	mtime time.Time
	arch  string
}

func main() {
	var o options
	var epoch int64
	flag.StringVar(&o.version, "version", "", "version from git describe (required)")
	flag.StringVar(&o.binDir, "bin-dir", "build/package/bin", "directory holding the built postern, psh and pctl")
	flag.StringVar(&o.outDir, "out", "build", "where the packages are written")
	flag.StringVar(&o.sample, "sample", "fixtures/postern.yaml", "the commented sample config shipped in "+DocDir+"/examples")
	flag.Int64Var(&epoch, "mtime", 0, "file time in the packages, seconds since the epoch (default $SOURCE_DATE_EPOCH or now)")
	flag.StringVar(&o.arch, "arch", "amd64", "architecture (Debian's name)")
	flag.Parse()
	if epoch == 0 {
		fmt.Sscan(os.Getenv("SOURCE_DATE_EPOCH"), &epoch)
	}
	o.mtime = time.Now()
	if epoch > 0 {
		o.mtime = time.Unix(epoch, 0)
	}
	if o.version == "" {
		fmt.Fprintln(os.Stderr, "package: --version is required")
		os.Exit(2)
	}
	out, err := build(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "package:", err)
		os.Exit(1)
	}
	for _, p := range out {
		st, err := os.Stat(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "package:", err)
			os.Exit(1)
		}
		fmt.Printf("%s (%.1f MiB)\n", p, float64(st.Size())/(1<<20))
	}
}

var describeRe = regexp.MustCompile(`^v?(\d+\.\d+(?:\.\d+)*)(?:-(rc|alpha|beta)[.]?(\d+))?(?:-(\d+)-g([0-9a-f]+))?(-dirty)?$`)
var commitRe = regexp.MustCompile(`^([0-9a-f]{4,40})(-dirty)?$`)

// PackageVersion turns `git describe --tags --always --dirty` into a
// version dpkg and rpm both accept and order right: v1.2.3 -> 1.2.3;
// v1.2.3-4-gabc1234 (4 commits after the tag) -> 1.2.3+4.gabc1234;
// v1.2.3-rc1 -> 1.2.3~rc1 (before 1.2.3); a checkout without tags
// (abc1234) -> 0.0.0+git.abc1234; -dirty -> .dirty.
func PackageVersion(describe string) (string, error) {
	d := strings.TrimSpace(describe)
	if m := describeRe.FindStringSubmatch(d); m != nil {
		v := m[1]
		if m[2] != "" {
			v += "~" + m[2] + m[3]
		}
		var meta []string
		if m[4] != "" {
			meta = append(meta, m[4], "g"+m[5])
		}
		if m[6] != "" {
			meta = append(meta, "dirty")
		}
		if len(meta) > 0 {
			v += "+" + strings.Join(meta, ".")
		}
		return v, nil
	}
	if m := commitRe.FindStringSubmatch(d); m != nil {
		v := "0.0.0+git." + m[1]
		if m[2] != "" {
			v += ".dirty"
		}
		return v, nil
	}
	return "", fmt.Errorf("cannot make a package version of %q (want vX.Y.Z[-N-gHASH][-dirty] or HASH[-dirty])", describe)
}

// FileName is the package's file name, postern_VERSION_ARCH.FORMAT.
func FileName(version, arch, format string) string {
	return fmt.Sprintf("postern_%s_%s.%s", version, arch, format)
}

// build writes the packages and returns their paths.
func build(o options) ([]string, error) {
	pkgVersion, err := PackageVersion(o.version)
	if err != nil {
		return nil, err
	}
	for _, b := range Binaries {
		if st, err := os.Stat(filepath.Join(o.binDir, b)); err != nil || st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("%s: no executable %s (build the binaries first: make package)", o.binDir, b)
		}
	}
	if err := os.MkdirAll(o.outDir, 0o755); err != nil {
		return nil, err
	}
	stage, err := os.MkdirTemp(o.outDir, ".package-stage-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	if err := stageFiles(o, stage, pkgVersion); err != nil {
		return nil, err
	}
	var out []string
	for _, format := range Formats {
		info := Info(o, stage, pkgVersion, format)
		packager, err := nfpm.Get(format)
		if err != nil {
			return nil, err
		}
		path := filepath.Join(o.outDir, FileName(pkgVersion, o.arch, format))
		tmp := path + ".tmp"
		f, err := os.Create(tmp)
		if err != nil {
			return nil, err
		}
		err = packager.Package(info, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp, path)
		}
		if err != nil {
			os.Remove(tmp)
			return nil, fmt.Errorf("%s: %w", format, err)
		}
		out = append(out, path)
	}
	return out, nil
}

// stageFiles writes what the packages take from disk into stage: the
// embedded files, the maintainer scripts (files/common.sh in front of each),
// the man pages and the completions.
func stageFiles(o options, stage, pkgVersion string) error {
	err := fs.WalkDir(assets, "files", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := assets.ReadFile(path)
		if err != nil {
			return err
		}
		dst := filepath.Join(stage, path)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.WriteFile(dst, data, 0o644)
	})
	if err != nil {
		return err
	}
	common, err := assets.ReadFile("files/common.sh")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(stage, "scripts"), 0o755); err != nil {
		return err
	}
	for _, s := range []string{"deb/postinst", "deb/prerm", "deb/postrm", "rpm/post", "rpm/preun", "rpm/postun"} {
		body, err := assets.ReadFile("files/" + s)
		if err != nil {
			return err
		}
		script := "#!/bin/sh\n# postern " + pkgVersion + ": " + s + "\n\n" + string(common) + "\n" + string(body)
		if err := os.WriteFile(filepath.Join(stage, "scripts", strings.ReplaceAll(s, "/", "-")), []byte(script), 0o755); err != nil {
			return err
		}
	}
	sample, err := os.ReadFile(o.sample)
	if err != nil {
		return fmt.Errorf("the sample config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(stage, "postern.yaml.example"), sample, 0o644); err != nil {
		return err
	}
	for _, dir := range []string{"man", "bash", "zsh"} {
		if err := os.MkdirAll(filepath.Join(stage, dir), 0o755); err != nil {
			return err
		}
	}
	date := o.mtime.UTC().Format("2006-01-02")
	for _, b := range Binaries {
		bin := filepath.Join(o.binDir, b)
		man, err := runHelp(bin, "--help-man")
		if err != nil {
			return err
		}
		man = FixManPage(man, b, o.version, date)
		if extra, err := assets.ReadFile("files/" + b + ".1.extra"); err == nil {
			man = append(man, extra...)
		}
		gz, err := gzipBytes(man)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(stage, "man", b+".1.gz"), gz, 0o644); err != nil {
			return err
		}
		for _, sh := range []string{"bash", "zsh"} {
			script, err := runHelp(bin, "--completion-script-"+sh)
			if err != nil {
				return err
			}
			name := b
			if sh == "zsh" {
				name = "_" + b
			}
			if err := os.WriteFile(filepath.Join(stage, sh, name), script, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// runHelp runs one of kingpin's built-in generators (--help-man,
// --completion-script-bash, --completion-script-zsh) of a binary.
func runHelp(bin, arg string) ([]byte, error) {
	cmd := exec.Command(bin, arg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %v: %s", bin, arg, err, stderr.String())
	}
	if len(bytes.TrimSpace(out)) == 0 {
		return nil, fmt.Errorf("%s %s printed nothing", bin, arg)
	}
	return out, nil
}

var thLine = regexp.MustCompile(`(?m)^\.TH .*$`)

// FixManPage completes kingpin's man page: a .TH line with the date and
// version, and a NAME line `name \- summary` (what whatis and apropos
// read; kingpin writes the bare name) taken from the DESCRIPTION.
func FixManPage(page []byte, name, version, date string) []byte {
	s := string(page)
	s = thLine.ReplaceAllLiteralString(s, fmt.Sprintf(`.TH %s 1 "%s" "%s %s" "Postern manual"`, strings.ToUpper(name), date, name, version))
	summary := name
	if i := strings.Index(s, ".SH \"DESCRIPTION\"\n"); i >= 0 {
		rest := s[i+len(".SH \"DESCRIPTION\"\n"):]
		if j := strings.IndexByte(rest, '\n'); j > 0 {
			summary = strings.TrimSuffix(strings.TrimSpace(rest[:j]), ".")
		}
	}
	s = strings.Replace(s, ".SH \"NAME\"\n"+name+"\n", ".SH \"NAME\"\n"+name+` \- `+summary+"\n", 1)
	return []byte(s)
}

// gzipBytes compresses as `gzip -9n` does: no name, no time stamp.
func gzipBytes(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Contents is every file and directory of the package for format, with
// its mode; sources are in stage (see stageFiles).
func Contents(o options, stage, format string) files.Contents {
	file := func(src, dst string, mode os.FileMode) *files.Content {
		return &files.Content{Source: src, Destination: dst, FileInfo: &files.ContentFileInfo{Mode: mode, Owner: "root", Group: "root"}}
	}
	var c files.Contents
	for _, b := range Binaries {
		c = append(c, file(filepath.Join(o.binDir, b), "/usr/bin/"+b, 0o755))
	}
	c = append(c,
		&files.Content{Destination: "/etc/postern", Type: files.TypeDir, FileInfo: &files.ContentFileInfo{Mode: 0o755, Owner: "root", Group: "root"}},
		// A conffile: dpkg and rpm keep the operator's edits on upgrade.
		// 0640 root:root here; the postinst gives it to the postern group.
		&files.Content{Source: filepath.Join(stage, "files/postern.yaml"), Destination: ConfigPath, Type: files.TypeConfigNoReplace,
			FileInfo: &files.ContentFileInfo{Mode: 0o640, Owner: "root", Group: "root"}},
		file(filepath.Join(stage, "files/postern.service"), UnitDir(format)+"/postern.service", 0o644),
		file(filepath.Join(stage, "files/examples/auth-proxy.conf"), DocDir+"/examples/systemd/auth-proxy.conf", 0o644),
		file(filepath.Join(stage, "files/examples/node-only.conf"), DocDir+"/examples/systemd/node-only.conf", 0o644),
		file(filepath.Join(stage, "postern.yaml.example"), DocDir+"/examples/postern.yaml", 0o644),
	)
	for _, b := range Binaries {
		c = append(c,
			file(filepath.Join(stage, "man", b+".1.gz"), "/usr/share/man/man1/"+b+".1.gz", 0o644),
			file(filepath.Join(stage, "bash", b), "/usr/share/bash-completion/completions/"+b, 0o644),
			file(filepath.Join(stage, "zsh", "_"+b), ZshDir(format)+"/_"+b, 0o644),
		)
	}
	return c
}

// UnitDir is where systemd units go: /lib/systemd/system on Debian (a
// symlink to /usr/lib/... on merged-/usr systems), /usr/lib/... on RPM
// distributions.
func UnitDir(format string) string {
	if format == "rpm" {
		return "/usr/lib/systemd/system"
	}
	return "/lib/systemd/system"
}

// ZshDir is where a distribution's zsh looks for packaged completions.
func ZshDir(format string) string {
	if format == "rpm" {
		return "/usr/share/zsh/site-functions"
	}
	return "/usr/share/zsh/vendor-completions"
}

// Info is the nfpm description of the package for format.
func Info(o options, stage, pkgVersion, format string) *nfpm.Info {
	script := func(name string) string { return filepath.Join(stage, "scripts", name) }
	info := &nfpm.Info{
		Name:          "postern",
		Arch:          o.arch,
		Platform:      "linux",
		Version:       pkgVersion,
		VersionSchema: "none",
		Section:       "net",
		Priority:      "optional",
		Maintainer:    "Postern developers <postern@localhost>",
		Description: "SSH access proxy: certificates, roles, audit and session recording\n" +
			"Postern puts a proxy in front of SSH: users log in once (password, OTP or\n" +
			"single sign-on) and get short-lived certificates; nodes join a cluster\n" +
			"with tokens; every session is audited and can be recorded. This package\n" +
			"has the daemon (postern: auth, proxy and node roles), the user CLI (psh)\n" +
			"and the admin CLI (pctl), a systemd unit and the data dir " + DataDir + ".",
		Vendor: "Postern",
		MTime:  o.mtime,
	}
	info.Contents = Contents(o, stage, format)
	switch format {
	case "deb":
		info.Depends = []string{"libc6", "passwd"}
		info.Scripts = nfpm.Scripts{
			PostInstall: script("deb-postinst"),
			PreRemove:   script("deb-prerm"),
			PostRemove:  script("deb-postrm"),
		}
	case "rpm":
		info.Release = "1"
		info.Depends = []string{"glibc", "shadow-utils"}
		info.RPM.Summary = "SSH access proxy: certificates, roles, audit and session recording"
		info.RPM.Group = "System Environment/Daemons"
		info.Scripts = nfpm.Scripts{
			PostInstall: script("rpm-post"),
			PreRemove:   script("rpm-preun"),
			PostRemove:  script("rpm-postun"),
		}
	}
	return nfpm.WithDefaults(info)
}
