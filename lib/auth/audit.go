package auth

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net/http"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
)

// shipEvents records a batch a node or proxy shipped. Each event is
// stamped by events.ShippedEvent with what auth vouches for (the cluster
// name, the emitter's UUID and role from its certificate); an event of a
// type hosts do not produce is refused alone, so one bad event does not
// cost the rest of its batch.
//
// The batch is answered only once the backend has stored it (the audit
// log's events.Storer): the host drops its copy on a 200, so a batch
// acknowledged while only queued here was lost with this process or
// during a backend outage. When the backend does not take it in time the
// answer is a ConnectionProblem (503), which the host retries, never a
// refusal it would drop the batch for; the retry is recorded once
// (ShippedEvent derives the same ids).
func (a *APIServer) shipEvents(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var req authapi.ShipEventsRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	if len(req.Events) > events.MaxShippedBatch {
		return nil, trace.BadParameter("%d events in one batch: at most %d", len(req.Events), events.MaxShippedBatch)
	}
	now := a.auth.clock.Now()
	var resp authapi.ShipEventsResponse
	var firstErr error
	stamped := make([]events.Event, 0, len(req.Events))
	for _, e := range req.Events {
		s, err := events.ShippedEvent(e, now, a.auth.cfg.ClusterName, p.ID, p.Role)
		if err != nil {
			resp.Refused++
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		stamped = append(stamped, s)
		resp.Accepted++
	}
	if firstErr != nil {
		a.log.WithError(firstErr).WithFields(logrus.Fields{"peer": p.ID, "role": p.Role, "refused": resp.Refused}).
			Warn("Refused audit events a host shipped.")
	}
	if len(stamped) == 0 {
		return resp, nil
	}
	if st, ok := a.auth.cfg.Audit.(events.Storer); ok {
		if err := st.Store(ctx, stamped); err != nil {
			return nil, trace.ConnectionProblem(err, "audit events not stored; ship them again: %v", trace.UserMessage(err))
		}
		return resp, nil
	}
	// An emitter that stores nothing (tests' Recorder, Discard).
	for _, e := range stamped {
		a.auth.cfg.Audit.Emit(ctx, e)
	}
	return resp, nil
}

// ShipEvents sends a batch of audit events to auth (node and proxy
// identities only); it is the events.Shipper of processes without the
// auth role.
func (c *Client) ShipEvents(ctx context.Context, es []events.Event) error {
	return trace.Wrap(c.do(ctx, http.MethodPost, "/v1/events", nil, authapi.ShipEventsRequest{Events: es}, nil))
}

var _ events.Shipper = (*Client)(nil)

// emitJoin records a join attempt: host.join with the UUID auth certified
// (read from the issued certificate, whoever chose it), or
// host.join.failed with the reason. The token is never recorded: it is a
// credential.
func (a *APIServer) emitJoin(ctx context.Context, r *http.Request, req *authapi.RegisterRequest, out any, err error) {
	fields := events.Fields{
		events.FieldRemoteAddr: r.RemoteAddr,
		events.FieldRole:       req.Role,
		events.FieldHostname:   req.Hostname,
		events.FieldMethod:     "token",
	}
	if req.UUID != "" {
		// Hosts no longer send a UUID (auth assigns it): one that does is
		// an old binary or someone trying to take a node's identity.
		fields["requested_uuid"] = req.UUID
	}
	typ := events.HostJoin
	if err != nil {
		typ = events.HostJoinFailed
		fields[events.FieldReason] = trace.UserMessage(err)
	} else if resp, ok := out.(*authapi.RegisterResponse); ok {
		fields[events.FieldServerID] = certCommonName(resp.TLSCert)
	}
	a.auth.cfg.Audit.Emit(ctx, events.Event{Type: typ, Fields: fields})
}

// certCommonName is the CN (the host UUID) of a PEM certificate, "" when
// it cannot be read.
func certCommonName(certPEM []byte) string {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return ""
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return ""
	}
	return cert.Subject.CommonName
}

// emitAPIDenied records an auth API call refused to a host: an endpoint
// its role may not call, a write outside its own identity, or a
// heartbeat's name or labels (extra fields, such as the hostname asked
// for, go with it).
func (a *APIServer) emitAPIDenied(ctx context.Context, p *peer, r *http.Request, endpoint string, err error, extra events.Fields) {
	fields := events.Fields{
		events.FieldServerID:   p.ID,
		events.FieldRole:       p.Role,
		events.FieldEndpoint:   endpoint,
		events.FieldRemoteAddr: r.RemoteAddr,
		events.FieldReason:     trace.UserMessage(err),
	}
	for k, v := range extra {
		fields[k] = v
	}
	a.auth.cfg.Audit.Emit(ctx, events.Event{Type: events.APIDenied, Fields: fields})
}

// audited records the AccessDenied answers of a host-facing endpoint as
// api.denied: a node that tries to announce another node is an attack,
// not a typo, and belongs in the audit log, not just the process log.
func (a *APIServer) audited(endpoint string, h apiHandler) apiHandler {
	return func(ctx context.Context, p *peer, r *http.Request) (any, error) {
		out, err := h(ctx, p, r)
		if err != nil && trace.IsAccessDenied(err) {
			a.emitAPIDenied(ctx, p, r, endpoint, err, nil)
		}
		return out, err
	}
}
