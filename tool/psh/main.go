// Command psh is Postern's user CLI: log in once through the proxy's web
// API, then reach nodes with `psh ssh`, stock OpenSSH (`psh config`) or a
// ProxyCommand (`psh proxy ssh`).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/client"
	"github.com/postern-dev/postern/lib/utils"
	"github.com/postern-dev/postern/lib/version"
)

func main() {
	debug := utils.DebugRequested(os.Args[1:])
	err := run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	var exit *client.ExitStatusError
	var connErr connectError
	if errors.As(err, &connErr) && !errors.As(err, &exit) {
		utils.PrintError(os.Stderr, connErr.error, debug)
		os.Exit(exitConnect)
	}
	if errors.As(err, &exit) {
		if exit.Message != "" {
			// One line, as OpenSSH says "Connection to HOST closed.":
			// a bare 255 would leave the user guessing.
			fmt.Fprintf(os.Stderr, "psh: %s\n", exit.Message)
		}
		os.Exit(exit.Status)
	}
	if err != nil {
		utils.FatalError(err, debug)
	}
}

// cli holds the flags of every command and the streams.
type cli struct {
	home   string
	debug  bool
	stdin  *os.File
	stdout io.Writer
	stderr io.Writer

	login struct {
		proxy, user, cacert, addKeys string
		auth, browser                string
		ttl                          time.Duration
		insecure, otp                bool
	}
	ls  struct{ format, cluster string }
	ssh struct {
		forwardAgent, tty, noTTY, noCommand bool
		local, remote, dynamic              []string
		port, cluster, login, escape        string
		target, browser                     string
		command                             []string
	}
	scp      scpFlags
	proxySSH struct {
		cluster, target string
		sessionMFA      bool
	}
	status struct{ format string }
	bench  benchFlags
	req    requestFlags
}

// loginTimeout bounds a whole login, prompts included: a person typing a
// password and an OTP needs a while, a hung proxy should not hold psh
// forever (each web call also has its own client.DefaultWebTimeout).
const loginTimeout = 5 * time.Minute

