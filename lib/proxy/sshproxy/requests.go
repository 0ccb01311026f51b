package sshproxy

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
)

// AccessRequests is the auth server's access request API; the proxy's
// auth client is one. Every call carries the user's certificate, so auth
// decides for the user the certificate names, not for whom the proxy says.
type AccessRequests interface {
	CreateAccessRequest(ctx context.Context, req authapi.AccessRequestCreate) (*services.AccessRequest, error)
	ListAccessRequests(ctx context.Context, userCert []byte) ([]services.AccessRequest, error)
	GetAccessRequest(ctx context.Context, userCert []byte, id string) (*services.AccessRequest, error)
	ReviewAccessRequest(ctx context.Context, req authapi.AccessRequestReview) (*services.AccessRequest, error)
	AccessRequestCert(ctx context.Context, req authapi.AccessRequestCert) ([]byte, error)
}

// accessRequestSubsystem serves `access-request:{JSON}`: the operation runs
// before the request is accepted, so a refusal (a role not requestable,
// a request one may not see) is the subsystem's refusal, with the reason.
func (h *Handler) accessRequestSubsystem(ctx context.Context, id *authz.Identity, name string) (srv.SubsystemFunc, error) {
	if h.cfg.Requests == nil {
		return nil, trace.NotImplemented("this proxy does not serve access requests")
	}
	if id.RemoteRoles != nil || id.Cert == nil {
		return nil, trace.AccessDenied("access requests are made in your own cluster")
	}
	op, err := proxyapi.ParseAccessRequestOp(strings.TrimPrefix(name, proxyapi.SubsystemAccessRequestPrefix))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	userCert := ssh.MarshalAuthorizedKey(id.Cert)
	var out any
	switch op.Op {
	case proxyapi.AccessRequestOpCreate:
		var ttl time.Duration
		if op.TTL != "" {
			if ttl, err = time.ParseDuration(op.TTL); err != nil {
				return nil, trace.BadParameter("ttl %q: %v", op.TTL, err)
			}
		}
		out, err = h.cfg.Requests.CreateAccessRequest(ctx, authapi.AccessRequestCreate{UserCert: userCert, Roles: op.Roles, Reason: op.Reason, TTL: services.Duration(ttl)})
	case proxyapi.AccessRequestOpList:
		out, err = h.cfg.Requests.ListAccessRequests(ctx, userCert)
	case proxyapi.AccessRequestOpShow:
		out, err = h.cfg.Requests.GetAccessRequest(ctx, userCert, op.ID)
	case proxyapi.AccessRequestOpReview:
		out, err = h.cfg.Requests.ReviewAccessRequest(ctx, authapi.AccessRequestReview{UserCert: userCert, ID: op.ID, State: op.State, Reason: op.Reason})
	case proxyapi.AccessRequestOpCert:
		var cert []byte
		cert, err = h.cfg.Requests.AccessRequestCert(ctx, authapi.AccessRequestCert{UserCert: userCert, ID: op.ID, PublicKey: op.PublicKey})
		out = proxyapi.AccessRequestCertAnswer{Cert: cert}
	}
	if err != nil {
		return nil, trace.Wrap(err)
	}
	data, err := json.Marshal(out)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return func(ctx context.Context, ch ssh.Channel) error {
		_, err := ch.Write(data)
		return trace.Wrap(err)
	}, nil
}
