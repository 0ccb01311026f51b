package events

import (
	"time"

	"github.com/google/uuid"
	"github.com/gravitational/trace"
)

// MaxShippedBatch bounds one batch the auth server accepts from a host:
// DefaultBatchSize with room for a shipper configured larger.
const MaxShippedBatch = 1000

// maxShippedClockSkew is how far in the future a shipped event's time may
// be before auth replaces it with its own: a node's clock may run a little
// ahead, but an event dated 2099 must not sort after every real one or
// outlive the TTL.
const maxShippedClockSkew = time.Minute

// shippable lists the event types a node or proxy produces. Anything else
// (auth.login, host.join ...) is auth's own to say: a host cannot add a
// login or a join to the record.
var shippable = map[string]bool{
	SessionStart:   true,
	SessionEnd:     true,
	AccessDenied:   true,
	RouteAmbiguous: true,
	PortForward:    true,
	AgentForward:   true,
	ConnRefused:    true,
	// A node ending a root user's connection when its cluster stops
	// trusting the root: the only record of why the shell ended.
	ConnTerminated: true,
	// A node's recording events: without them a capped or failed
	// recording is explained only in the node's own log.
	RecordingCapped: true,
	RecordingFailed: true,
	// A proxy-only host routes to leaves and serves the web player: the
	// root's record of a leaf connection and of who watched a recording
	// would otherwise stay in that proxy's own log.
	RouteLeaf:     true,
	RecordingPlay: true,
}

// shippedIDSpace is the UUID namespace of shipped events' ids.
var shippedIDSpace = uuid.MustParse("0b9f0e2e-4a57-4d7e-9c55-1f4c3a1b7e10")

// ShippedEvent is what the auth server records for an event a host
// shipped, stamped with what auth can vouch for and nothing the host can
// forge:
//   - the cluster is auth's own, whatever the event says;
//   - FieldEmitterID and FieldEmitterRole name the shipping host from its
//     client certificate, and a node's FieldServerID is its own UUID (a
//     node speaks only for itself; a proxy's server_id names the node it
//     routed to, so it is kept);
//   - the id is derived from the emitter and the host's id, so a batch
//     shipped twice (a lost answer) is recorded once, and no host can
//     overwrite another's event (or auth's) by reusing its id;
//   - a time missing or too far in the future becomes now.
//
// Types a host does not produce are refused with BadParameter.
func ShippedEvent(e Event, now time.Time, cluster, emitterID, emitterRole string) (Event, error) {
	if !shippable[e.Type] {
		return Event{}, trace.BadParameter("event type %q may not be shipped by a host", e.Type)
	}
	fields := make(Fields, len(e.Fields)+3)
	for k, v := range e.Fields {
		if !reserved(k) {
			fields[k] = v
		}
	}
	fields[FieldEmitterID] = emitterID
	fields[FieldEmitterRole] = emitterRole
	if emitterRole == "node" {
		fields[FieldServerID] = emitterID
	}
	id := uuid.NewString()
	if e.ID != "" {
		id = uuid.NewSHA1(shippedIDSpace, []byte(emitterID+"/"+e.ID)).String()
	}
	t := e.Time.UTC()
	if t.IsZero() || t.After(now.Add(maxShippedClockSkew)) {
		t = now.UTC()
	}
	return Event{Type: e.Type, Time: t, ID: id, User: e.User, Cluster: cluster, Fields: fields}, nil
}
