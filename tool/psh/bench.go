package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/bench"
	"github.com/postern-dev/postern/lib/proxy"
)

// benchFlags are `psh bench ssh`'s.
type benchFlags struct {
	rate        float64
	duration    time.Duration
	concurrency int
	hold        int
	phases      bool
	export      string
	format      string
	metricsURL  string
	sources     []string
	cluster     string
	jump        bool
	target      string
	command     []string
}

func (c *cli) addBench(app *kingpin.Application, add func(*kingpin.CmdClause, func(context.Context) error)) {
	b := &c.bench
	cmd := app.Command("bench", "Load-test the cluster.").Command("ssh",
		"Open-loop SSH session benchmark through the proxy: sessions start at --rate per second whatever the server's speed, and each latency counts from its scheduled start.")
	cmd.Flag("rate", "Sessions started per second.").Default("10").Float64Var(&b.rate)
	cmd.Flag("duration", "How long sessions are started for.").Default("10s").DurationVar(&b.duration)
	cmd.Flag("concurrency", "Most sessions in flight at once.").Default("256").IntVar(&b.concurrency)
	cmd.Flag("hold", "Open N idle sessions first and keep them open for the run (with --metrics-url: the proxy's memory and goroutines per session).").IntVar(&b.hold)
	cmd.Flag("phases", "Report each phase of the setup (tcp, proxy kex, proxy auth, route+dial, node kex, node auth, channel open, first byte).").BoolVar(&b.phases)
	cmd.Flag("export", "Write the latency histogram (HdrHistogram percentile distribution, ms) to FILE for plotting.").StringVar(&b.export)
	cmd.Flag("format", "Output format: text or json.").Default("text").EnumVar(&b.format, "text", "json")
	cmd.Flag("metrics-url", "The proxy's /metrics URL (its diagnostics address), sampled for --hold.").StringVar(&b.metricsURL)
	cmd.Flag("source", "Local IP address to connect from (repeatable, used in turn: the proxy limits new connections per address).").StringsVar(&b.sources)
	cmd.Flag("cluster", "Cluster of the node (default: the proxy's).").StringVar(&b.cluster)
	cmd.Flag("jump", "Reach the node as `ssh -J` does (a direct-tcpip channel) instead of psh's proxy subsystem.").BoolVar(&b.jump)
	cmd.Arg("host", "[LOGIN@]HOST").Required().StringVar(&b.target)
	cmd.Arg("command", "Command to run in each session, timed to its first byte of output (default: none, the session is set up and closed).").StringsVar(&b.command)
	add(cmd, c.doBenchSSH)
}

func (c *cli) doBenchSSH(ctx context.Context) error {
	b := &c.bench
	// The engine checks these too; here they are refused before the
	// credentials are even read.
	if !(b.rate > 0) {
		return trace.BadParameter("--rate must be a positive number of sessions per second, got %v", b.rate)
	}
	if b.duration <= 0 && b.hold == 0 {
		return trace.BadParameter("--duration must be positive, got %v", b.duration)
	}
	if b.hold > 0 && b.duration < 0 {
		return trace.BadParameter("--duration must not be negative, got %v", b.duration)
	}
	var sources []net.IP
	for _, s := range b.sources {
		ip := net.ParseIP(s)
		if ip == nil {
			return trace.BadParameter("--source %q is not an IP address", s)
		}
		sources = append(sources, ip)
	}
	_, creds, err := c.credentials()
	if err != nil {
		return trace.Wrap(err)
	}
	login, host := splitLogin(b.target)
	if login == "" && strings.Contains(b.target, "@") {
		return trace.BadParameter("no login before the @ in %q: name one as LOGIN@HOST, or leave out the @ for the certificate's first", b.target)
	}
	if login == "" {
		login = creds.DefaultLogin()
	}
	target, err := proxy.ParseTarget(host)
	if err != nil {
		return trace.Wrap(err)
	}
	target.Cluster = b.cluster
	session, err := bench.SSHSession(bench.SSHConfig{
		Credentials: creds,
		Target:      target,
		Login:       login,
		Command:     strings.Join(b.command, " "),
		Sources:     sources,
		Jump:        b.jump,
	})
	if err != nil {
		return trace.Wrap(err)
	}
	if err := bench.Probe(ctx, session, nil); err != nil {
		// Its error alone (the routing error, the refusal): the user
		// learns what every session would have failed on.
		return trace.Wrap(err)
	}
	cfg := bench.Config{
		Rate:        b.rate,
		Duration:    b.duration,
		Concurrency: b.concurrency,
		Hold:        b.hold,
		Session:     session,
		Progress:    c.stderr,
	}
	if b.metricsURL != "" {
		cfg.Sample = bench.MetricsSampler(b.metricsURL)
	}
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		return trace.Wrap(err)
	}
	if !b.phases {
		res.Phases = nil
	}
	if b.export != "" && res.Scheduled > 0 {
		f, err := os.Create(b.export)
		if err != nil {
			return trace.ConvertSystemError(err)
		}
		err = res.Export(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return trace.Wrap(err, "writing %s", b.export)
		}
	}
	if b.format == "json" {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		return trace.Wrap(enc.Encode(res))
	}
	res.WriteText(c.stdout)
	return nil
}
