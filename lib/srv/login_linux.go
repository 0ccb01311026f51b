package srv

import (
	"bufio"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"github.com/gravitational/trace"
)

// Login is an OS account a session runs as.
type Login struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32
	Home   string
	// Shell is the login shell; "/bin/sh" when the account names none.
	Shell string
}

// LookupOSLogin reads the OS account database. os/user does not expose
// the login shell, so it is read from /etc/passwd (the pure-Go os/user
// reads the same file).
func LookupOSLogin(name string) (*Login, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, trace.NotFound("login %q does not exist on this node", name)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, trace.BadParameter("login %q: bad uid %q", name, u.Uid)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, trace.BadParameter("login %q: bad gid %q", name, u.Gid)
	}
	l := &Login{Name: name, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir, Shell: passwdShell(name)}
	if ids, err := u.GroupIds(); err == nil {
		for _, g := range ids {
			if v, err := strconv.ParseUint(g, 10, 32); err == nil {
				l.Groups = append(l.Groups, uint32(v))
			}
		}
	}
	if l.Shell == "" {
		l.Shell = "/bin/sh"
	}
	return l, nil
}

// passwdShell returns the shell field of name's /etc/passwd line, or "".
func passwdShell(name string) string {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) == 7 && fields[0] == name {
			return fields[6]
		}
	}
	return ""
}

// credentialFor decides whose identity a child process takes. A node
// running as root switches to the login; any other node can only run
// sessions as itself, and says so.
func credentialFor(l *Login) (*syscall.Credential, error) {
	return credentialForEUID(l, uint32(os.Geteuid()))
}

func credentialForEUID(l *Login, euid uint32) (*syscall.Credential, error) {
	if euid == 0 {
		return &syscall.Credential{Uid: l.UID, Gid: l.GID, Groups: l.Groups}, nil
	}
	if l.UID != euid {
		self := strconv.Itoa(int(euid))
		if u, err := user.LookupId(self); err == nil {
			self = u.Username
		}
		return nil, trace.AccessDenied("this node runs as user %q, not root: it can only start sessions as %q, not as %q", self, self, l.Name)
	}
	return nil, nil
}

// isCurrentUser reports whether l is the account this process runs as, so
// no identity switch is needed.
func isCurrentUser(l *Login) bool {
	return l.UID == uint32(os.Geteuid())
}
