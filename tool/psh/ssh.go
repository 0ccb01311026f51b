package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/client"
	"github.com/postern-dev/postern/lib/proxy"
)

// exitConnect is psh's exit status when it could not connect or run the
// command at all, OpenSSH's 255: a script tells "the remote command
// failed" (its own status, passed through) from "never ran".
const exitConnect = 255

// connectError is an error of `psh ssh` or `psh scp` before (or instead
// of) a remote exit status: printed as any error, exit status 255.
type connectError struct{ error }

func (e connectError) Unwrap() error { return e.error }

// asConnectError marks err, unless it already carries a remote exit status.
func asConnectError(err error) error {
	if err == nil {
		return nil
	}
	var exit *client.ExitStatusError
	if errors.As(err, &exit) {
		return err
	}
	return connectError{err}
}

func (c *cli) doSSH(ctx context.Context) error {
	return asConnectError(c.runSSH(ctx))
}

// dialTarget connects to [LOGIN@]HOST as psh ssh and psh scp name it:
// login from the target, else -l, else the certificate's first.
func (c *cli) dialTarget(ctx context.Context, targetSpec, loginFlag, port, cluster string) (*client.NodeClient, error) {
	_, creds, err := c.credentials()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	login, host := splitLogin(targetSpec)
	if login != "" && loginFlag != "" && login != loginFlag {
		return nil, trace.BadParameter("two logins given: %q in %q and %q by -l; give one", login, targetSpec, loginFlag)
	}
	if login == "" {
		login = loginFlag
	}
	if login == "" {
		login = creds.DefaultLogin()
	}
	target, err := proxy.ParseTarget(host)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if port != "" {
		target.Port = port
	}
	target.Cluster = cluster
	target = client.ClusterTarget(target)
	dialCtx, cancel := context.WithTimeout(ctx, client.DialTimeout*2)
	defer cancel()
	nc, err := client.DialNode(dialCtx, creds, target, login, client.KeepAliveConfig{})
	if client.IsSessionMFARequired(err) {
		// A require_session_mfa role reaches the node: a fresh code for
		// this one session.
		nc, err = c.dialWithSessionMFA(ctx, creds, target, login)
	}
	return nc, trace.Wrap(err)
}

// dialWithSessionMFA asks for a fresh OTP code, gets a per-session
// certificate for target with it and connects with that.
func (c *cli) dialWithSessionMFA(ctx context.Context, creds *client.Credentials, target proxy.Target, login string) (*client.NodeClient, error) {
	otp, err := client.ReadSecretLine(c.stdin, c.stderr, fmt.Sprintf("Node %s asks for a fresh second factor for this session. OTP code (empty: a passkey in the browser): ", target.Host))
	if errors.Is(err, io.EOF) {
		return nil, trace.AccessDenied("node %s requires a fresh second factor for each session (require_session_mfa): give an OTP code, or an empty line for a passkey in the browser", target.Host)
	}
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var sessCreds *client.Credentials
	if otp == "" {
		open := client.OpenBrowser
		if c.ssh.browser == "none" {
			open = nil
		}
		sessCreds, err = client.SessionMFABrowserCredentials(ctx, creds, target, login, client.SessionMFABrowser{Out: c.stderr, OpenBrowser: open})
	} else {
		askCtx, cancel := context.WithTimeout(ctx, client.DialTimeout*2)
		sessCreds, err = client.SessionMFACredentials(askCtx, creds, target, login, otp)
		cancel()
	}
	if err != nil {
		return nil, trace.Wrap(err)
	}
	dialCtx, cancel := context.WithTimeout(ctx, client.DialTimeout*2)
	defer cancel()
	nc, err := client.DialNode(dialCtx, sessCreds, target, login, client.KeepAliveConfig{})
	return nc, trace.Wrap(err)
}

func (c *cli) runSSH(ctx context.Context) error {
	if c.ssh.tty && c.ssh.noTTY {
		return trace.BadParameter("-t and -T cannot be used together")
	}
	if c.ssh.noCommand && len(c.ssh.command) > 0 {
		return trace.BadParameter("-N runs no command, but %q was given", c.ssh.command)
	}
	escape, err := parseEscapeChar(c.ssh.escape)
	if err != nil {
		return trace.Wrap(err)
	}
	var specsL, specsR []client.ForwardSpec
	for _, s := range c.ssh.local {
		f, err := client.ParseForwardSpec(s)
		if err != nil {
			return trace.Wrap(err)
		}
		specsL = append(specsL, f)
	}
	for _, s := range c.ssh.remote {
		f, err := client.ParseForwardSpec(s)
		if err != nil {
			return trace.Wrap(err)
		}
		specsR = append(specsR, f)
	}
	var specsD []client.DynamicSpec
	for _, s := range c.ssh.dynamic {
		d, err := client.ParseDynamicSpec(s)
		if err != nil {
			return trace.Wrap(err)
		}
		specsD = append(specsD, d)
	}
	agentSock := ""
	if c.ssh.forwardAgent {
		if agentSock = os.Getenv("SSH_AUTH_SOCK"); agentSock == "" {
			return trace.BadParameter("-A: SSH_AUTH_SOCK is not set (no ssh-agent to forward)")
		}
	}
	nc, err := c.dialTarget(ctx, c.ssh.target, c.ssh.login, c.ssh.port, c.ssh.cluster)
	if err != nil {
		return trace.Wrap(err)
	}
	defer nc.Close()
	fwd := client.NewForwarder(nc.Client)
	fwd.OnError = func(err error) { fmt.Fprintf(c.stderr, "psh: forward: %v\r\n", trace.UserMessage(err)) }
	defer fwd.Close()
	for _, f := range specsL {
		if _, err := fwd.Local(f); err != nil {
			return trace.Wrap(err)
		}
	}
	for _, f := range specsR {
		if _, err := fwd.Remote(f); err != nil {
			return trace.Wrap(err)
		}
	}
	for _, d := range specsD {
		if _, err := fwd.Dynamic(d); err != nil {
			return trace.Wrap(err)
		}
	}
	if c.ssh.noCommand {
		return trace.Wrap(c.waitForwarding(ctx, nc))
	}
	cfg := client.SessionConfig{Command: c.ssh.command, AgentSock: agentSock, EscapeChar: escape, Stdin: c.stdin, Stdout: c.stdout, Stderr: c.stderr}
	if c.ssh.tty || c.ssh.noTTY {
		v := c.ssh.tty
		cfg.TTY = &v
	}
	return nc.Explain(client.RunSession(ctx, nc.Client, cfg))
}

// waitForwarding is -N: forwards only, until SIGINT or SIGTERM (exit 0,
// as OpenSSH) or until the connection ends (255, with the reason).
func (c *cli) waitForwarding(ctx context.Context, nc *client.NodeClient) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	done := make(chan struct{})
	go func() {
		_ = nc.Wait()
		close(done)
	}()
	select {
	case <-ctx.Done():
		_ = nc.Client.Close()
		<-done
		return nil
	case <-done:
		return nc.Explain(&client.ExitStatusError{Status: exitConnect, Message: "the connection to the node ended"})
	}
}

// parseEscapeChar reads -e: one character, ^X for a control character, or
// "none" to disable escapes (OpenSSH's -e).
func parseEscapeChar(s string) (byte, error) {
	switch {
	case s == "none":
		return 0, nil
	case len(s) == 1:
		return s[0], nil
	case len(s) == 2 && s[0] == '^' && s[1] >= '@' && s[1] <= '_':
		return s[1] & 0x1f, nil
	}
	return 0, trace.BadParameter("invalid escape character %q for -e: want one character, ^X, or none", s)
}
