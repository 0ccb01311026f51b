package proxy

import (
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// TestRouteEventSameForBothDoors: the SSH port and the web terminal
// record the same refusal with the same event and fields: only the door
// (method, kind) and the client's address differ. Each refusal names
// the target, login and user; a hidden node its candidates; an ambiguous
// target every candidate; a leaf's refusal its cluster.
func TestRouteEventSameForBothDoors(t *testing.T) {
	target := Target{Host: "db", Port: "22"}
	node := services.Node{UUID: "u1", Hostname: "db"}
	cases := []struct {
		name   string
		route  Route
		err    error
		typ    string
		fields events.Fields
	}{
		{"hidden", Route{Hidden: []string{"u1", "u2"}}, trace.NotFound("node %q not found", "db"), events.AccessDenied, events.Fields{
			events.FieldCandidates: []string{"u1", "u2"}, events.FieldServerID: "u1",
			events.FieldReason: `user "bob" may not reach node u1, u2 with any of the logins [root]`,
		}},
		{"login refused", Route{Node: node}, trace.AccessDenied("login root refused"), events.AccessDenied, events.Fields{
			events.FieldServerID: "u1", events.FieldServerHostname: "db", events.FieldReason: "login root refused",
		}},
		{"ambiguous", Route{Candidates: []services.Node{node, {UUID: "u2"}}}, &AmbiguousHostError{Host: "db"}, events.RouteAmbiguous, events.Fields{
			events.FieldCandidates: []string{"u1", "u2"},
		}},
		{"leaf refused", Route{}, &LeafDeniedError{Cluster: "leaf", Reason: "no role maps"}, events.AccessDenied, events.Fields{
			events.FieldRemoteCluster: "leaf", events.FieldReason: `leaf cluster "leaf" refused the user (no role maps)`,
		}},
		{"leaf route", Route{Leaf: true, Cluster: "leaf", Target: Target{Host: "db", Port: "22"}}, nil, events.RouteLeaf, events.Fields{
			events.FieldRemoteCluster: "leaf", "leaf_target": "db:22",
		}},
	}
	doors := []RouteAudit{
		{Method: "ssh", Kind: "direct-tcpip", User: "bob", Login: "root", Logins: []string{"root"}},
		{Method: "web", Kind: "terminal", User: "bob", Login: "root", RemoteAddr: "192.0.2.1:5000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []events.Event
			for _, door := range doors {
				ev, ok := RouteEvent(door, target, c.route, c.err)
				require.True(t, ok)
				require.Equal(t, c.typ, ev.Type)
				require.Equal(t, "bob", ev.User)
				want := events.Fields{events.FieldMethod: door.Method, events.FieldKind: door.Kind, events.FieldTarget: "db:22", events.FieldLogin: "root"}
				if door.RemoteAddr != "" {
					want[events.FieldRemoteAddr] = door.RemoteAddr
				}
				for k, v := range c.fields {
					want[k] = v
				}
				require.Equal(t, want, ev.Fields)
				got = append(got, ev)
			}
			for _, f := range []string{events.FieldMethod, events.FieldKind, events.FieldRemoteAddr} {
				delete(got[0].Fields, f)
				delete(got[1].Fields, f)
			}
			require.Equal(t, got[0], got[1], "both doors, the same record")
		})
	}
	_, ok := RouteEvent(doors[0], target, Route{Node: node}, nil)
	require.False(t, ok, "a route within the cluster is not a decision to audit")
	_, ok = RouteEvent(doors[0], target, Route{}, trace.NotFound("node %q not found", "db"))
	require.False(t, ok, "a node that does not exist: nothing to audit")
}
