// Command pctl is Postern's admin CLI. It talks to the auth API over mutual
// TLS with the admin identity the auth server leaves in its data dir, or
// with --auth-server and --identity from anywhere else.
package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/utils"
	"github.com/postern-dev/postern/lib/version"
)

func main() {
	debug := utils.DebugRequested(os.Args[1:])
	ctx := context.Background()
	if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout); err != nil {
		utils.FatalError(err, debug)
	}
}

// cli holds the global flags and the streams, so that tests run commands
// in-process exactly as the binary does.
type cli struct {
	dataDir    string
	authServer string
	identity   string
	debug      bool
	// addr is the auth address connect dialed, for messages.
	addr   string
	stdin  io.Reader
	stdout io.Writer
	// timeout replaces defaultTimeout for a command that may take longer
	// (pctl backup --timeout); zero means defaultTimeout.
	timeout time.Duration
}

// AuthAddrFile is written by the auth server next to the admin identity: the
// address pctl on the same machine dials.
const AuthAddrFile = config.AuthAddrFile

// defaultTimeout bounds one pctl command; every command is a handful of
// round trips to the auth API.
const defaultTimeout = 30 * time.Second

func run(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	c := &cli{stdin: stdin, stdout: stdout}
	app, cmds := c.newApp()
	cmd, err := app.Parse(args)
	if err != nil {
		return trace.BadParameter("%v (see pctl --help)", err)
	}
	fn, ok := cmds[cmd]
	if !ok {
		return nil // --help
	}
	timeout := defaultTimeout
	if c.timeout > 0 {
		timeout = c.timeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return trace.Wrap(fn(ctx))
}

// newApp declares every command and flag, and the function each command
// runs; apart from run so that a test can walk the command tree
// (docs/reference.md lists it).
func (c *cli) newApp() (*kingpin.Application, map[string]func(context.Context) error) {
	app := kingpin.New("pctl", "Postern admin CLI: users, roles, join tokens, nodes and networking.")
	app.HelpFlag.Short('h')
	app.UsageWriter(c.stdout)
	app.Version("pctl " + version.Version)
	app.Flag("data-dir", "Data dir of a local auth server (its admin identity is used).").Default(config.DefaultDataDir).StringVar(&c.dataDir)
	app.Flag("auth-server", "Auth API address HOST:PORT, or several separated by commas (failover), with --identity.").StringVar(&c.authServer)
	app.Flag("identity", "Directory of an admin identity.").StringVar(&c.identity)
	app.Flag("debug", "Full error reports.").BoolVar(&c.debug)

	cmds := map[string]func(context.Context) error{}
	add := func(cc *kingpin.CmdClause, fn func(context.Context) error) { cmds[cc.FullCommand()] = fn }

	add(app.Command("version", "Print the version."), c.version)
	c.registerUsers(app, add)
	c.registerResources(app, add)
	c.registerTokens(app, add)
	c.registerNodes(app, add)
	c.registerProxies(app, add)
	c.registerClusters(app, add)
	c.registerAuth(app, add)
	c.registerEvents(app, add)
	c.registerLocks(app, add)
	c.registerRequests(app, add)
	c.registerRecordings(app, add)
	c.registerBackup(app, add)
	return app, cmds
}

// connect opens the auth client with the admin identity.
func (c *cli) connect(ctx context.Context) (*auth.Client, *auth.Identity, error) {
	dir := c.identity
	addr := c.authServer
	if dir == "" {
		dir = config.AdminIdentityDir(c.dataDir)
	}
	id, err := auth.ReadIdentity(dir)
	if err != nil {
		if c.identity == "" {
			return nil, nil, trace.BadParameter("no admin identity in %s (%v): run pctl on the auth server with --data-dir, or pass --auth-server and --identity", dir, utils.UserMessage(err))
		}
		return nil, nil, trace.Wrap(err)
	}
	if addr == "" {
		data, err := os.ReadFile(filepath.Join(dir, AuthAddrFile))
		if err != nil {
			return nil, nil, trace.BadParameter("%s has no %s: is the auth server running? (or pass --auth-server)", dir, AuthAddrFile)
		}
		addr = strings.TrimSpace(string(data))
	}
	c.addr = addr
	clt, err := auth.NewClient(auth.ClientConfig{Addr: addr, Identity: id})
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	return clt, id, nil
}
