package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

func (c *cli) registerResources(app *kingpin.Application, add adder) {
	roles := app.Command("roles", "Inspect roles.")
	var lsFormat string
	rl := roles.Command("ls", "List roles.")
	listFormatFlag(rl, &lsFormat)
	add(rl, func(ctx context.Context) error { return c.rolesLs(ctx, lsFormat) })

	var file string
	cr := app.Command("create", "Create or update resources from a YAML or JSON file (role, cluster_networking_config, trusted_cluster, oidc_connector, auth_preference).")
	cr.Flag("file", "Resource file.").Short('f').Required().StringVar(&file)
	add(cr, func(ctx context.Context) error { return c.create(ctx, file) })

	var kind, name string
	var getFormat string
	get := app.Command("get", "Print resources as YAML or JSON: role, user, node, lock, cluster_networking_config, trusted_cluster, oidc_connector, auth_preference.")
	get.Arg("kind", "Resource kind.").Required().StringVar(&kind)
	get.Arg("name", "Resource name (all when omitted).").StringVar(&name)
	formatFlag(get, &getFormat, "yaml (documents separated by ---, what pctl create -f reads) or json (one array).", formatYAML, formatJSON)
	add(get, func(ctx context.Context) error { return c.get(ctx, kind, name, getFormat) })

	var ref string
	rm := app.Command("rm", "Remove a resource: role/NAME (not a preset, nor one still assigned), trusted_cluster/NAME (this cluster stops trusting the root NAME), oidc_connector/NAME (its logins stop at once), auth_preference (back to the defaults).")
	rm.Arg("resource", "KIND/NAME.").Required().StringVar(&ref)
	add(rm, func(ctx context.Context) error { return c.rm(ctx, ref) })

	var strategy, caseInsensitive, dialTimeout string
	set := app.Command("set", "Change cluster settings.")
	sn := set.Command("networking", "Change the cluster networking config.")
	sn.Flag("routing-strategy", "unambiguous_match or most_recent.").EnumVar(&strategy, services.RoutingUnambiguousMatch, services.RoutingMostRecent)
	sn.Flag("case-insensitive-routing", "Match hostnames regardless of case: true or false.").EnumVar(&caseInsensitive, "true", "false")
	sn.Flag("ssh-dial-timeout", "Bound on the proxy's dial to a node, e.g. 30s.").StringVar(&dialTimeout)
	add(sn, func(ctx context.Context) error { return c.setNetworking(ctx, strategy, caseInsensitive, dialTimeout) })
}

func (c *cli) rolesLs(ctx context.Context, format string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	roles, err := clt.GetRoles(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(writeList(c.stdout, format, roles, func() error {
		tw := services.NewTable(c.stdout, "ROLE", "LOGINS", "NODE LABELS", "AGENT", "PORT FWD", "MAX TTL")
		for _, r := range roles {
			tw.Row(r.Metadata.Name, services.EscapeList(r.Spec.Logins, ","), formatSelector(r.Spec.NodeLabels), r.Spec.ForwardAgent, r.Spec.PortForwarding, maxTTL(r))
		}
		return tw.Flush()
	}))
}

func maxTTL(r *services.Role) string {
	if v := r.Spec.MaxSessionTTL.Value(); v > 0 {
		return v.String()
	}
	return services.DefaultMaxSessionTTL.String()
}

func formatSelector(sel map[string]services.LabelValues) string {
	parts := make([]string, 0, len(sel))
	for k, v := range sel {
		parts = append(parts, services.EscapeText(k)+"="+services.EscapeList(v, "|"))
	}
	sortStrings(parts)
	return strings.Join(parts, ",")
}

func (c *cli) create(ctx context.Context, file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return trace.ConvertSystemError(err)
	}
	// Parse before connecting: a broken file is reported without touching
	// the cluster.
	kind, v, err := services.UnmarshalResource(data, file)
	if err != nil {
		return trace.Wrap(err)
	}
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	switch r := v.(type) {
	case *services.Role:
		if err := clt.UpsertRole(ctx, r); err != nil {
			return trace.Wrap(err)
		}
		fmt.Fprintf(c.stdout, "role %q saved\n", r.Metadata.Name)
	case *services.ClusterNetworkingConfig:
		if err := clt.SetClusterNetworkingConfig(ctx, r); err != nil {
			return trace.Wrap(err)
		}
		fmt.Fprintln(c.stdout, "cluster_networking_config saved")
	case *services.TrustedCluster:
		if _, err := clt.UpsertTrustedCluster(ctx, r); err != nil {
			return trace.Wrap(err)
		}
		fmt.Fprintf(c.stdout, "trusted_cluster %q saved: this cluster trusts the root %q\n", r.Metadata.Name, r.Metadata.Name)
	case *services.OIDCConnector:
		if err := clt.UpsertOIDCConnector(ctx, r); err != nil {
			return trace.Wrap(err)
		}
		fmt.Fprintf(c.stdout, "oidc_connector %q saved\n", r.Metadata.Name)
	case *services.AuthPreference:
		if err := clt.SetAuthPreference(ctx, r); err != nil {
			return trace.Wrap(err)
		}
		fmt.Fprintf(c.stdout, "auth_preference saved: second_factor %s\n", r.Spec.SecondFactor)
	default:
		return trace.BadParameter("%s: pctl create does not handle kind %q", file, kind)
	}
	return nil
}

