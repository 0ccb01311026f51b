package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"golang.org/x/crypto/ssh"
	"golang.org/x/term"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/proxy"
)

// Per-session MFA in psh (role option require_session_mfa): the proxy
// refuses psh's certificate for a node that needs a fresh second factor
// per session (proxyapi.MsgSessionMFARequired); psh then asks for a code,
// gets a per-session certificate for its own key (a minute, that node and
// login only) and connects with it. Nothing is stored: the next session
// asks again.

// IsSessionMFARequired reports the proxy's refusal of a normal
// certificate for a node that needs a fresh factor per session.
func IsSessionMFARequired(err error) bool {
	return err != nil && strings.Contains(err.Error(), proxyapi.MsgSessionMFARequired)
}

// maxSessionCertAnswer bounds the proxy's answer: one certificate.
const maxSessionCertAnswer = 64 << 10

// SessionMFACredentials asks the proxy for a per-session certificate for
// target as login, proven by otp, and returns creds with it in place of
// the login's certificate (the same key).
func SessionMFACredentials(ctx context.Context, creds *Credentials, target proxy.Target, login, otp string) (*Credentials, error) {
	resp, err := askSessionCert(ctx, creds, target, login, otp, nil)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return withSessionCert(creds, []byte(resp.Cert))
}

// SessionMFABrowser is the passkey way of SessionMFACredentials: the
// proxy's login page asks for the passkey (the browser does WebAuthn, as
// for psh login --auth web) and the per-session certificate comes back
// through the same sealed loopback hand-off.
type SessionMFABrowser struct {
	// Out gets the line with the page's URL.
	Out io.Writer
	// OpenBrowser opens it; nil means the user does (--browser none).
	OpenBrowser func(url string) error
	// Timeout bounds the wait; zero means DefaultSSOTimeout.
	Timeout time.Duration
	// Clock times the wait; nil means the real clock.
	Clock clockwork.Clock
}

// SessionMFABrowserCredentials is SessionMFACredentials with a passkey in
// the browser.
func SessionMFABrowserCredentials(ctx context.Context, creds *Credentials, target proxy.Target, login string, b SessionMFABrowser) (*Credentials, error) {
	if b.Timeout <= 0 {
		b.Timeout = DefaultSSOTimeout
	}
	if b.Clock == nil {
		b.Clock = clockwork.NewRealClock()
	}
	if b.Out == nil {
		b.Out = io.Discard
	}
	h, err := NewSSOHandoff()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	redirect, stop, err := h.Listen("127.0.0.1:0")
	if err != nil {
		return nil, trace.Wrap(err)
	}
	defer stop()
	resp, err := askSessionCert(ctx, creds, target, login, "", &proxyapi.SessionMFABrowserLogin{RedirectURL: redirect, SealKey: h.SealKey()})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if !strings.HasPrefix(resp.Path, "/") || strings.HasPrefix(resp.Path, "//") {
		return nil, trace.BadParameter("the proxy answered an unusable page path %q", resp.Path)
	}
	pageURL := "https://" + creds.Profile.Proxy + resp.Path
	if err := checkBrowserURL(pageURL); err != nil {
		return nil, trace.BadParameter("the proxy answered an unusable page path: %v", err)
	}
	fmt.Fprintf(b.Out, "Confirm this session with your passkey. If the browser does not open, visit: %s\n", pageURL)
	if b.OpenBrowser != nil {
		if err := b.OpenBrowser(pageURL); err != nil {
			fmt.Fprintf(b.Out, "Could not open a browser (%v); open the URL above yourself.\n", err)
		}
	}
	got, err := h.Wait(ctx, b.Clock, b.Timeout)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return withSessionCert(creds, got.Cert)
}

