package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gravitational/trace"
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
	req, err := json.Marshal(proxyapi.SessionMFACertRequest{
		Target: proxy.Target{Host: target.Host, Port: target.Port}.String(), Cluster: target.Cluster, Login: login, OTP: otp,
		PublicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(creds.Cert.Key))),
	})
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
	if err := json.Unmarshal(data, &resp); err != nil || resp.Cert == "" {
		if msg := ch.Explain(); msg != "" {
			return nil, trace.AccessDenied("no per-session certificate: %s", msg)
		}
		return nil, trace.BadParameter("the proxy sent no per-session certificate")
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(resp.Cert))
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
// stays for the session that the code opens.
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
			break
		}
		if err != nil {
			return "", trace.Wrap(err)
		}
	}
	return strings.TrimSpace(string(line)), nil
}
