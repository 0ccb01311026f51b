package proxy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/events"
)

// RouteAudit says who asked a front door (the SSH port or the web
// terminal) for a route. Both doors record their routing decisions
// through RouteEvent, so that one query over the audit log finds a
// refusal whichever door it came through, with the same fields.
type RouteAudit struct {
	// Method is the door: "ssh" or "web".
	Method string
	// Kind is what asked within the door: "direct-tcpip" (ssh -J),
	// "session" (psh's proxy subsystem), "terminal" (the web terminal).
	Kind string
	// User is the user's name; Login the login asked for; Logins, when
	// the door does not know which login will be used (ssh -J), the
	// logins the user may use, named in a refusal's reason instead.
	User   string
	Login  string
	Logins []string
	// RemoteAddr is the client's address, when the door has it.
	RemoteAddr string
}

// RouteEvent is the audit event for a routing decision, and false when
// it is not audited (a route to a node of this cluster, a node that does
// not exist): access.denied for a node RBAC or a leaf cluster kept from
// the user (who is told "not found"; the event says why), route.ambiguous
// with every candidate, route.leaf for a route to a leaf cluster.
func RouteEvent(a RouteAudit, target Target, route Route, err error) (events.Event, bool) {
	fields := events.Fields{
		events.FieldMethod: a.Method,
		events.FieldKind:   a.Kind,
		events.FieldTarget: target.String(),
		events.FieldLogin:  a.Login,
	}
	if a.RemoteAddr != "" {
		fields[events.FieldRemoteAddr] = a.RemoteAddr
	}
	typ := events.AccessDenied
	var ld *LeafDeniedError
	switch {
	case err == nil && route.Leaf:
		typ = events.RouteLeaf
		fields[events.FieldRemoteCluster] = route.Cluster
		fields["leaf_target"] = route.Target.String()
	case err == nil:
		return events.Event{}, false
	case errors.As(err, &ld):
		fields[events.FieldReason] = "leaf cluster " + strconv.Quote(ld.Cluster) + " refused the user (" + ld.Reason + ")"
		fields[events.FieldRemoteCluster] = ld.Cluster
	case trace.IsNotFound(err) && len(route.Hidden) > 0:
		logins := a.Logins
		if len(logins) == 0 {
			logins = []string{a.Login}
		}
		fields[events.FieldReason] = fmt.Sprintf("user %q may not reach node %s with any of the logins %v", a.User, strings.Join(route.Hidden, ", "), logins)
		fields[events.FieldCandidates] = append([]string(nil), route.Hidden...)
		fields[events.FieldServerID] = route.Hidden[0]
	case trace.IsAccessDenied(err):
		fields[events.FieldReason] = err.Error()
		if route.Node.UUID != "" {
			fields[events.FieldServerID] = route.Node.UUID
			fields[events.FieldServerHostname] = route.Node.Hostname
		}
	case IsAmbiguousHost(err):
		typ = events.RouteAmbiguous
		uuids := make([]string, 0, len(route.Candidates))
		for _, n := range route.Candidates {
			uuids = append(uuids, n.UUID)
		}
		fields[events.FieldCandidates] = uuids
	default:
		return events.Event{}, false
	}
	return events.Event{Type: typ, User: a.User, Fields: fields}, true
}
