// Command postern is the Postern daemon: the auth, proxy and node roles in
// any combination (docs/reference.md, `postern start`).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/utils"
	"github.com/postern-dev/postern/lib/version"
)

func main() {
	// A node running as root serves sftp for other logins from a re-executed
	// child that drops privileges first; that child must never become a
	// second daemon.
	srv.RunReexecChild()
	debug := utils.DebugRequested(os.Args[1:])
	if err := run(os.Args[1:]); err != nil {
		utils.FatalError(err, debug)
	}
}

// startFlags are the flags of `postern start`; a flag that was given
// overrides the config file.
type startFlags struct {
	configFile, dataDir, roles, clusterName, nodeName, labels string
	authServer, proxyServer, token, caPin                     string
	nodeAddr, sshAddr, webAddr, authAddr, diagAddr, tunAddr   string
	webTerminalGrace                                          time.Duration
	webCert, webKey, backendType, etcdEndpoints, logFormat    string
	debug, diagPprof                                          bool
	gcPercent                                                 int

	peerAddr string

	// restore holds the flags of `postern restore`.
	restore restoreFlags
}

func run(args []string) error {
	var f startFlags
	app, versionCmd, start, restore := newApp(&f)
	cmd, err := app.Parse(args)
	if err != nil {
		return trace.BadParameter("%v (see postern --help)", err)
	}
	switch cmd {
	case versionCmd.FullCommand():
		fmt.Println("postern " + version.Version)
		return nil
	case start.FullCommand():
		cfg, err := f.config(start)
		if err != nil {
			return trace.Wrap(err)
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return trace.Wrap(service.Run(ctx, cfg))
	case restore.FullCommand():
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return trace.Wrap(f.restore.run(ctx, os.Stdout))
	}
	return nil
}

// newApp declares the commands and flags, parsing into f; apart from run
// so that a test can walk the command tree (docs/reference.md lists it).
func newApp(f *startFlags) (app *kingpin.Application, versionCmd, start, restore *kingpin.CmdClause) {
	app = kingpin.New("postern", "Postern: an SSH access proxy. Runs the auth, proxy and node roles.")
	app.HelpFlag.Short('h')
	app.ErrorWriter(os.Stderr)
	// --help and --version print to stdout, as psh and pctl do.
	app.UsageWriter(os.Stdout)
	app.Version("postern " + version.Version)

	versionCmd = app.Command("version", "Print the version.")
	start = app.Command("start", "Start Postern with the given roles.")
	start.Flag("config", "YAML config file (postern.yaml).").Short('c').StringVar(&f.configFile)
	start.Flag("data-dir", "Data directory (default "+config.DefaultDataDir+").").StringVar(&f.dataDir)
	start.Flag("roles", "Comma-separated roles: auth,proxy,node (default all three).").StringVar(&f.roles)
	start.Flag("cluster-name", "Cluster name (auth role; default "+config.DefaultClusterName+").").StringVar(&f.clusterName)
	start.Flag("nodename", "This node's hostname in the inventory (default: the OS hostname).").StringVar(&f.nodeName)
	start.Flag("labels", "Node labels: k=v,k2=v2.").StringVar(&f.labels)
	start.Flag("auth-server", "Auth server HOST:PORT to join (roles without auth); several separated by commas fail over.").StringVar(&f.authServer)
	start.Flag("proxy-server", "Proxy web HOST:PORT to join and tunnel through (a node behind NAT: no listening port).").StringVar(&f.proxyServer)
	start.Flag("token", "Join token from `pctl tokens add`.").StringVar(&f.token)
	start.Flag("ca-pin", "Pin of the cluster's TLS CA: sha256:HEX.").StringVar(&f.caPin)
	start.Flag("node-addr", "Node SSH listen address (default "+config.DefaultNodeAddr+").").StringVar(&f.nodeAddr)
	start.Flag("ssh-addr", "Proxy SSH listen address (default "+config.DefaultSSHAddr+").").StringVar(&f.sshAddr)
	start.Flag("web-addr", "Proxy HTTPS listen address (default "+config.DefaultWebAddr+").").StringVar(&f.webAddr)
	start.Flag("tunnel-addr", "Proxy reverse tunnel listen address (default "+config.DefaultTunnelAddr+").").StringVar(&f.tunAddr)
	start.Flag("peer-addr", "Proxy peering listen address (default "+config.DefaultPeerAddr+").").StringVar(&f.peerAddr)
	start.Flag("auth-addr", "Auth API listen address (default "+config.DefaultAuthAddr+").").StringVar(&f.authAddr)
	start.Flag("diag-addr", "Diagnostics listen address (default "+config.DefaultDiagAddr+").").StringVar(&f.diagAddr)
	start.Flag("web-terminal-grace", "How long a web terminal waits for a resume after its browser went away (default 5m; web_terminal_grace: 0 in the config file turns resume off).").DurationVar(&f.webTerminalGrace)
	start.Flag("diag-pprof", "Serve pprof under /debug/pprof/ on the (loopback) diagnostics address.").BoolVar(&f.diagPprof)
	start.Flag("gc-percent", fmt.Sprintf("Garbage collector target, as GOGC (default %d, or GOGC when set).", config.DefaultGCPercent)).IntVar(&f.gcPercent)
	start.Flag("web-cert", "TLS certificate of the web port (PEM).").StringVar(&f.webCert)
	start.Flag("web-key", "TLS key of the web port (PEM).").StringVar(&f.webKey)
	start.Flag("backend", "Backend of the auth role: sqlite or etcd.").EnumVar(&f.backendType, "sqlite", "etcd")
	start.Flag("etcd-endpoints", "Comma-separated etcd client URLs.").StringVar(&f.etcdEndpoints)
	start.Flag("debug", "Verbose logs and full error reports.").BoolVar(&f.debug)
	start.Flag("log-format", "Log format: text or json.").EnumVar(&f.logFormat, "text", "json")
	restore = f.restore.register(app)
	return app, versionCmd, start, restore
}

// config builds the process config: file first, then every flag that was
// set on the command line.
func (f *startFlags) config(cmd *kingpin.CmdClause) (*config.Config, error) {
	cfg := &config.Config{}
	if f.configFile != "" {
		fc, err := config.ReadFile(f.configFile)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		cfg.FileConfig = *fc
		cfg.ConfigFile = f.configFile
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&cfg.DataDir, f.dataDir)
	set(&cfg.ClusterName, f.clusterName)
	set(&cfg.NodeName, f.nodeName)
	set(&cfg.AuthServer, f.authServer)
	set(&cfg.ProxyServer, f.proxyServer)
	set(&cfg.Token, f.token)
	set(&cfg.CAPin, f.caPin)
	set(&cfg.NodeAddr, f.nodeAddr)
	set(&cfg.SSHAddr, f.sshAddr)
	set(&cfg.WebAddr, f.webAddr)
	set(&cfg.TunnelAddr, f.tunAddr)
	set(&cfg.PeerAddr, f.peerAddr)
	set(&cfg.AuthAddr, f.authAddr)
	set(&cfg.DiagAddr, f.diagAddr)
	set(&cfg.WebCert, f.webCert)
	set(&cfg.WebKey, f.webKey)
	set(&cfg.Backend.Type, f.backendType)
	set(&cfg.LogFormat, f.logFormat)
	if f.webTerminalGrace != 0 {
		g := f.webTerminalGrace
		cfg.WebTerminalGrace = &g
	}
	if f.roles != "" {
		cfg.Roles = config.ParseRoles(f.roles)
	}
	if f.labels != "" {
		labels, err := config.ParseLabels(f.labels)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		cfg.Labels = labels
	}
	if f.etcdEndpoints != "" {
		cfg.Backend.EtcdEndpoints = strings.Split(f.etcdEndpoints, ",")
	}
	if f.debug {
		cfg.Debug = true
	}
	if f.diagPprof {
		cfg.DiagPprof = true
	}
	if f.gcPercent != 0 {
		cfg.GCPercent = f.gcPercent
	}
	if err := cfg.CheckAndSetDefaults(); err != nil {
		if cfg.ConfigFile != "" {
			return nil, trace.BadParameter("%s: %v", cfg.ConfigFile, err)
		}
		return nil, trace.Wrap(err)
	}
	return cfg, nil
}
