package sshproxy

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/url"
	"strings"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api"
	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/utils"
)

// Per-session MFA at the proxy's SSH port (role option
// require_session_mfa). The proxy is where every `psh ssh` and `ssh -J`
// hop is routed, so it is where a node that needs a fresh second factor
// per session refuses a normal certificate, and where a per-session
// certificate (lib/auth/sessionmfa.go) is held to the one node it was
// issued for. psh gets one through SubsystemSessionMFACert with a TOTP
// code; auth checks the code and the certificate psh connected with.

// SessionCertIssuer issues per-session certificates: the proxy's auth
// client.
type SessionCertIssuer interface {
	IssueSessionCert(ctx context.Context, req authapi.SessionCertRequest) (*authapi.SessionCertResponse, error)
	CreateSessionMFALogin(ctx context.Context, req authapi.SessionMFALoginRequest) (*authapi.CLILoginResponse, error)
}

// cliLoginPagePath is the web UI's page of a psh login (lib/web's
// CLILoginPagePath; not imported: the SSH side does not link the web
// server).
const cliLoginPagePath = "/web/cli-login"

// checkRouteSessionMFA applies authz.Identity.CheckSessionMFA to a dialed route; a leaf's
// node is the leaf's to decide, but a per-session certificate never
// leaves the cluster that issued it.
func (h *Handler) checkRouteSessionMFA(ctx context.Context, id *authz.Identity, route proxy.Route, target proxy.Target, via string) error {
	var err error
	if route.Leaf {
		if _, ok := id.Cert.Permissions.Extensions[services.CertExtensionSessionMFA]; ok {
			err = trace.AccessDenied("this per-session certificate was issued for a node of this cluster, not of %q", route.Cluster)
		}
	} else {
		err = id.CheckSessionMFA(&route.Node, h.cfg.Router.ClusterName())
	}
	if err != nil {
		h.cfg.Logger.WithError(err).WithField("user", id.User).Info("Refused a session without its fresh second factor.")
		h.emit(ctx, events.AccessDenied, id, target, via, events.Fields{events.FieldReason: err.Error(), events.FieldServerID: route.Node.UUID})
	}
	return err
}

// maxSessionMFARequest bounds psh's request: a key, a code and a name.
const maxSessionMFARequest = 16 << 10

