package auth

import (
	"context"
	"net/http"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// registerAccessRequestRoutes adds the access request endpoints. Users
// reach them through a proxy, which passes the user's certificate (auth
// acts for the user it names, see requestViewerFor); pctl as an admin
// identity lists, shows and reviews. Creating and turning a request into a
// certificate are a user's alone.
func (a *APIServer) registerAccessRequestRoutes() {
	const proxy, admin = RoleProxy, RoleAdmin
	a.handle("POST /v1/access_requests", allow(proxy), a.audited("POST /v1/access_requests", a.createAccessRequest()))
	a.handle("POST /v1/access_requests/list", allow(proxy, admin), a.listAccessRequests())
	a.handle("POST /v1/access_requests/get", allow(proxy, admin), a.getAccessRequest())
	a.handle("POST /v1/access_requests/review", allow(proxy, admin), a.audited("POST /v1/access_requests/review", a.reviewAccessRequest()))
	a.handle("POST /v1/access_requests/cert", allow(proxy), a.audited("POST /v1/access_requests/cert", a.accessRequestCert()))
}

// asViewer adapts an access request operation to a route: it decodes the
// body, resolves who acts (the user named by the body's certificate, or the
// admin calling) and runs op for them, so every route checks the caller the
// same way.
func asViewer[Req any](a *APIServer, userCert func(*Req) []byte, op func(context.Context, *requestViewer, Req) (any, error)) apiHandler {
	return func(ctx context.Context, p *peer, r *http.Request) (any, error) {
		var req Req
		if err := readJSON(r, &req); err != nil {
			return nil, trace.Wrap(err)
		}
		v, err := a.auth.requestViewerFor(ctx, p, userCert(&req))
		if err != nil {
			return nil, trace.Wrap(err)
		}
		out, err := op(ctx, v, req)
		return out, trace.Wrap(err)
	}
}

func (a *APIServer) createAccessRequest() apiHandler {
	return asViewer(a, func(r *authapi.AccessRequestCreate) []byte { return r.UserCert },
		func(ctx context.Context, v *requestViewer, req authapi.AccessRequestCreate) (any, error) {
			return a.auth.CreateAccessRequest(ctx, v, req)
		})
}

func (a *APIServer) listAccessRequests() apiHandler {
	return asViewer(a, func(r *authapi.AccessRequestQuery) []byte { return r.UserCert },
		func(ctx context.Context, v *requestViewer, _ authapi.AccessRequestQuery) (any, error) {
			return a.auth.ListAccessRequests(ctx, v)
		})
}

func (a *APIServer) getAccessRequest() apiHandler {
	return asViewer(a, func(r *authapi.AccessRequestQuery) []byte { return r.UserCert },
		func(ctx context.Context, v *requestViewer, req authapi.AccessRequestQuery) (any, error) {
			return a.auth.GetAccessRequest(ctx, v, req.ID)
		})
}

func (a *APIServer) reviewAccessRequest() apiHandler {
	return asViewer(a, func(r *authapi.AccessRequestReview) []byte { return r.UserCert },
		func(ctx context.Context, v *requestViewer, req authapi.AccessRequestReview) (any, error) {
			return a.auth.ReviewAccessRequest(ctx, v, req)
		})
}

func (a *APIServer) accessRequestCert() apiHandler {
	return asViewer(a, func(r *authapi.AccessRequestCert) []byte { return r.UserCert },
		func(ctx context.Context, v *requestViewer, req authapi.AccessRequestCert) (any, error) {
			cert, err := a.auth.GenerateRequestCert(ctx, v, req)
			if err != nil {
				return nil, trace.Wrap(err)
			}
			return authapi.CertResponse{Cert: cert}, nil
		})
}

// CreateAccessRequest creates a request for the user of req.UserCert
// (proxy only).
func (c *Client) CreateAccessRequest(ctx context.Context, req authapi.AccessRequestCreate) (*services.AccessRequest, error) {
	return call[services.AccessRequest](ctx, c, http.MethodPost, "/v1/access_requests", nil, req)
}

// ListAccessRequests lists the requests the caller may see.
func (c *Client) ListAccessRequests(ctx context.Context, userCert []byte) ([]services.AccessRequest, error) {
	var out []services.AccessRequest
	err := c.do(ctx, http.MethodPost, "/v1/access_requests/list", nil, authapi.AccessRequestQuery{UserCert: userCert}, &out)
	return out, trace.Wrap(err)
}

// GetAccessRequest reads one request the caller may see.
func (c *Client) GetAccessRequest(ctx context.Context, userCert []byte, id string) (*services.AccessRequest, error) {
	return call[services.AccessRequest](ctx, c, http.MethodPost, "/v1/access_requests/get", nil, authapi.AccessRequestQuery{UserCert: userCert, ID: id})
}

// ReviewAccessRequest approves or denies a request.
func (c *Client) ReviewAccessRequest(ctx context.Context, req authapi.AccessRequestReview) (*services.AccessRequest, error) {
	return call[services.AccessRequest](ctx, c, http.MethodPost, "/v1/access_requests/review", nil, req)
}

// AccessRequestCert issues the user a certificate carrying an approved
// request's roles (proxy only).
func (c *Client) AccessRequestCert(ctx context.Context, req authapi.AccessRequestCert) ([]byte, error) {
	out, err := call[authapi.CertResponse](ctx, c, http.MethodPost, "/v1/access_requests/cert", nil, req)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return out.Cert, nil
}

// UserAccessRequests is the access request API of a proxy served by this
// auth server in-process: the same decisions as the HTTP API's, for the
// user whose certificate each call carries.
func (s *Server) UserAccessRequests() *LocalAccessRequests { return &LocalAccessRequests{s: s} }

// LocalAccessRequests implements the proxy's access request interfaces
// (lib/web, lib/proxy/sshproxy) on an in-process Server.
type LocalAccessRequests struct{ s *Server }

var proxyCaller = &peer{Role: RoleProxy, ID: "in-process"}

// CreateAccessRequest is POST /v1/access_requests.
func (l *LocalAccessRequests) CreateAccessRequest(ctx context.Context, req authapi.AccessRequestCreate) (*services.AccessRequest, error) {
	v, err := l.s.requestViewerFor(ctx, proxyCaller, req.UserCert)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return l.s.CreateAccessRequest(ctx, v, req)
}

// ListAccessRequests is POST /v1/access_requests/list.
func (l *LocalAccessRequests) ListAccessRequests(ctx context.Context, userCert []byte) ([]services.AccessRequest, error) {
	v, err := l.s.requestViewerFor(ctx, proxyCaller, userCert)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return l.s.ListAccessRequests(ctx, v)
}

// GetAccessRequest is POST /v1/access_requests/get.
func (l *LocalAccessRequests) GetAccessRequest(ctx context.Context, userCert []byte, id string) (*services.AccessRequest, error) {
	v, err := l.s.requestViewerFor(ctx, proxyCaller, userCert)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return l.s.GetAccessRequest(ctx, v, id)
}

// ReviewAccessRequest is POST /v1/access_requests/review.
func (l *LocalAccessRequests) ReviewAccessRequest(ctx context.Context, req authapi.AccessRequestReview) (*services.AccessRequest, error) {
	v, err := l.s.requestViewerFor(ctx, proxyCaller, req.UserCert)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return l.s.ReviewAccessRequest(ctx, v, req)
}

// AccessRequestCert is POST /v1/access_requests/cert.
func (l *LocalAccessRequests) AccessRequestCert(ctx context.Context, req authapi.AccessRequestCert) ([]byte, error) {
	v, err := l.s.requestViewerFor(ctx, proxyCaller, req.UserCert)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return l.s.GenerateRequestCert(ctx, v, req)
}