func run(ctx context.Context, args []string, stdin *os.File, stdout, stderr io.Writer) error {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	app := kingpin.New("psh", "Postern user CLI: log in, list nodes, ssh through the proxy.")
	app.HelpFlag.Short('h')
	// --help prints usage and would exit the process; record it instead
	// (tests run commands in-process) and return success. Parsing goes on
	// after a terminate: whatever it would print next (the usage again, after
	// --help-man or a --completion-script-*) is dropped.
	helped := false
	app.Terminate(func(int) {
		helped = true
		app.Writer(io.Discard)
	})
	app.UsageWriter(stdout)
	app.ErrorWriter(stderr)
	// Flags go before the host: everything after it is the remote command
	// (`psh ssh node ls -la`).
	app.Interspersed(false)
	app.Flag("debug", "Full error reports.").BoolVar(&c.debug)
	app.Flag("home", "psh's home directory (default $"+client.HomeEnv+" or ~/.postern).").StringVar(&c.home)

	cmds := map[string]func(context.Context) error{}
	add := func(cc *kingpin.CmdClause, fn func(context.Context) error) { cmds[cc.FullCommand()] = fn }

	app.Flag("version", "Print the version and exit (as `psh version`).").Short('V').Bool()
	add(app.Command("version", "Print the version."), c.version)

	login := app.Command("login", "Log in through the proxy and store a certificate.")
	login.Flag("proxy", "Proxy web address HOST[:PORT] (port 3080 by default); required but with --request-id.").StringVar(&c.login.proxy)
	login.Flag("user", "Postern user name (password login).").StringVar(&c.login.user)
	login.Flag("auth", "Log in through this single sign-on connector of the proxy, or \"web\" on the proxy's web login page (password, passkey, any second factor), instead of in the terminal.").StringVar(&c.login.auth)
	login.Flag("browser", "With --auth: none prints the login URL without opening a browser.").EnumVar(&c.login.browser, "none")
	login.Flag("ttl", "Certificate lifetime (capped by your roles).").Default("8h").DurationVar(&c.login.ttl)
	login.Flag("insecure", "Do not verify the proxy's TLS certificate (dangerous).").BoolVar(&c.login.insecure)
	login.Flag("cacert", "PEM file of the CA that signed the proxy's TLS certificate.").StringVar(&c.login.cacert)
	login.Flag("otp", "Ask for an OTP code even if the proxy does not say it is needed.").BoolVar(&c.login.otp)
	login.Flag("add-keys-to-agent", "Add the key and certificate to ssh-agent (yes|no).").Default("yes").EnumVar(&c.login.addKeys, "yes", "no")
	add(login, c.doLogin)

	ls := app.Command("ls", "List the nodes you may reach.")
	ls.Flag("format", "Output format: text or json.").Default("text").EnumVar(&c.ls.format, "text", "json")
	ls.Flag("cluster", "Cluster whose nodes to list (default: the proxy's).").StringVar(&c.ls.cluster)
	add(ls, c.doLs)

	sshCmd := app.Command("ssh", "Run a shell or a command on a node through the proxy.")
	sshCmd.Flag("forward-agent", "Forward the local ssh-agent ($SSH_AUTH_SOCK).").Short('A').BoolVar(&c.ssh.forwardAgent)
	sshCmd.Flag("tty", "Force a pty.").Short('t').BoolVar(&c.ssh.tty)
	sshCmd.Flag("no-tty", "Never request a pty.").Short('T').BoolVar(&c.ssh.noTTY)
	sshCmd.Flag("local", "Local forward [BIND:]PORT:HOST:HOSTPORT (repeatable).").Short('L').StringsVar(&c.ssh.local)
	sshCmd.Flag("remote", "Remote forward [BIND:]PORT:HOST:HOSTPORT (repeatable).").Short('R').StringsVar(&c.ssh.remote)
	sshCmd.Flag("dynamic", "Dynamic (SOCKS5) forward [BIND:]PORT, connections opened from the node (repeatable).").Short('D').StringsVar(&c.ssh.dynamic)
	sshCmd.Flag("no-command", "Run no command: only forward ports (-L, -R, -D) until interrupted.").Short('N').BoolVar(&c.ssh.noCommand)
	sshCmd.Flag("login", "Login on the node (as LOGIN@HOST; default: your first).").Short('l').StringVar(&c.ssh.login)
	sshCmd.Flag("escape", "Escape character of a pty session (~. disconnects), ^X, or none.").Short('e').Default("~").StringVar(&c.ssh.escape)
	sshCmd.Flag("port", "Node SSH port (when several nodes share a name).").Short('p').StringVar(&c.ssh.port)
	sshCmd.Flag("cluster", "Cluster of the node (default: the proxy's).").StringVar(&c.ssh.cluster)
	sshCmd.Flag("browser", "For a node that asks a fresh second factor per session, confirmed with a passkey: none prints the page's URL without opening a browser.").EnumVar(&c.ssh.browser, "none")
	sshCmd.Arg("host", "[LOGIN@]HOST").Required().StringVar(&c.ssh.target)
	sshCmd.Arg("command", "Command to run (default: a login shell).").StringsVar(&c.ssh.command)
	add(sshCmd, c.doSSH)

	proxyCmd := app.Command("proxy", "Tunnels for other SSH clients.")
	proxySSH := proxyCmd.Command("ssh", "Stdio tunnel to a node's SSH port, for OpenSSH ProxyCommand.")
	proxySSH.Flag("cluster", "Cluster of the node (default: the proxy's).").StringVar(&c.proxySSH.cluster)
	proxySSH.Flag("session-mfa", "For OpenSSH Match exec (psh config): if the node needs a fresh second factor for this session, ask for it on the terminal and write the per-session certificate; exit 0 if one was written, 1 if none is needed.").BoolVar(&c.proxySSH.sessionMFA)
	proxySSH.Arg("target", "[LOGIN@]HOST[:PORT]").Required().StringVar(&c.proxySSH.target)
	add(proxySSH, c.doProxySSH)

	add(app.Command("config", "Print an OpenSSH config block for this cluster."), c.doConfig)
	status := app.Command("status", "Show the current login.")
	status.Flag("format", "Output format: text or json.").Default("text").EnumVar(&c.status.format, "text", "json")
	add(status, c.doStatus)
	c.addScp(app, add)
	c.addBench(app, add)
	c.addRecordings(app, add)
	c.addRequests(app, add, login, c.doLogin)
	c.addSessions(app, add)
	add(app.Command("logout", "Remove the stored key, certificate and profile."), c.doLogout)

	if versionAsked(args) {
		return c.version(ctx)
	}
	cmd, err := app.Parse(args)
	if helped {
		return nil
	}
	if err != nil {
		return trace.BadParameter("%v (see psh --help)", err)
	}
	fn, ok := cmds[cmd]
	if !ok {
		return nil // --help
	}
	return fn(ctx)
}

// versionAsked reports whether --version or -V comes before the command:
// checked before parsing, which would otherwise insist on a command.
func versionAsked(args []string) bool {
	for _, a := range args {
		switch {
		case a == "--version" || a == "-V":
			return true
		case !strings.HasPrefix(a, "-"):
			return false
		}
	}
	return false
}

func (c *cli) version(context.Context) error {
	fmt.Fprintln(c.stdout, "psh "+version.Version)
	return nil
}

func (c *cli) store() (*client.Store, error) {
	if c.home != "" {
		return client.NewStore(c.home), nil
	}
	dir, err := client.DefaultHome()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return client.NewStore(dir), nil
}

// credentials loads the current login or says how to get one.
func (c *cli) credentials() (*client.Store, *client.Credentials, error) {
	st, err := c.store()
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	creds, err := st.Credentials(timeNow())
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	return st, creds, nil
}

// timeNow is the wall clock: psh is a short-lived CLI whose only time
// question is "has the certificate expired", asked of the real clock.
func timeNow() time.Time { return time.Now() }
