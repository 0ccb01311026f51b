package client

import (
	"strings"

	"golang.org/x/crypto/ssh"
)

// localeEnv picks the locale variables from environ (os.Environ()), as
// OpenSSH's `SendEnv LANG LC_*` does: without them the node's shell runs
// in its default locale, and with no default in POSIX, where readline
// garbles every non-ASCII character typed. The node checks the values and
// ignores what it does not have installed.
func localeEnv(environ []string) [][2]string {
	var out [][2]string
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || value == "" {
			continue
		}
		if name == "LANG" || (strings.HasPrefix(name, "LC_") && len(name) > 3) {
			out = append(out, [2]string{name, value})
		}
	}
	return out
}

// sendLocaleEnv sends the locale variables as `env` requests (RFC 4254
// 6.4) without asking for replies, as OpenSSH does: a node that refuses
// one simply does not set it, and the shell does not wait a round trip
// per variable.
func sendLocaleEnv(sess *ssh.Session, environ []string) {
	for _, kv := range localeEnv(environ) {
		_, _ = sess.SendRequest("env", false, ssh.Marshal(struct{ Name, Value string }{kv[0], kv[1]}))
	}
}
