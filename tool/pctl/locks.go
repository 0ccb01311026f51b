package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/services"
)

func (c *cli) registerLocks(app *kingpin.Application, add adder) {
	var user, node, message string
	var ttl time.Duration
	lk := app.Command("lock", "Cut a user's or a node's access now: every proxy and node refuses it within seconds and ends its open connections.")
	lk.Flag("user", "User to lock.").StringVar(&user)
	lk.Flag("node", "Node to lock: its UUID or its (unique) hostname.").StringVar(&node)
	lk.Flag("ttl", "Lift the lock by itself after this long, e.g. 1h (default: until pctl unlock).").DurationVar(&ttl)
	lk.Flag("message", "Reason shown to the locked-out users.").StringVar(&message)
	add(lk, func(ctx context.Context) error { return c.lock(ctx, user, node, message, ttl) })

	var uuser, unode string
	ul := app.Command("unlock", "Lift a lock.")
	ul.Flag("user", "User to unlock.").StringVar(&uuser)
	ul.Flag("node", "Node to unlock: its UUID or its (unique) hostname.").StringVar(&unode)
	add(ul, func(ctx context.Context) error { return c.unlock(ctx, uuser, unode) })

	locks := app.Command("locks", "Inspect locks.")
	var lsFormat string
	ll := locks.Command("ls", "List the locks in force.")
	listFormatFlag(ll, &lsFormat)
	add(ll, func(ctx context.Context) error { return c.locksLs(ctx, lsFormat) })
}

// oneTarget checks that exactly one of --user and --node was given.
func oneTarget(user, node string) error {
	if (user == "") == (node == "") {
		return trace.BadParameter("give exactly one of --user or --node")
	}
	return nil
}

func (c *cli) lock(ctx context.Context, user, node, message string, ttl time.Duration) error {
	if err := oneTarget(user, node); err != nil {
		return trace.Wrap(err)
	}
	if ttl < 0 {
		return trace.BadParameter("--ttl must be positive")
	}
	// Validate before connecting: a bad name or message is reported
	// without touching the cluster.
	check := services.Lock{Target: services.LockTarget{User: user, Node: node}, Message: message}
	if err := check.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	target := services.LockTarget{User: user}
	label := fmt.Sprintf("user %q", user)
	if node != "" {
		n, err := resolveNode(ctx, clt, node)
		if err != nil {
			return trace.Wrap(err)
		}
		target = services.LockTarget{Node: n.UUID}
		label = nodeLabel(*n)
	}
	l, err := clt.UpsertLock(ctx, authapi.LockRequest{Target: target, Message: message, TTL: services.Duration(ttl)})
	if err != nil {
		return trace.Wrap(err)
	}
	until := "until `pctl unlock`"
	if !l.Expires.IsZero() {
		until = "until " + l.Expires.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(c.stdout, "Locked %s %s.\n", label, until)
	if l.Message != "" {
		fmt.Fprintf(c.stdout, "Message: %s\n", l.Message)
	}
	fmt.Fprintln(c.stdout, "Every proxy and node refuses it within seconds and ends its open connections.")
	return nil
}

func (c *cli) unlock(ctx context.Context, user, node string) error {
	if err := oneTarget(user, node); err != nil {
		return trace.Wrap(err)
	}
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	target := services.LockTarget{User: user}
	label := fmt.Sprintf("user %q", user)
	if node != "" {
		target, label, err = nodeLockTarget(ctx, clt, node)
		if err != nil {
			return trace.Wrap(err)
		}
	}
	if err := clt.DeleteLock(ctx, target); err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "Unlocked %s.\n", label)
	return nil
}

// nodeLockTarget finds what `unlock --node N` means: a lock on UUID N
// (the node may have left the inventory since), else the node N names.
func nodeLockTarget(ctx context.Context, clt *auth.Client, node string) (services.LockTarget, string, error) {
	locks, err := clt.GetLocks(ctx)
	if err != nil {
		return services.LockTarget{}, "", trace.Wrap(err)
	}
	for _, l := range locks {
		if l.Target.Node == node {
			return l.Target, fmt.Sprintf("node %q", node), nil
		}
	}
	n, err := resolveNode(ctx, clt, node)
	if err != nil {
		return services.LockTarget{}, "", trace.Wrap(err)
	}
	return services.LockTarget{Node: n.UUID}, nodeLabel(*n), nil
}

// resolveNode finds the one node whose UUID or hostname is name. Locks
// name UUIDs: a hostname is the node's own choice and may be shared, so
// an ambiguous one is refused with the candidates.
func resolveNode(ctx context.Context, clt *auth.Client, name string) (*services.Node, error) {
	nodes, err := clt.GetNodes(ctx, "")
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var byName []services.Node
	for _, n := range nodes {
		if n.UUID == name {
			return &n, nil
		}
		if n.Hostname == name {
			byName = append(byName, n)
		}
	}
	switch len(byName) {
	case 0:
		return nil, trace.NotFound("no node has the UUID or hostname %q (see pctl nodes ls)", name)
	case 1:
		return &byName[0], nil
	}
	uuids := make([]string, 0, len(byName))
	for _, n := range byName {
		uuids = append(uuids, n.UUID)
	}
	sort.Strings(uuids)
	return nil, trace.BadParameter("hostname %q is ambiguous: %d nodes have it (%s); give the UUID", name, len(byName), strings.Join(uuids, ", "))
}

func nodeLabel(n services.Node) string {
	if n.Hostname != "" && n.Hostname != n.UUID {
		return fmt.Sprintf("node %q (%s)", n.Hostname, n.UUID)
	}
	return fmt.Sprintf("node %q", n.UUID)
}

func (c *cli) locksLs(ctx context.Context, format string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	locks, err := clt.GetLocks(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(writeList(c.stdout, format, locks, func() error {
		if len(locks) == 0 {
			fmt.Fprintln(c.stdout, "No locks.")
			return nil
		}
		tw := services.NewTable(c.stdout, "TARGET", "MESSAGE", "EXPIRES", "CREATED BY", "CREATED")
		for _, l := range locks {
			expires := "never"
			if !l.Expires.IsZero() {
				expires = l.Expires.UTC().Format(time.RFC3339)
			}
			tw.Row(l.Target, orDefault(l.Message, "-"), expires, orDefault(l.CreatedBy, "-"), l.Created.UTC().Format(time.RFC3339))
		}
		return tw.Flush()
	}))
}

// warnLocked tells the admin who (re)creates a user that a lock still
// holds the name, typically the lock of an earlier deletion: lifting it
// also revives that account's unexpired certificates, so it is left to
// the admin to decide.
func (c *cli) warnLocked(ctx context.Context, clt *auth.Client, user string) {
	locks, err := clt.GetLocks(ctx)
	if err != nil {
		return
	}
	for _, l := range locks {
		if l.Target.User == user {
			fmt.Fprintf(c.stdout, "Note: user %q is locked (%s) until %s: it cannot log in until then or until `pctl unlock --user %s`, which also revives certificates issued to an earlier account of that name.\n",
				user, orDefault(l.Message, "no message"), lockExpiry(l), user)
		}
	}
}

func lockExpiry(l services.Lock) string {
	if l.Expires.IsZero() {
		return "unlocked"
	}
	return l.Expires.UTC().Format(time.RFC3339)
}
