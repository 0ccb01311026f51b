package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"
	"github.com/pkg/sftp"
)

// scpFlags are `psh scp`'s flags and arguments.
type scpFlags struct {
	recursive, preserve  bool
	port, cluster, login string
	paths                []string
}

func (c *cli) addScp(app *kingpin.Application, add func(*kingpin.CmdClause, func(context.Context) error)) {
	cmd := app.Command("scp", "Copy files to or from a node through the proxy (over the node's sftp subsystem).")
	cmd.Flag("recursive", "Copy directories recursively.").Short('r').BoolVar(&c.scp.recursive)
	cmd.Flag("preserve", "Keep modification times and modes.").Short('p').BoolVar(&c.scp.preserve)
	// -p is scp's preserve; the port is -P, as in scp.
	cmd.Flag("port", "Node SSH port (when several nodes share a name).").Short('P').StringVar(&c.scp.port)
	cmd.Flag("login", "Login on the node (as LOGIN@HOST; default: your first).").Short('l').StringVar(&c.scp.login)
	cmd.Flag("cluster", "Cluster of the node (default: the proxy's).").StringVar(&c.scp.cluster)
	cmd.Arg("paths", "SOURCE... DEST; remote ones as [LOGIN@]HOST:PATH, exactly one side remote.").Required().StringsVar(&c.scp.paths)
	add(cmd, c.doScp)
}

// scpPath is a command-line path: local, or HOST:PATH on a node.
type scpPath struct {
	host string // [LOGIN@]HOST, "" for a local path
	path string
}

// parseScpPath splits [LOGIN@]HOST:PATH the way scp does: a colon before
// any slash makes it remote, so ./a:b and /x:y stay local.
func parseScpPath(s string) scpPath {
	colon := strings.IndexByte(s, ':')
	if colon <= 0 || strings.Contains(s[:colon], "/") {
		return scpPath{path: s}
	}
	p := s[colon+1:]
	if p == "" {
		p = "."
	}
	return scpPath{host: s[:colon], path: p}
}

func (c *cli) doScp(ctx context.Context) error {
	return asConnectError(c.runScp(ctx))
}

func (c *cli) runScp(ctx context.Context) error {
	if len(c.scp.paths) < 2 {
		return trace.BadParameter("psh scp needs a SOURCE and a DEST")
	}
	var srcs []scpPath
	for _, s := range c.scp.paths[:len(c.scp.paths)-1] {
		srcs = append(srcs, parseScpPath(s))
	}
	dst := parseScpPath(c.scp.paths[len(c.scp.paths)-1])
	host := dst.host
	upload := host != ""
	for _, s := range srcs {
		switch {
		case upload && s.host != "":
			return trace.BadParameter("%s:%s and %s:%s are both remote: copy between nodes is not supported", s.host, s.path, dst.host, dst.path)
		case !upload && s.host == "":
			return trace.BadParameter("neither %q nor %q is remote: name a node as [LOGIN@]HOST:PATH", s.path, dst.path)
		case !upload && host != "" && s.host != host:
			return trace.BadParameter("sources on two nodes (%s and %s): copy from one at a time", host, s.host)
		case !upload:
			host = s.host
		}
	}
	nc, err := c.dialTarget(ctx, host, c.scp.login, c.scp.port, c.scp.cluster)
	if err != nil {
		return trace.Wrap(err)
	}
	defer nc.Close()
	sc, err := sftp.NewClient(nc.Client)
	if err != nil {
		return trace.ConnectionProblem(err, "%s refused the sftp subsystem: %v", host, err)
	}
	defer sc.Close()
	stop := context.AfterFunc(ctx, func() { sc.Close() })
	defer stop()
	cp := &copier{sc: sc, recursive: c.scp.recursive, preserve: c.scp.preserve}
	many := len(srcs) > 1
	for _, s := range srcs {
		if upload {
			err = cp.upload(s.path, dst.path, many)
		} else {
			err = cp.download(s.path, dst.path, many)
		}
		if err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}

// copier copies files between here and a node's sftp server.
type copier struct {
	sc                  *sftp.Client
	recursive, preserve bool
}

// upload copies the local src to dst on the node: into dst when it is a
// directory (or several sources are copied), else as dst.
func (c *copier) upload(src, dst string, intoDir bool) error {
	fi, err := os.Stat(src)
	if err != nil {
		return trace.ConvertSystemError(err)
	}
	if st, err := c.sc.Stat(dst); err == nil && st.IsDir() {
		dst = path.Join(dst, filepath.Base(src))
	} else if intoDir {
		return trace.BadParameter("%s is not a directory on the node (several sources need one)", dst)
	}
	if fi.IsDir() {
		if !c.recursive {
			return trace.BadParameter("%s is a directory (use -r)", src)
		}
		return trace.Wrap(filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return trace.ConvertSystemError(err)
			}
			rel, err := filepath.Rel(src, p)
			if err != nil {
				return trace.Wrap(err)
			}
			target := path.Join(dst, filepath.ToSlash(rel))
			if d.IsDir() {
				if err := c.sc.MkdirAll(target); err != nil {
					return remoteError(err, "creating %s on the node", target)
				}
				return nil
			}
			if !d.Type().IsRegular() {
				return nil
			}
			return c.putFile(p, target)
		}))
	}
	return c.putFile(src, dst)
}

