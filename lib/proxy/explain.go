package proxy

import (
	"context"
	"strings"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// Explanation is a routing decision in a form `pctl route` prints (String)
// or emits as JSON: the candidates, the choice and why, or why none.
type Explanation struct {
	// Target is the target as requested, HOST[:PORT][@CLUSTER].
	Target string `json:"target"`
	// Resolved is the target after NAME.CLUSTER resolution.
	Resolved string `json:"resolved"`
	// Cluster is the cluster the target was looked up in.
	Cluster string `json:"cluster"`
	// Strategy is the routing strategy in force.
	Strategy string `json:"routing_strategy"`
	// Candidates are the nodes that matched host and port.
	Candidates []services.Node `json:"candidates"`
	// Chosen is the node a connection would go to; nil when none.
	Chosen *services.Node `json:"chosen,omitempty"`
	// Reason says why Chosen was chosen.
	Reason string `json:"reason,omitempty"`
	// Via says how the chosen node would be dialed (a tunnel on this
	// proxy, waiting for one, or its registered address).
	Via string `json:"via,omitempty"`
	// Error is what a connection would fail with.
	Error string `json:"error,omitempty"`
	// Leaf marks a target in a leaf cluster: this cluster decides only
	// which tunnel it goes over (Via); the leaf's Router picks the node.
	Leaf bool `json:"leaf,omitempty"`
	// LeafRoute is the leaf's own explanation, as text, for the user
	// who asked (ExplainRequest); empty when the leaf was not asked.
	// It is the leaf's word: escaped when printed.
	LeafRoute string `json:"leaf_route,omitempty"`
	// LeafFailed: the leaf says the route would fail there.
	LeafFailed bool `json:"leaf_failed,omitempty"`
}

// NewExplanation describes a successful Route.
func NewExplanation(route Route) Explanation {
	e := Explanation{
		Resolved:   route.Target.String(),
		Cluster:    route.Cluster,
		Strategy:   route.Strategy,
		Candidates: route.Candidates,
		Reason:     route.Reason,
	}
	e.Target = e.Resolved
	if route.Node.UUID != "" {
		n := route.Node
		e.Chosen = &n
	}
	if e.Candidates == nil {
		e.Candidates = []services.Node{}
	}
	return e
}

// Explain renders a successful Route for humans.
func Explain(route Route) string {
	return NewExplanation(route).String()
}

// ExplainTarget routes t without dialing and explains the outcome, failed
// or not: the body of `pctl route`. It is the admin view: every node takes
// part, whoever may reach it.
func (r *Router) ExplainTarget(ctx context.Context, t Target) Explanation {
	e, _, _ := r.explain(ctx, t, nil)
	return e
}

// ExplainFor is ExplainTarget as a caller whose access is filter sees it:
// only nodes filter lets through take part or are named (as Route's
// candidates), and a route that fails because of what filter hid reads
// like a node that does not exist (HideDenied). It is what a leaf answers
// a root user's LeafKindRoute request with.
func (r *Router) ExplainFor(ctx context.Context, t Target, filter AccessFilter) Explanation {
	if filter == nil {
		// nil would be the admin view: a caller without access sees
		// nothing.
		filter = func(services.Node) bool { return false }
	}
	e, _, _ := r.explain(ctx, t, filter)
	return e
}

// explain routes t for filter (nil: the admin view) and explains it; the
// route and the (visible) routing error are returned too.
func (r *Router) explain(ctx context.Context, t Target, filter AccessFilter) (Explanation, Route, error) {
	route, err := r.Route(ctx, t, filter)
	if filter != nil {
		err, _ = HideDenied(t, route, err)
	}
	e := NewExplanation(route)
	e.Target = t.String()
	if e.Cluster == "" {
		e.Cluster = t.Cluster
		if e.Cluster == "" {
			e.Cluster = r.cfg.ClusterName
		}
	}
	if e.Resolved == "" {
		e.Resolved = e.Target
	}
	if err != nil {
		e.Error = trace.UserMessage(err)
		e.Chosen = nil
		e.Reason = ""
	} else if e.Chosen != nil {
		e.Via = r.Via(*e.Chosen)
	} else if route.Leaf {
		e.Leaf = true
		e.Via = r.leafVia(route.Cluster)
	}
	return e, route, err
}

// ExplainRequest explains how req would route for its caller (the
// `route:` subsystem): the local cluster among the nodes req.Access lets
// the caller reach (ExplainFor); a leaf cluster with the root's part
// (over which tunnel) and the leaf's own explanation for req.Cert, asked
// over the leaf's tunnel (LeafKindRoute: the leaf's Router, inventory and
// routing_strategy, among what the leaf's RBAC lets the mapped roles
// see). It dials no node.
//
// Which clusters exist is told exactly as routing tells it: an unknown
// cluster, and a leaf that refuses the caller, are the error `cluster
// "X" not found` for `@X`; for HOST.X the local miss's explanation
// (what an unknown suffix gives). A leaf without a live tunnel is
// `cluster "X" is offline` only to a certificate it accepted recently.
func (r *Router) ExplainRequest(ctx context.Context, req RouteRequest) (Explanation, error) {
	access := req.Access
	if access == nil {
		access = func(services.Node) bool { return false }
	}
	e, route, err := r.explain(ctx, req.Target, access)
	if off := r.offlineLeafError(ctx, req.Target, req.Cert, err); off != nil {
		return Explanation{}, off
	}
	if err != nil && route.Cluster == "" {
		// The cluster did not resolve: no explanation of a cluster that
		// is not one (the same refusal as a leaf's).
		return Explanation{}, trace.Wrap(err)
	}
	if !e.Leaf {
		return e, nil
	}
	return r.explainLeaf(ctx, req, e, route)
}

// Failed reports whether the explained route would fail (here or, for a
// leaf, in the leaf).
func (e Explanation) Failed() bool { return e.Error != "" || e.LeafFailed }

// String renders the explanation as a few aligned lines.
func (e Explanation) String() string {
	var b strings.Builder
	b.WriteString("target:     " + e.Target)
	if r := strings.TrimSuffix(e.Resolved, "@"+e.Cluster); r != "" && r != e.Target && e.Resolved != e.Target {
		b.WriteString(" (resolved to " + e.Resolved + ")")
	}
	b.WriteString("\ncluster:    " + e.Cluster)
	if e.Strategy != "" && !e.Leaf {
		// A leaf's target is routed under the leaf's strategy, not
		// this cluster's.
		b.WriteString("\nstrategy:   " + e.Strategy)
	}
	b.WriteString("\ncandidates: ")
	if e.Leaf && e.LeafRoute != "" {
		b.WriteString("decided in the leaf cluster by its own Router, inventory, RBAC and routing_strategy (its explanation below)")
	} else if e.Leaf {
		b.WriteString("decided in the leaf cluster by its own Router, inventory, RBAC and routing_strategy (`pctl route --user NAME` explains it for that user)")
	} else if len(e.Candidates) == 0 {
		b.WriteString("none")
	}
	for _, n := range e.Candidates {
		mark := "  "
		if e.Chosen != nil && e.Chosen.UUID == n.UUID {
			mark = "* "
		}
		b.WriteString("\n  " + mark + services.EscapeText(n.Hostname) + " " + CandidateLine(n))
	}
	if e.Leaf {
		b.WriteString("\nreason:     " + e.Reason)
		b.WriteString("\nvia:        " + e.Via)
	}
	if e.Chosen != nil {
		b.WriteString("\nchosen:     " + services.EscapeText(e.Chosen.UUID) + " (" + services.EscapeText(e.Chosen.Hostname) + ", " + services.EscapeText(addrOrTunnel(*e.Chosen)) + ")")
		b.WriteString("\nreason:     " + e.Reason)
		if e.Via != "" {
			b.WriteString("\nvia:        " + e.Via)
		}
	}
	if e.Error != "" {
		b.WriteString("\nerror:      " + strings.ReplaceAll(e.Error, "\n", "\n            "))
	}
	b.WriteString("\n")
	if e.Leaf && e.LeafRoute != "" {
		// The leaf's text, escaped line by line: a leaf must not drive
		// the root user's terminal.
		b.WriteString("in leaf cluster " + services.EscapeText(e.Cluster) + ":\n")
		for _, line := range strings.Split(strings.TrimRight(e.LeafRoute, "\n"), "\n") {
			b.WriteString("  " + services.EscapeText(line) + "\n")
		}
	}
	return b.String()
}

// addrOrTunnel is a node's address, or "tunnel" for a tunnel-only node.
func addrOrTunnel(n services.Node) string {
	if n.Tunnel {
		return "tunnel"
	}
	return n.Addr
}
