package client

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/proxy"
)

// Per-session MFA for stock OpenSSH (`ssh` through `psh config`). OpenSSH
// reads its certificates once, before it starts the ProxyCommand, and
// with IdentitiesOnly (which keeps the user's other keys from every
// Postern node) it offers no agent key that is not one of them. So the
// fresh factor is asked for before OpenSSH connects: `psh config` adds a
// `Match exec` that runs `psh proxy ssh --session-mfa` for every host of
// the cluster; when the proxy says the session needs a fresh factor, psh
// asks for it on the terminal and writes the per-session certificate
// where the block's CertificateFile names it (SessionCertPath), so that
// OpenSSH offers it to the node. The ProxyCommand then uses it for the
// proxy's own check, and removes it as soon as OpenSSH speaks (it has
// read its certificates by then): each ssh asks again, and a copy left
// behind is good for at most the certificate's minute.

// sessionMFADir holds per-session certificates under the store.
const sessionMFADir = "session-mfa"

// SessionCertPath is where a per-session certificate for login@host:port
// is written, and the pattern `psh config` gives OpenSSH for it (with
// %r, %h and %p as login, host and port).
func (s *Store) SessionCertPath(login, host, port string) (string, error) {
	for _, part := range []string{login, host, port} {
		if part == "" || strings.ContainsAny(part, "/\\\x00") || strings.HasPrefix(part, ".") {
			return "", trace.BadParameter("cannot name a per-session certificate file for %q@%q:%q", login, host, port)
		}
	}
	return filepath.Join(s.Dir, sessionMFADir, login+"@"+host+":"+port+"-cert.pub"), nil
}

// SessionCertPattern is SessionCertPath with OpenSSH's tokens.
func (s *Store) SessionCertPattern() string {
	return filepath.Join(s.Dir, sessionMFADir, "%r@%h:%p-cert.pub")
}

// SessionMFANeeded asks the proxy whether a session to target as login
// needs a fresh second factor (the session-mfa-cert subsystem's check).
func SessionMFANeeded(ctx context.Context, creds *Credentials, target proxy.Target, login string) (bool, error) {
	resp, err := sessionCertExchange(ctx, creds, proxyapi.SessionMFACertRequest{
		Target: proxy.Target{Host: target.Host, Port: target.Port}.String(), Cluster: target.Cluster, Login: login, Check: true,
		PublicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(creds.Cert.Key))),
	})
	if err != nil {
		return false, trace.Wrap(err)
	}
	if resp.Required == nil {
		return false, trace.BadParameter("the proxy did not answer whether the session needs a fresh factor")
	}
	return *resp.Required, nil
}

// WriteSessionCert writes creds' per-session certificate to path (0600,
// in a 0700 directory), replacing any earlier one atomically.
func WriteSessionCert(path string, creds *Credentials) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return trace.ConvertSystemError(err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".session-cert-*")
	if err != nil {
		return trace.ConvertSystemError(err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(ssh.MarshalAuthorizedKey(creds.Cert)); err != nil {
		tmp.Close()
		return trace.ConvertSystemError(err)
	}
	if err := tmp.Close(); err != nil {
		return trace.ConvertSystemError(err)
	}
	return trace.ConvertSystemError(os.Rename(tmp.Name(), path))
}

// SessionCertCredentials is creds with the per-session certificate at
// path, if there is one for creds' key that is valid at now; else creds
// unchanged and false.
func SessionCertCredentials(creds *Credentials, path string, now time.Time) (*Credentials, bool, error) {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return creds, false, nil
	}
	if err != nil {
		return nil, false, trace.ConvertSystemError(err)
	}
	out, err := withSessionCert(creds, data)
	if err != nil {
		return creds, false, nil
	}
	c := out.Cert
	u := uint64(now.Unix())
	if !bytes.Equal(c.Key.Marshal(), creds.Cert.Key.Marshal()) || u < c.ValidAfter || u >= c.ValidBefore {
		return creds, false, nil
	}
	return out, true, nil
}

// onFirstRead calls fn once, before the first read from r returns.
type onFirstRead struct {
	io.ReadCloser
	once sync.Once
	fn   func()
}

// OnFirstRead wraps r so that fn runs when r first yields data.
func OnFirstRead(r io.ReadCloser, fn func()) io.ReadCloser {
	return &onFirstRead{ReadCloser: r, fn: fn}
}

func (o *onFirstRead) Read(p []byte) (int, error) {
	n, err := o.ReadCloser.Read(p)
	if n > 0 {
		o.once.Do(o.fn)
	}
	return n, err
}

// sessionMFAMatch is the part of `psh config` that gets OpenSSH a fresh
// factor for a node of cluster that needs one: a Match whose exec (`psh
// proxy ssh --session-mfa`) answers yes only when it wrote a per-session
// certificate, which the block then names. It comes before the Host
// blocks so that OpenSSH offers that certificate before the login's
// (which such a node refuses). Paths OpenSSH's exec cannot quote plainly
// get no block (such sessions are refused, saying so, as without it).
func (s *Store) sessionMFAMatch(cluster, alias, pshPath string) string {
	if strings.ContainsAny(pshPath+s.Dir, "'\"%\n") {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Nodes of %q that require a fresh second factor per session: psh asks for it before ssh connects\n", cluster)
	fmt.Fprintf(&b, "Match host \"*.%s,!%s\" exec \"'%s' --home='%s' proxy ssh --cluster=%s --session-mfa %%r@%%h:%%p\"\n", cluster, alias, pshPath, s.Dir, cluster)
	fmt.Fprintf(&b, "    CertificateFile \"%s\"\n", s.SessionCertPattern())
	return b.String()
}