func (c *cli) get(ctx context.Context, kind, name, format string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	var out []any
	switch kind {
	case services.KindRole, "roles":
		if name != "" {
			r, err := clt.GetRole(ctx, name)
			if err != nil {
				return trace.Wrap(err)
			}
			out = append(out, r)
		} else {
			roles, err := clt.GetRoles(ctx)
			if err != nil {
				return trace.Wrap(err)
			}
			for _, r := range roles {
				out = append(out, r)
			}
		}
	case services.KindClusterNetworking, "networking":
		cfg, err := clt.GetClusterNetworkingConfig(ctx)
		if err != nil {
			return trace.Wrap(err)
		}
		out = append(out, cfg)
	case services.KindUser, "users":
		users, err := clt.GetUsers(ctx)
		if err != nil {
			return trace.Wrap(err)
		}
		for i := range users {
			u := users[i]
			u.PasswordHash, u.TOTPSecret = nil, ""
			if name == "" || u.Name == name {
				out = append(out, u)
			}
		}
		if name != "" && len(out) == 0 {
			return trace.NotFound("user %q not found", name)
		}
	case services.KindNode, "nodes":
		nodes, err := clt.GetNodes(ctx, "")
		if err != nil {
			return trace.Wrap(err)
		}
		for _, n := range nodes {
			if name == "" || n.UUID == name || n.Hostname == name {
				out = append(out, n)
			}
		}
		if name != "" && len(out) == 0 {
			return trace.NotFound("node %q not found", name)
		}
	case services.KindLock, "locks":
		locks, err := clt.GetLocks(ctx)
		if err != nil {
			return trace.Wrap(err)
		}
		for _, l := range locks {
			if name == "" || l.Target.User == name || l.Target.Node == name {
				out = append(out, l)
			}
		}
		if name != "" && len(out) == 0 {
			return trace.NotFound("no lock on %q", name)
		}
	case services.KindTrustedCluster, "trusted_clusters":
		tcs, err := clt.GetTrustedClusters(ctx)
		if err != nil {
			return trace.Wrap(err)
		}
		for _, tc := range tcs {
			if name == "" || tc.Metadata.Name == name {
				out = append(out, tc)
			}
		}
		if name != "" && len(out) == 0 {
			return trace.NotFound("trusted_cluster %q not found", name)
		}
	case services.KindOIDCConnector, "oidc_connectors":
		cs, err := clt.GetOIDCConnectors(ctx)
		if err != nil {
			return trace.Wrap(err)
		}
		for _, conn := range cs {
			// The API strips it already; never print a secret whatever
			// a server sends.
			conn = conn.WithoutSecrets()
			if name == "" || conn.Metadata.Name == name {
				out = append(out, conn)
			}
		}
		if name != "" && len(out) == 0 {
			return trace.NotFound("oidc_connector %q not found", name)
		}
	case services.KindAuthPreference:
		pref, err := clt.GetAuthPreference(ctx)
		if err != nil {
			if trace.IsNotFound(err) {
				return trace.NotFound("no auth_preference is set: users with a second factor must use it, others log in with the password")
			}
			return trace.Wrap(err)
		}
		out = append(out, pref)
	default:
		return trace.BadParameter("unknown kind %q: want role, user, node, lock, cluster_networking_config, trusted_cluster, oidc_connector or auth_preference", kind)
	}
	return trace.Wrap(writeResources(c.stdout, format, out))
}