func (c *copier) putFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return trace.ConvertSystemError(err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return trace.ConvertSystemError(err)
	}
	out, err := c.sc.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return remoteError(err, "opening %s on the node", dst)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return remoteError(err, "writing %s on the node", dst)
	}
	if err := out.Close(); err != nil {
		return remoteError(err, "writing %s on the node", dst)
	}
	if err := c.sc.Chmod(dst, fi.Mode().Perm()); err != nil {
		return remoteError(err, "setting the mode of %s on the node", dst)
	}
	if c.preserve {
		if err := c.sc.Chtimes(dst, fi.ModTime(), fi.ModTime()); err != nil {
			return remoteError(err, "setting the times of %s on the node", dst)
		}
	}
	return nil
}

// download copies src on the node to the local dst (into it when it is a
// directory or several sources are copied).
func (c *copier) download(src, dst string, intoDir bool) error {
	fi, err := c.sc.Stat(src)
	if err != nil {
		return remoteError(err, "%s on the node", src)
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, path.Base(src))
	} else if intoDir {
		return trace.BadParameter("%s is not a directory (several sources need one)", dst)
	}
	if fi.IsDir() {
		if !c.recursive {
			return trace.BadParameter("%s on the node is a directory (use -r)", src)
		}
		w := c.sc.Walk(src)
		for w.Step() {
			if err := w.Err(); err != nil {
				return remoteError(err, "reading %s on the node", w.Path())
			}
			rel := strings.TrimPrefix(strings.TrimPrefix(w.Path(), src), "/")
			target := filepath.Join(dst, filepath.FromSlash(rel))
			if w.Stat().IsDir() {
				if err := os.MkdirAll(target, 0o755); err != nil {
					return trace.ConvertSystemError(err)
				}
				continue
			}
			if !w.Stat().Mode().IsRegular() {
				continue
			}
			if err := c.getFile(w.Path(), target, w.Stat()); err != nil {
				return trace.Wrap(err)
			}
		}
		return nil
	}
	return c.getFile(src, dst, fi)
}

func (c *copier) getFile(src, dst string, fi os.FileInfo) error {
	in, err := c.sc.Open(src)
	if err != nil {
		return remoteError(err, "opening %s on the node", src)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return trace.ConvertSystemError(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return remoteError(err, "reading %s on the node", src)
	}
	if err := out.Close(); err != nil {
		return trace.ConvertSystemError(err)
	}
	if c.preserve {
		if err := os.Chtimes(dst, fi.ModTime(), fi.ModTime()); err != nil {
			return trace.ConvertSystemError(err)
		}
	}
	return nil
}

// remoteError is err as one line after what was being done: an sftp
// status reads "file does not exist" rather than a status code.
func remoteError(err error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	var st *sftp.StatusError
	if errors.As(err, &st) {
		return trace.BadParameter("%s: %s", what, strings.TrimPrefix(st.Error(), "sftp: "))
	}
	if errors.Is(err, os.ErrNotExist) {
		return trace.NotFound("%s: no such file or directory", what)
	}
	return trace.ConnectionProblem(err, "%s: %v", what, err)
}
