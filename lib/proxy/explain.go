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
	route, err := r.Route(ctx, t, nil)
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
	return e
}

// leafVia says over which tunnel a leaf is reached from here.
func (r *Router) leafVia(leaf string) string {
	if r.cfg.Leaves == nil {
		// pctl route: no tunnels of its own.
	} else if _, ok := r.cfg.Leaves.LeafName(leaf); ok {
		return "the leaf's tunnel on this proxy"
	}
	if holders := r.peerHolders(services.LeafTunnelID(leaf)); len(holders) > 0 {
		return "the leaf's tunnel on proxy " + strings.Join(holders, ", ")
	}
	return "the leaf's tunnel (none is up now)"
}

// String renders the explanation as a few aligned lines.
func (e Explanation) String() string {
	var b strings.Builder
	b.WriteString("target:     " + e.Target)
	if r := strings.TrimSuffix(e.Resolved, "@"+e.Cluster); r != "" && r != e.Target && e.Resolved != e.Target {
		b.WriteString(" (resolved to " + e.Resolved + ")")
	}
	b.WriteString("\ncluster:    " + e.Cluster)
	if e.Strategy != "" {
		b.WriteString("\nstrategy:   " + e.Strategy)
	}
	b.WriteString("\ncandidates: ")
	if e.Leaf {
		b.WriteString("decided in the leaf cluster by its own Router, inventory, RBAC and routing_strategy (`pctl route` there explains it)")
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
	return b.String()
}

// addrOrTunnel is a node's address, or "tunnel" for a tunnel-only node.
func addrOrTunnel(n services.Node) string {
	if n.Tunnel {
		return "tunnel"
	}
	return n.Addr
}