// sessionMFACertSubsystem serves SubsystemSessionMFACert: route the
// target as a session would (RBAC first), check the login there, and ask
// auth for the certificate with the code and the certificate the user
// connected with.
func (h *Handler) sessionMFACertSubsystem(id *authz.Identity) (srv.SubsystemFunc, error) {
	if h.cfg.SessionCerts == nil {
		return nil, trace.NotImplemented("per-session certificates are not available on this proxy")
	}
	return func(ctx context.Context, ch ssh.Channel) error {
		data, err := io.ReadAll(io.LimitReader(ch, maxSessionMFARequest+1))
		if err != nil {
			return trace.Wrap(err)
		}
		if len(data) > maxSessionMFARequest {
			return trace.BadParameter("request too large")
		}
		req, err := DecodeSessionMFACertRequest(data)
		if err != nil {
			return trace.Wrap(err)
		}
		target, err := proxy.ParseTarget(req.Target)
		if err != nil {
			return trace.Wrap(err)
		}
		target.Cluster = req.Cluster
		route, err := h.cfg.Router.Route(ctx, target, id.CanReach)
		if err != nil {
			visible, _ := proxy.HideDenied(target, route, err)
			return trace.Wrap(visible)
		}
		if route.Leaf {
			return trace.BadParameter("per-session certificates are for nodes of cluster %q", h.cfg.Router.ClusterName())
		}
		if err := id.CheckLogin(&route.Node, req.Login); err != nil {
			return trace.Wrap(err)
		}
		if req.Check {
			required := id.CheckSessionMFA(&route.Node, h.cfg.Router.ClusterName()) != nil
			out, err := json.Marshal(proxyapi.SessionMFACertResponse{Required: &required})
			if err != nil {
				return trace.Wrap(err)
			}
			_, err = ch.Write(out)
			return trace.Wrap(err)
		}
		if b := req.Browser; b != nil {
			started, err := h.cfg.SessionCerts.CreateSessionMFALogin(ctx, authapi.SessionMFALoginRequest{
				SessionMFAIdentity: authapi.SessionMFAIdentity{UserCert: ssh.MarshalAuthorizedKey(id.Cert)},
				Client:             authapi.SSOClientLogin{PublicKey: []byte(req.PublicKey), RedirectURL: b.RedirectURL, SealKey: b.SealKey},
				Node:               route.Node.UUID, Cluster: h.cfg.Router.ClusterName(), Login: req.Login,
			})
			if err != nil {
				return trace.Wrap(err)
			}
			q := url.Values{"id": {started.ID}, "node": {route.Node.Hostname}, "login": {req.Login}}
			out, err := json.Marshal(proxyapi.SessionMFACertResponse{Path: cliLoginPagePath + "?" + q.Encode()})
			if err != nil {
				return trace.Wrap(err)
			}
			_, err = ch.Write(out)
			return trace.Wrap(err)
		}
		resp, err := h.cfg.SessionCerts.IssueSessionCert(ctx, authapi.SessionCertRequest{
			SessionMFAIdentity: authapi.SessionMFAIdentity{UserCert: ssh.MarshalAuthorizedKey(id.Cert)},
			PublicKey:          []byte(req.PublicKey), Node: route.Node.UUID, Cluster: h.cfg.Router.ClusterName(),
			Login: req.Login, OTP: req.OTP, RemoteAddr: remoteHost(utils.ClientAddr(ctx)),
		})
		if err != nil {
			return trace.Wrap(err)
		}
		out, err := json.Marshal(proxyapi.SessionMFACertResponse{Cert: strings.TrimSpace(string(resp.Cert))})
		if err != nil {
			return trace.Wrap(err)
		}
		_, err = ch.Write(out)
		return trace.Wrap(err)
	}, nil
}

func remoteHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// DecodeSessionMFACertRequest parses psh's request strictly: one JSON
// object, no unknown fields, a target, a login, a public key, and either
// a code or a loopback browser hand-off (a 32-byte seal key), not both.
func DecodeSessionMFACertRequest(data []byte) (*proxyapi.SessionMFACertRequest, error) {
	var req proxyapi.SessionMFACertRequest
	if err := api.UnmarshalStrict(data, &req); err != nil {
		return nil, trace.BadParameter("invalid per-session certificate request: %v", trace.UserMessage(err))
	}
	if req.Target == "" || req.Login == "" {
		return nil, trace.BadParameter("invalid per-session certificate request: missing target or login")
	}
	if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(req.PublicKey)); err != nil {
		return nil, trace.BadParameter("invalid per-session certificate request: public_key is not an SSH public key")
	}
	if req.Check {
		if req.OTP != "" || req.Browser != nil {
			return nil, trace.BadParameter("invalid per-session certificate request: a check carries no otp and no browser hand-off")
		}
		return &req, nil
	}
	if (req.OTP == "") == (req.Browser == nil) {
		return nil, trace.BadParameter("invalid per-session certificate request: give an otp or a browser hand-off, exactly one")
	}
	if b := req.Browser; b != nil {
		u, err := url.Parse(b.RedirectURL)
		ip := net.ParseIP(hostOf(u))
		if err != nil || u.Scheme != "http" || ip == nil || !ip.IsLoopback() || len(b.SealKey) != 32 {
			return nil, trace.BadParameter("invalid per-session certificate request: the browser hand-off needs psh's loopback URL and a 32-byte seal key")
		}
	}
	return &req, nil
}

func hostOf(u *url.URL) string {
	if u == nil {
		return ""
	}
	return u.Hostname()
}