// askSessionCert runs the session-mfa-cert subsystem: with otp, the
// certificate; with browser, the page's path.
func askSessionCert(ctx context.Context, creds *Credentials, target proxy.Target, login, otp string, browser *proxyapi.SessionMFABrowserLogin) (*proxyapi.SessionMFACertResponse, error) {
	return sessionCertExchange(ctx, creds, proxyapi.SessionMFACertRequest{
		Target: proxy.Target{Host: target.Host, Port: target.Port}.String(), Cluster: target.Cluster, Login: login, OTP: otp, Browser: browser,
		PublicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(creds.Cert.Key))),
	})
}

// sessionCertExchange sends req to the session-mfa-cert subsystem and
// reads the answer.
func sessionCertExchange(ctx context.Context, creds *Credentials, sreq proxyapi.SessionMFACertRequest) (*proxyapi.SessionMFACertResponse, error) {
	pc, err := DialProxy(ctx, creds)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	defer pc.Close()
	ch, err := OpenSubsystem(ctx, pc, SubsystemConfig{Name: proxyapi.SubsystemSessionMFACert})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	defer ch.closeWith(pc)
	stop := context.AfterFunc(ctx, func() { ch.Close() })
	defer stop()
	req, err := json.Marshal(sreq)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if _, err := ch.Write(req); err != nil {
		return nil, trace.ConnectionProblem(err, "asking the proxy for a per-session certificate: %v", err)
	}
	if err := ch.CloseWrite(); err != nil {
		return nil, trace.ConnectionProblem(err, "asking the proxy for a per-session certificate: %v", err)
	}
	data, err := io.ReadAll(io.LimitReader(ch, maxSessionCertAnswer))
	if err != nil {
		return nil, trace.ConnectionProblem(err, "reading the per-session certificate: %v", err)
	}
	var resp proxyapi.SessionMFACertResponse
	if err := json.Unmarshal(data, &resp); err != nil || (resp.Cert == "" && resp.Path == "" && resp.Required == nil) {
		if msg := ch.Explain(); msg != "" {
			return nil, trace.AccessDenied("no per-session certificate: %s", msg)
		}
		return nil, trace.BadParameter("the proxy sent no per-session certificate")
	}
	return &resp, nil
}

// withSessionCert is creds with a per-session certificate for its key.
func withSessionCert(creds *Credentials, certData []byte) (*Credentials, error) {
	pub, _, _, _, err := ssh.ParseAuthorizedKey(certData)
	if err != nil {
		return nil, trace.BadParameter("the proxy sent an invalid per-session certificate: %v", err)
	}
	cert, ok := pub.(*ssh.Certificate)
	if !ok {
		return nil, trace.BadParameter("the proxy sent a plain key, not a per-session certificate")
	}
	key, err := ssh.ParsePrivateKey(creds.KeyPEM)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	signer, err := ssh.NewCertSigner(cert, key)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	out := *creds
	out.Signer, out.Cert = signer, cert
	return &out, nil
}

// ReadSecretLine asks for a secret on a terminal without echo; from a
// pipe it reads one line a byte at a time, so that what follows on stdin
// stays for the session that the code opens. A pipe that ends before
// any line is io.EOF (an empty line is an answer: "").
func ReadSecretLine(in *os.File, out io.Writer, prompt string) (string, error) {
	if term.IsTerminal(int(in.Fd())) {
		fmt.Fprint(out, prompt)
		data, err := term.ReadPassword(int(in.Fd()))
		fmt.Fprintln(out)
		return strings.TrimSpace(string(data)), trace.Wrap(err)
	}
	var line []byte
	var b [1]byte
	for {
		n, err := in.Read(b[:])
		if n == 1 {
			if b[0] == '\n' {
				break
			}
			line = append(line, b[0])
		}
		if err == io.EOF {
			if len(line) == 0 {
				// Nothing, not even an empty line: no answer.
				return "", io.EOF
			}
			break
		}
		if err != nil {
			return "", trace.Wrap(err)
		}
	}
	return strings.TrimSpace(string(line)), nil
}
