package client

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/term"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// Prompter asks the user for secrets.
type Prompter interface {
	// Secret shows prompt and reads one line without echo.
	Secret(prompt string) (string, error)
}

// StdinPrompter reads from a terminal without echo, or, when In is not a
// terminal, one line per question from In (so scripts can pipe the
// password and then the OTP).
type StdinPrompter struct {
	In  *os.File
	Out io.Writer
	rd  *bufio.Reader
}

// Secret implements Prompter.
func (p *StdinPrompter) Secret(prompt string) (string, error) {
	if term.IsTerminal(int(p.In.Fd())) {
		fmt.Fprint(p.Out, prompt)
		data, err := term.ReadPassword(int(p.In.Fd()))
		fmt.Fprintln(p.Out)
		return string(data), trace.Wrap(err)
	}
	if p.rd == nil {
		p.rd = bufio.NewReader(p.In)
	}
	line, err := p.rd.ReadString('\n')
	if err != nil && (err != io.EOF || line == "") {
		if err == io.EOF {
			return "", nil
		}
		return "", trace.Wrap(err)
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// LoginConfig is one `psh login`.
type LoginConfig struct {
	Web   WebConfig
	User  string
	TTL   time.Duration
	Store *Store
	// Prompt reads the password and OTP.
	Prompt Prompter
	// OTP forces the OTP question even when the proxy reports "off".
	OTP bool
	// AgentSock, when set, is the ssh-agent that gets the key and
	// certificate.
	AgentSock string
	// Now is the clock for the agent lifetime; nil means time.Now.
	Now func() time.Time
}

// LoginResult says what a login stored.
type LoginResult struct {
	Profile *Profile
	Cert    *ssh.Certificate
	// AgentErr is why adding to the agent failed (the login succeeded).
	AgentErr error
}

// Login asks the proxy who it is, reads the password (and OTP), fetches a
// certificate for a fresh ed25519 key and stores everything. Nothing is
// written unless the proxy issued a certificate.
func Login(ctx context.Context, cfg LoginConfig) (*LoginResult, error) {
	if cfg.User == "" {
		return nil, trace.BadParameter("missing --user NAME")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	wc, err := NewWebClient(cfg.Web)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	defer wc.Close()
	ping, err := wc.Ping(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	password, err := cfg.Prompt.Secret(fmt.Sprintf("Password for %s@%s: ", cfg.User, wc.Addr()))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var otp string
	if cfg.OTP || ping.SecondFactor == webapi.SecondFactorOTP || ping.SecondFactor == webapi.SecondFactorOn {
		if otp, err = cfg.Prompt.Secret("OTP code (empty if you have none): "); err != nil {
			return nil, trace.Wrap(err)
		}
	}
	priv, pub, err := utils.GenerateKeyPair()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := wc.SSHLogin(ctx, webapi.SSHLoginRequest{
		User: cfg.User, Password: password, OTPToken: strings.TrimSpace(otp),
		PubKey: string(pub), TTLSeconds: int64(cfg.TTL / time.Second),
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return saveLogin(loginSave{wc: wc, ping: ping, priv: priv, pub: pub, resp: resp, store: cfg.Store, agentSock: cfg.AgentSock, now: cfg.Now})
}

// loginSave is what a login stores once the proxy issued a certificate,
// however the user proved who they are.
type loginSave struct {
	wc        *WebClient
	ping      *webapi.PingResponse
	priv, pub []byte
	resp      *webapi.SSHLoginResponse
	store     *Store
	agentSock string
	now       func() time.Time
}

// saveLogin stores the key, the certificate, the cluster's host CAs (for
// known_hosts) and the profile, and adds the key to the agent: the one way
// every login ends, so that psh ssh, psh config and ssh -J work the same
// after a password login and a single sign-on.
func saveLogin(l loginSave) (*LoginResult, error) {
	certPub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(l.resp.Cert))
	cert, ok := certPub.(*ssh.Certificate)
	if err != nil || !ok {
		return nil, trace.BadParameter("proxy %s returned an invalid certificate", l.wc.Addr())
	}
	if key, _, _, _, err := ssh.ParseAuthorizedKey(l.pub); err != nil || !bytes.Equal(cert.Key.Marshal(), key.Marshal()) {
		return nil, trace.BadParameter("proxy %s returned a certificate for another key", l.wc.Addr())
	}
	known, leaves, err := knownHostsOf(l.resp.HostSigners, l.ping.ClusterName)
	if err != nil {
		return nil, trace.Wrap(err, "proxy %s", l.wc.Addr())
	}
	profile := Profile{
		Proxy:    l.wc.Addr(),
		ProxySSH: proxySSHAddr(l.wc.Addr(), l.ping.ProxySSHAddr),
		User:     l.resp.Username,
		Cluster:  l.ping.ClusterName,
		Clusters: leaves,
	}
	if err := l.store.Save(&StoredLogin{Profile: profile, Key: l.priv, Pub: l.pub, Cert: []byte(l.resp.Cert + "\n"), KnownHosts: known}); err != nil {
		return nil, trace.Wrap(err)
	}
	res := &LoginResult{Profile: &profile, Cert: cert}
	if l.agentSock != "" {
		res.AgentErr = addToAgent(l.agentSock, l.priv, cert, l.now())
	}
	return res, nil
}

// proxySSHAddr resolves what /webapi/ping advertised: a proxy listening on
// all interfaces advertises an empty or unspecified host, which means
// "the host you reached me at".
func proxySSHAddr(webAddr, advertised string) string {
	host, port, err := net.SplitHostPort(advertised)
	if err != nil {
		return advertised
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		webHost, _, _ := net.SplitHostPort(webAddr)
		return net.JoinHostPort(webHost, port)
	}
	return advertised
}

// addToAgent adds the key, plain and with its certificate (as ssh-add
// does), for the certificate's remaining lifetime.
func addToAgent(sock string, keyPEM []byte, cert *ssh.Certificate, now time.Time) error {
	raw, err := ssh.ParseRawPrivateKey(keyPEM)
	if err != nil {
		return trace.Wrap(err)
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		return trace.ConnectionProblem(err, "ssh-agent at %s: %v", sock, err)
	}
	defer conn.Close()
	life := time.Unix(int64(cert.ValidBefore), 0).Sub(now)
	if life <= 0 {
		return trace.BadParameter("certificate already expired")
	}
	ag := agent.NewClient(conn)
	comment := "postern:" + cert.KeyId
	for _, k := range []agent.AddedKey{
		{PrivateKey: raw, Certificate: cert, LifetimeSecs: uint32(life / time.Second), Comment: comment},
		{PrivateKey: raw, LifetimeSecs: uint32(life / time.Second), Comment: comment},
	} {
		if err := ag.Add(k); err != nil {
			return trace.Wrap(err, "adding the key to ssh-agent at %s", sock)
		}
	}
	return nil
}

// knownHostsOf turns a login's host_signers into known_hosts lines: the
// local cluster's CA for every name ("*"), each leaf's only for
// "*.LEAF" (a leaf's CA must never vouch for a root host, nor for another
// leaf's), and returns the leaves, sorted. A login without the local
// cluster's host CA is refused: psh could verify no host.
func knownHostsOf(signers []authapi.HostSigner, local string) (known, leaves []string, err error) {
	var localLines []string
	seen := map[string]bool{}
	for _, hs := range signers {
		if err := services.CheckClusterName(hs.ClusterName); err != nil {
			return nil, nil, trace.BadParameter("returned a host CA for an invalid cluster name %q", hs.ClusterName)
		}
		name := strings.ToLower(hs.ClusterName)
		if seen[name] {
			return nil, nil, trace.BadParameter("returned two host CA entries for cluster %q", hs.ClusterName)
		}
		seen[name] = true
		if len(hs.CheckingKeys) == 0 {
			continue
		}
		if strings.EqualFold(hs.ClusterName, local) {
			localLines = authapi.KnownHostsLines(hs.CheckingKeys)
			continue
		}
		known = append(known, authapi.ScopedKnownHostsLines(strings.Join(authz.HostAuthorityPatterns(hs.ClusterName, local), ","), hs.CheckingKeys)...)
		leaves = append(leaves, hs.ClusterName)
	}
	if len(localLines) == 0 {
		return nil, nil, trace.BadParameter("returned no host CA for cluster %q: refusing to log in without a way to verify hosts", local)
	}
	slices.Sort(leaves)
	return append(localLines, known...), leaves, nil
}
