package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/client"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
)

func (c *cli) doLogin(ctx context.Context) error {
	st, err := c.store()
	if err != nil {
		return trace.Wrap(err)
	}
	if c.login.insecure {
		fmt.Fprintf(c.stderr, "WARNING: --insecure: the TLS certificate of %s is NOT verified; anyone on the path can read your password.\n", c.login.proxy)
	}
	agentSock := ""
	if c.login.addKeys == "yes" {
		agentSock = os.Getenv("SSH_AUTH_SOCK")
	}
	ctx, cancel := context.WithTimeout(ctx, loginTimeout)
	defer cancel()
	web := client.WebConfig{Proxy: c.login.proxy, Insecure: c.login.insecure, CACertFile: c.login.cacert}
	var res *client.LoginResult
	switch {
	case c.login.auth != "" && c.login.user != "":
		return trace.BadParameter("--auth and --user exclude each other: with --auth your identity provider says who you are")
	case c.login.auth != "":
		if c.login.otp {
			return trace.BadParameter("--otp is for a password login in the terminal: with --auth the browser asks for the second factor")
		}
		open := client.OpenBrowser
		if c.login.browser == "none" {
			open = nil
		}
		res, err = client.SSOLogin(ctx, client.SSOLoginConfig{
			Web:         web,
			Connector:   c.login.auth,
			TTL:         c.login.ttl,
			Store:       st,
			Out:         c.stderr,
			OpenBrowser: open,
			AgentSock:   agentSock,
		})
	case c.login.user != "":
		if c.login.browser != "" {
			return trace.BadParameter("--browser goes with --auth")
		}
		res, err = client.Login(ctx, client.LoginConfig{
			Web:       web,
			User:      c.login.user,
			TTL:       c.login.ttl,
			Store:     st,
			Prompt:    &client.StdinPrompter{In: c.stdin, Out: c.stderr},
			OTP:       c.login.otp,
			AgentSock: agentSock,
		})
	default:
		return trace.BadParameter("missing --user NAME (password login) or --auth CONNECTOR (single sign-on)")
	}
	if err != nil {
		return trace.Wrap(err)
	}
	if res.AgentErr != nil {
		fmt.Fprintf(c.stderr, "WARNING: could not add the key to ssh-agent: %v\n", trace.UserMessage(res.AgentErr))
	}
	creds, err := st.Credentials(timeNow())
	if err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "Logged in as %s to cluster %q via %s.\n", res.Profile.User, res.Profile.Cluster, res.Profile.Proxy)
	c.printStatus(client.StatusOf(creds))
	return nil
}

func (c *cli) printStatus(s client.Status) {
	fmt.Fprintf(c.stdout, "  Proxy:       %s (ssh %s)\n", s.Proxy, s.ProxySSH)
	fmt.Fprintf(c.stdout, "  User:        %s\n", s.User)
	fmt.Fprintf(c.stdout, "  Cluster:     %s\n", s.Cluster)
	if len(s.Leaves) > 0 {
		fmt.Fprintf(c.stdout, "  Leaves:      %s\n", strings.Join(s.Leaves, ", "))
	}
	fmt.Fprintf(c.stdout, "  Logins:      %s\n", strings.Join(s.Logins, ", "))
	fmt.Fprintf(c.stdout, "  Roles:       %s\n", strings.Join(s.Roles, ", "))
	fmt.Fprintf(c.stdout, "  Valid until: %s\n", s.Expires)
}

func (c *cli) doStatus(context.Context) error {
	_, creds, err := c.credentials()
	if err != nil {
		return trace.Wrap(err)
	}
	s := client.StatusOf(creds)
	if c.status.format == "json" {
		return trace.Wrap(writeJSON(c, s))
	}
	c.printStatus(s)
	return nil
}

// writeJSON prints v as indented JSON, made safe for a terminal
// (services.SafeJSON): the --format json of every listing.
func writeJSON(c *cli, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return trace.Wrap(err)
	}
	_, err = c.stdout.Write(append(services.SafeJSON(data), '\n'))
	return trace.Wrap(err)
}

func (c *cli) doLs(ctx context.Context) error {
	_, creds, err := c.credentials()
	if err != nil {
		return trace.Wrap(err)
	}
	ctx, cancel := context.WithTimeout(ctx, client.DialTimeout*2)
	defer cancel()
	nodes, err := client.ListNodes(ctx, creds, c.ls.cluster)
	if err != nil {
		return trace.Wrap(err)
	}
	if c.ls.format == "json" {
		return trace.Wrap(writeJSON(c, nodes))
	}
	return trace.Wrap(client.WriteNodesTable(c.stdout, nodes))
}

// splitLogin splits [LOGIN@]REST.
func splitLogin(s string) (login, rest string) {
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return "", s
}

func (c *cli) doProxySSH(ctx context.Context) error {
	st, creds, err := c.credentials()
	if err != nil {
		return trace.Wrap(err)
	}
	_, hostport := splitLogin(c.proxySSH.target)
	target, err := proxy.ParseTarget(hostport)
	if err != nil {
		return trace.Wrap(err)
	}
	target.Cluster = c.proxySSH.cluster
	target = client.ClusterTarget(target)
	if c.proxySSH.sessionMFA {
		return trace.Wrap(c.prepareSessionMFA(ctx, st, creds, target))
	}
	creds, stdin, err := c.proxySSHSessionCert(st, creds)
	if err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(client.ProxyStdio(ctx, creds, target.SubsystemString(), stdin, os.Stdout, c.stderr))
}

func (c *cli) doConfig(context.Context) error {
	st, err := c.store()
	if err != nil {
		return trace.Wrap(err)
	}
	p, err := st.Profile()
	if err != nil {
		return trace.Wrap(err)
	}
	self, err := os.Executable()
	if err != nil {
		return trace.Wrap(err)
	}
	out, err := st.OpenSSHConfig(p, self)
	if err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprint(c.stdout, out)
	return nil
}

func (c *cli) doLogout(context.Context) error {
	st, err := c.store()
	if err != nil {
		return trace.Wrap(err)
	}
	p, err := st.Logout()
	if err != nil {
		return trace.Wrap(err)
	}
	if p != nil {
		fmt.Fprintf(c.stdout, "Logged out %s from %s.\n", p.User, p.Proxy)
	} else {
		fmt.Fprintln(c.stdout, "Removed a damaged profile.")
	}
	return nil
}