func (c *cli) setNetworking(ctx context.Context, strategy, caseInsensitive, dialTimeout string) error {
	if strategy == "" && caseInsensitive == "" && dialTimeout == "" {
		return trace.BadParameter("nothing to set: give --routing-strategy, --case-insensitive-routing or --ssh-dial-timeout")
	}
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	cfg, err := clt.GetClusterNetworkingConfig(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	if strategy != "" {
		cfg.Spec.RoutingStrategy = strategy
	}
	if caseInsensitive != "" {
		cfg.Spec.CaseInsensitiveRouting = caseInsensitive == "true"
	}
	if dialTimeout != "" {
		d, err := time.ParseDuration(dialTimeout)
		if err != nil || d <= 0 {
			return trace.BadParameter("invalid --ssh-dial-timeout %q: want a positive duration like 30s", dialTimeout)
		}
		cfg.Spec.SSHDialTimeout = services.Duration(d)
	}
	if err := clt.SetClusterNetworkingConfig(ctx, cfg); err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "networking: routing_strategy=%s case_insensitive_routing=%v ssh_dial_timeout=%s\n",
		orDefault(cfg.Spec.RoutingStrategy, services.RoutingUnambiguousMatch), cfg.Spec.CaseInsensitiveRouting, cfg.Spec.SSHDialTimeout.Value())
	return nil
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// rm removes KIND/NAME. Only kinds without a command of their own are
// here (users, nodes, tokens and locks have theirs).
func (c *cli) rm(ctx context.Context, ref string) error {
	if ref == services.KindAuthPreference {
		return trace.Wrap(c.rmAuthPreference(ctx))
	}
	kind, name, ok := strings.Cut(ref, "/")
	if !ok || kind == "" || name == "" {
		return trace.BadParameter("invalid resource %q: want KIND/NAME, e.g. role/dev or trusted_cluster/root", ref)
	}
	if kind != services.KindTrustedCluster && kind != services.KindRole && kind != services.KindOIDCConnector {
		return trace.BadParameter("pctl rm does not remove kind %q: it removes role/NAME, trusted_cluster/NAME and oidc_connector/NAME (users, nodes and tokens have commands of their own)", kind)
	}
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	if kind == services.KindRole {
		// The auth server refuses the presets and a role in use, naming
		// who uses it (auth.Server.DeleteRole).
		if err := clt.DeleteRole(ctx, name); err != nil {
			return trace.Wrap(err)
		}
		fmt.Fprintf(c.stdout, "role %q removed\n", name)
		return nil
	}
	if kind == services.KindOIDCConnector {
		if err := clt.DeleteOIDCConnector(ctx, name); err != nil {
			return trace.Wrap(err)
		}
		fmt.Fprintf(c.stdout, "oidc_connector %q removed: logins through it stop now\n", name)
		return nil
	}
	if err := clt.DeleteTrustedCluster(ctx, name); err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "trusted_cluster %q removed: the root's users and CAs are no longer trusted here\n", name)
	return nil
}

func (c *cli) rmAuthPreference(ctx context.Context) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	if err := clt.DeleteAuthPreference(ctx); err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintln(c.stdout, "auth_preference removed: users with a second factor must use it, others log in with the password")
	return nil
}
