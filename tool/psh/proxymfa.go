package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/client"
	"github.com/postern-dev/postern/lib/proxy"
)

// sessionCertPath is where the per-session certificate of the
// `psh proxy ssh` target goes: OpenSSH passes %r@%h:%p, which is what
// psh config's CertificateFile pattern names too. "" when the target is
// not in that form (a hand-written ProxyCommand without a port).
func (c *cli) sessionCertPath(st *client.Store) string {
	login, hostport := splitLogin(c.proxySSH.target)
	host, port, err := net.SplitHostPort(hostport)
	if err != nil || login == "" {
		return ""
	}
	path, err := st.SessionCertPath(login, host, port)
	if err != nil {
		return ""
	}
	return path
}

// prepareSessionMFA is `psh proxy ssh --session-mfa`, run by OpenSSH's
// Match exec before it connects: ask the proxy whether the session needs
// a fresh factor; if so, ask for it on the terminal (OpenSSH gives a
// Match exec no stdin), and write the per-session certificate where
// OpenSSH will read it. Exit 0 only when one was written, so that the
// Match block (its CertificateFile) applies.
func (c *cli) prepareSessionMFA(ctx context.Context, st *client.Store, creds *client.Credentials, target proxy.Target) error {
	login, _ := splitLogin(c.proxySSH.target)
	path := c.sessionCertPath(st)
	if path == "" {
		return trace.BadParameter("--session-mfa needs the target as LOGIN@HOST:PORT (OpenSSH's %%r@%%h:%%p)")
	}
	askCtx, cancel := context.WithTimeout(ctx, client.DialTimeout*2)
	needed, err := client.SessionMFANeeded(askCtx, creds, target, login)
	cancel()
	if err != nil {
		// Not this command's to explain: the ProxyCommand that follows
		// routes the session and says what is wrong.
		return &client.ExitStatusError{Status: 1}
	}
	if !needed {
		_ = os.Remove(path)
		return &client.ExitStatusError{Status: 1}
	}
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return trace.AccessDenied("node %s requires a fresh second factor for each session (require_session_mfa), and there is no terminal to ask for it on", target.Host)
	}
	defer tty.Close()
	otp, err := client.ReadSecretLine(tty, tty, fmt.Sprintf("Node %s asks for a fresh second factor for this session. OTP code (empty: a passkey in the browser): ", target.Host))
	if errors.Is(err, io.EOF) {
		return trace.AccessDenied("node %s requires a fresh second factor for each session (require_session_mfa)", target.Host)
	}
	if err != nil {
		return trace.Wrap(err)
	}
	var sessCreds *client.Credentials
	if otp == "" {
		sessCreds, err = client.SessionMFABrowserCredentials(ctx, creds, target, login, client.SessionMFABrowser{Out: tty, OpenBrowser: client.OpenBrowser})
	} else {
		askCtx, cancel := context.WithTimeout(ctx, client.DialTimeout*2)
		sessCreds, err = client.SessionMFACredentials(askCtx, creds, target, login, otp)
		cancel()
	}
	if err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(client.WriteSessionCert(path, sessCreds))
}

// proxySSHSessionCert picks the certificate `psh proxy ssh` shows the
// proxy: the per-session one `--session-mfa` just wrote for this target,
// if any is valid (the proxy holds it to its node), else the login's.
// The file is removed once OpenSSH first writes to the tunnel: OpenSSH
// reads its certificates before it speaks, so it has this one by then,
// and the next ssh must ask for a new factor.
func (c *cli) proxySSHSessionCert(st *client.Store, creds *client.Credentials) (*client.Credentials, io.ReadCloser, error) {
	path := c.sessionCertPath(st)
	if path == "" {
		return creds, c.stdin, nil
	}
	sess, ok, err := client.SessionCertCredentials(creds, path, timeNow())
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	if !ok {
		return creds, c.stdin, nil
	}
	return sess, client.OnFirstRead(c.stdin, func() { _ = os.Remove(path) }), nil
}
