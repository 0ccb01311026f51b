package proxy

// Cluster resolution: the first step of every request, and the only one
// that reads `@CLUSTER` and routing rule 0 (NAME.CLUSTER). What follows
// it is one of two paths that never meet again: the local cluster's
// inventory (router.go, routerdial.go) or the leaf's own Router
// (leafroute.go). Keeping the decision here, made once, is what lets a
// new way of reaching a local node be one more local case instead of
// one more check threaded through both paths.

import (
	"context"
	"strings"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/services"
)

// resolved is a target whose cluster is decided.
type resolved struct {
	// asked is the target as requested, for what the user is told.
	asked Target
	// target is the target to route in its cluster: Cluster is the
	// resolved cluster name, Host has a NAME.CLUSTER suffix removed.
	target Target
	// leaf: target.Cluster is a leaf cluster, whose Router decides the
	// rest; false: the local cluster.
	leaf bool
	// suffixNote says how rule 0 rewrote the host ("web.c resolved to
	// web in cluster c; "), the start of the route's Reason; empty when
	// the host carried no cluster suffix.
	suffixNote string
}

// resolve decides target t's cluster: `@CLUSTER` (the local cluster
// exactly, or a leaf reachable from this proxy in any case), else rule 0
// on the host, else the local cluster. Errors: `cluster "C" not found`
// (NotFound, counted), and a missing host (BadParameter).
func (r *Router) resolve(t Target) (resolved, error) {
	c := t.Cluster
	if c == "" {
		c = r.cfg.ClusterName
	}
	cluster, ok := r.resolveCluster(c)
	if !ok {
		r.metrics.notFound.Inc()
		return resolved{}, clusterNotFound(c)
	}
	if t.Host == "" {
		return resolved{}, trace.BadParameter("missing host in target %q", t.String())
	}
	res := resolved{asked: t, target: Target{Host: t.Host, Port: t.Port, Cluster: cluster}}
	if cluster != r.cfg.ClusterName {
		// `@LEAF`: the leaf's own Router applies rules 0-6 there (its
		// own NAME.LEAF included).
		res.leaf = true
		return res, nil
	}
	// Rule 0: NAME.CLUSTER always means NAME in CLUSTER. There is no
	// exception for a node literally called NAME.CLUSTER: joins and
	// heartbeats refuse such hostnames, and an exception would let a node
	// capture the name `psh config` and host certificates rely on.
	if name, cluster, ok := r.splitClusterSuffix(t.Host); ok {
		res.target.Host, res.target.Cluster = name, cluster
		res.suffixNote = t.Host + " resolved to " + name + " in cluster " + cluster + "; "
	} else if name, leaf, ok := r.splitLeafSuffix(t.Host); ok {
		res.target.Host, res.target.Cluster, res.leaf = name, leaf, true
		res.suffixNote = t.Host + " resolved to " + name + " in cluster " + leaf + "; "
	}
	return res, nil
}

// resolveCluster returns the cluster name c means: the local cluster
// (exactly), or a leaf reachable from this proxy (any case: a tunnel
// here or on a peer). false: not a cluster this proxy routes to.
func (r *Router) resolveCluster(c string) (string, bool) {
	if c == r.cfg.ClusterName {
		return c, true
	}
	return r.leafName(c)
}

// leafName resolves name to a leaf with a live tunnel on this proxy or a
// peer.
func (r *Router) leafName(name string) (string, bool) {
	if r.cfg.Leaves == nil || name == "" || strings.EqualFold(name, r.cfg.ClusterName) {
		return "", false
	}
	if n, ok := r.cfg.Leaves.LeafName(name); ok {
		return n, true
	}
	if len(r.peerHolders(services.LeafTunnelID(name))) > 0 {
		return strings.ToLower(name), true
	}
	return "", false
}

// splitClusterSuffix splits NAME.CLUSTER for the local CLUSTER. The
// suffix compares case-insensitively: OpenSSH lower-cases the host it is
// given, so `ssh web.MyCluster` arrives as "web.mycluster".
func (r *Router) splitClusterSuffix(host string) (name, cluster string, ok bool) {
	c := r.cfg.ClusterName
	if len(host) < len(c)+2 {
		return "", "", false
	}
	name, suffix := host[:len(host)-len(c)-1], host[len(host)-len(c)-1:]
	if suffix[0] != '.' || !strings.EqualFold(suffix[1:], c) {
		return "", "", false
	}
	return name, c, true
}

// splitLeafSuffix splits NAME.LEAF for a leaf reachable from this proxy,
// preferring the longest leaf name (cluster names may hold dots).
func (r *Router) splitLeafSuffix(host string) (name, cluster string, ok bool) {
	if r.cfg.Leaves == nil {
		return "", "", false
	}
	for i := 1; i < len(host)-1; i++ {
		if host[i] != '.' {
			continue
		}
		if c, ok := r.leafName(host[i+1:]); ok {
			return host[:i], c, true
		}
	}
	return "", "", false
}

// offlineLeafError is what a routing miss (NotFound) becomes in the one
// case a user may be told more than "not found": t meant a leaf (`@X`,
// or HOST.X in the local cluster) that exists, has no live tunnel here or
// on a peer, and accepted cert recently (leafSeen); then it is `cluster
// "X" is offline`. nil otherwise: the miss stands. It runs only on a
// miss, so routing never reads the remote cluster list.
func (r *Router) offlineLeafError(ctx context.Context, t Target, cert *ssh.Certificate, err error) error {
	if err == nil || !trace.IsNotFound(err) {
		return nil
	}
	if leaf, ok := r.offlineLeaf(ctx, t, cert); ok {
		return trace.ConnectionProblem(nil, "cluster %q is offline", leaf)
	}
	return nil
}

// offlineLeaf returns the leaf cluster a failed route meant, when that
// leaf exists, has no live tunnel here or on a peer, and accepted cert
// recently.
func (r *Router) offlineLeaf(ctx context.Context, t Target, cert *ssh.Certificate) (string, bool) {
	if cert == nil || r.cfg.Leaves == nil || r.cfg.RemoteClusters == nil {
		return "", false
	}
	rcs, err := r.cfg.RemoteClusters(ctx)
	if err != nil {
		return "", false
	}
	for _, rc := range rcs {
		named := strings.EqualFold(t.Cluster, rc.Name)
		if t.Cluster == "" || t.Cluster == r.cfg.ClusterName {
			lh, lc := strings.ToLower(t.Host), "."+strings.ToLower(rc.Name)
			named = strings.HasSuffix(lh, lc) && len(lh) > len(lc)
		}
		if !named {
			continue
		}
		if _, live := r.leafName(rc.Name); !live && r.seenRecently(cert, rc.Name) {
			return rc.Name, true
		}
	}
	return "", false
}

func clusterNotFound(c string) error { return clusterNotFoundErr(c) }

func clusterNotFoundErr(c string) *trace.NotFoundError {
	return &trace.NotFoundError{Message: "cluster " + quoteHost(c) + " not found"}
}
