package sshproxy

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/utils"
)

// routeSubsystem serves `route:HOST[:PORT][@CLUSTER]`: how this proxy
// would route the target for this user, as text, dialing nothing. It is
// the user's view, never the admin's: only nodes the user may reach take
// part or are named, and a leaf cluster explains its own part for the
// user's certificate (its role_map and RBAC decide what it shows). That
// is why `pctl route --cluster LEAF --user NAME` goes through here with
// a certificate of NAME: a root admin is not a leaf admin. A cluster the
// user may not reach is refused like an unknown one, before the request
// is accepted (stderr, exit status 1); a route that would fail is
// explained, then ends with exit status 1.
func (h *Handler) routeSubsystem(ctx context.Context, id *authz.Identity, name string) (srv.SubsystemFunc, error) {
	rest := strings.TrimPrefix(name, proxyapi.SubsystemRoutePrefix)
	target, err := proxy.ParseProxySubsystem("proxy:" + rest)
	if err != nil {
		return nil, trace.BadParameter("invalid route subsystem request %q: expected %sHOST[:PORT][@CLUSTER] (a port, 0 for any, with @CLUSTER)", rest, proxyapi.SubsystemRoutePrefix)
	}
	if target.Port == "0" {
		// "Any port", spelled as the grammar needs it with @CLUSTER.
		target.Port = ""
	}
	e, err := h.cfg.Router.ExplainRequest(ctx, proxy.RouteRequest{
		Target: target, Access: id.CanReach, Cert: id.Cert, Source: utils.ClientAddr(ctx),
	})
	if err != nil {
		var ld *proxy.LeafDeniedError
		if errors.As(err, &ld) {
			h.emit(ctx, events.AccessDenied, id, target, "route", events.Fields{
				events.FieldReason: "leaf cluster " + strconv.Quote(ld.Cluster) + " refused the user (" + ld.Reason + ")", events.FieldRemoteCluster: ld.Cluster,
			})
		}
		return nil, trace.Wrap(err)
	}
	return func(ctx context.Context, ch ssh.Channel) error {
		if _, err := ch.Write([]byte(e.String())); err != nil {
			return trace.Wrap(err)
		}
		if e.Failed() {
			return trace.NotFound("no route to %s", target.String())
		}
		return nil
	}, nil
}
