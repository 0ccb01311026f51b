package sshproxy

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/utils"
)

// NodeLister lists the nodes of a cluster.
type NodeLister = authz.NodeLister

// nodesSubsystem serves SubsystemNodes for the local cluster.
func (h *Handler) nodesSubsystem(id *authz.Identity) (srv.SubsystemFunc, error) {
	if h.cfg.Nodes == nil {
		return nil, trace.NotImplemented("this proxy does not list nodes")
	}
	return func(ctx context.Context, ch ssh.Channel) error {
		entries, err := authz.ListNodes(ctx, h.cfg.Nodes, id, h.cfg.Router.ClusterName())
		if err != nil {
			return trace.Wrap(err)
		}
		h.cfg.Router.NodeStatuses(entries)
		data, err := json.Marshal(entries)
		if err != nil {
			return trace.Wrap(err)
		}
		_, err = ch.Write(data)
		return trace.Wrap(err)
	}, nil
}

// leafNodesSubsystem serves `nodes@LEAF`: the nodes the leaf lets this
// user see, as the leaf's RBAC decides; a cluster the user may not reach
// reads like an unknown one. Asked before the request is accepted, so an
// error is the subsystem's refusal (stderr, exit status 1).
func (h *Handler) leafNodesSubsystem(ctx context.Context, id *authz.Identity, cluster string) (srv.SubsystemFunc, error) {
	entries, err := h.cfg.Router.LeafNodes(ctx, cluster, id.Cert, utils.ClientAddr(ctx))
	if err != nil {
		var ld *proxy.LeafDeniedError
		if errors.As(err, &ld) {
			h.emit(ctx, events.AccessDenied, id, proxy.Target{Cluster: cluster}, "nodes", events.Fields{
				events.FieldReason: "leaf cluster " + strconv.Quote(ld.Cluster) + " refused the user (" + ld.Reason + ")", events.FieldRemoteCluster: ld.Cluster,
			})
		}
		return nil, trace.Wrap(err)
	}
	return func(ctx context.Context, ch ssh.Channel) error {
		data, err := json.Marshal(entries)
		if err != nil {
			return trace.Wrap(err)
		}
		_, err = ch.Write(data)
		return trace.Wrap(err)
	}, nil
}
