package auth

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/webauthn"
	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// Per-session MFA (role option require_session_mfa; the contract is in
// lib/api/authapi/sessionmfa.go). The proof of a second factor is a
// certificate that is good for one thing: a session to one node as one
// login, started within services.SessionMFATTL. Its principals are that
// login alone, so a node refuses it for any other; its
// services.CertExtensionSessionMFA names the node, so the proxy refuses
// it for any other node; and it expires a minute after it was issued, so
// a copy is soon worth nothing. Its roles are the user's, so the node's
// own RBAC is unchanged.

// methodSessionMFA is the audited method of a per-session certificate.
const methodSessionMFA = "session_mfa"

// sessionMFAUser is the user a per-session request names, checked: a live
// web session that is not register-only, or a certificate this cluster's
// user CA signed, valid now and not itself a per-session one.
func (s *Server) sessionMFAUser(ctx context.Context, idn authapi.SessionMFAIdentity) (*services.User, error) {
	var name string
	switch {
	case idn.WebSession != nil && len(idn.UserCert) == 0:
		_, ws, err := s.webSessionBySecret(ctx, idn.WebSession.SessionID, idn.WebSession.Token)
		if err != nil {
			return nil, trace.AccessDenied("invalid or expired web session")
		}
		if ws.RegisterOnly {
			return nil, trace.AccessDenied("register a second factor first, then log in again")
		}
		name = ws.User
	case idn.WebSession == nil && len(idn.UserCert) > 0:
		cert, err := s.checkUserCert(idn.UserCert)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		id, err := authz.FromCertificate(cert, "")
		if err != nil {
			return nil, trace.Wrap(err)
		}
		if err := id.CheckCluster(s.cfg.ClusterName); err != nil {
			return nil, trace.Wrap(err)
		}
		name = id.User
	default:
		return nil, trace.BadParameter("a per-session request names the user by a web session or a certificate, exactly one")
	}
	user, err := s.store.GetUser(ctx, name)
	if err != nil {
		if trace.IsNotFound(err) {
			return nil, trace.AccessDenied("user %q no longer exists", name)
		}
		return nil, trace.Wrap(err)
	}
	if err := s.checkUserLock(ctx, user.Name); err != nil {
		return nil, trace.Wrap(err)
	}
	return user, nil
}

// checkUserCert parses a user certificate and checks that this cluster's
// user CA signed it and that it is valid now.
func (s *Server) checkUserCert(data []byte) (*ssh.Certificate, error) {
	pub, _, _, _, err := ssh.ParseAuthorizedKey(data)
	if err != nil {
		return nil, trace.BadParameter("user_cert: %v", err)
	}
	cert, ok := pub.(*ssh.Certificate)
	if !ok || cert.CertType != ssh.UserCert {
		return nil, trace.BadParameter("user_cert is not a user certificate")
	}
	cas, err := parseAuthorizedKeys(s.userCA.SSHPublicKeys)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	// CheckCert checks the signature, the validity window and the
	// principal, not who signed: that is this cluster's user CA or
	// nobody.
	if !slices.ContainsFunc(cas, func(ca ssh.PublicKey) bool { return bytes.Equal(ca.Marshal(), cert.SignatureKey.Marshal()) }) {
		return nil, trace.AccessDenied("certificate refused: not signed by this cluster's user CA")
	}
	checker := &ssh.CertChecker{Clock: s.clock.Now}
	if len(cert.ValidPrincipals) == 0 {
		return nil, trace.AccessDenied("certificate without principals")
	}
	if err := checker.CheckCert(cert.ValidPrincipals[0], cert); err != nil {
		return nil, trace.AccessDenied("certificate refused: %v", err)
	}
	if _, ok := cert.Permissions.Extensions[services.CertExtensionSessionMFA]; ok {
		return nil, trace.AccessDenied("a per-session certificate cannot vouch for another session")
	}
	return cert, nil
}

// BeginSessionMFA starts a passkey ceremony for a new session of the user
// req names.
func (s *Server) BeginSessionMFA(ctx context.Context, req authapi.SessionMFABeginRequest) (*authapi.MFAChallenge, error) {
	user, err := s.sessionMFAUser(ctx, req.SessionMFAIdentity)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	pref, err := s.authPreference(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	devs, err := s.mfaDevices(ctx, user)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	wu := s.newWebAuthnUser(user.Name, devs)
	if len(wu.creds) == 0 || (pref != nil && pref.Required() && !pref.AllowsWebAuthn()) {
		return nil, trace.BadParameter("no passkey is registered for this account: register one on the Account page, or use an OTP code")
	}
	rp, err := s.relyingParty(ctx, pref)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	assertion, session, err := rp.BeginLogin(wu, webauthn.WithUserVerification(protocol.VerificationPreferred))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return s.storeChallenge(ctx, user.Name, services.MFAPurposeSession, "", session, assertion)
}

// IssueSessionCert checks a fresh second factor of the user req names and
// certifies req.PublicKey for one session to req.Node as req.Login.
func (s *Server) IssueSessionCert(ctx context.Context, req authapi.SessionCertRequest) (resp *authapi.SessionCertResponse, err error) {
	user, err := s.sessionMFAUser(ctx, req.SessionMFAIdentity)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return s.issueSessionCert(ctx, user, req)
}

// checkSessionTarget checks that user may reach node uuid of cluster as
// login, and returns the node.
func (s *Server) checkSessionTarget(ctx context.Context, user *services.User, cluster, uuid, login string) (*services.Node, error) {
	if cluster != s.cfg.ClusterName {
		return nil, trace.BadParameter("per-session certificates are for nodes of cluster %q", s.cfg.ClusterName)
	}
	node, err := s.sessionNode(ctx, uuid)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	checker, err := s.accessChecker(ctx, user)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := checker.CheckAccessToNode(node, login); err != nil {
		return nil, trace.Wrap(err)
	}
	return node, nil
}

// issueSessionCert is IssueSessionCert for a user already identified.
func (s *Server) issueSessionCert(ctx context.Context, user *services.User, req authapi.SessionCertRequest) (resp *authapi.SessionCertResponse, err error) {
	defer func() {
		if err != nil {
			s.emitSessionMFA(ctx, events.AuthFailed, user.Name, req, auditReason(err))
		}
	}()
	node, err := s.checkSessionTarget(ctx, user, req.Cluster, req.Node, req.Login)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := s.verifySessionFactor(ctx, user, req); err != nil {
		return nil, trace.Wrap(err)
	}
	certBytes, err := s.generateUserCert(ctx, user, authapi.UserCertRequest{User: user.Name, PublicKey: req.PublicKey, TTL: services.SessionMFATTL})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	// generateUserCert made the user's certificate; narrowed here to the
	// one login and bound to the node, and signed again.
	pub, _, _, _, err := ssh.ParseAuthorizedKey(certBytes)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	cert := pub.(*ssh.Certificate)
	target, err := json.Marshal(services.SessionMFATarget{Cluster: s.cfg.ClusterName, Node: node.UUID, Login: req.Login})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	cert.ValidPrincipals = []string{req.Login}
	cert.Permissions.Extensions[services.CertExtensionSessionMFA] = string(target)
	if err := s.sign(cert, s.userSigner); err != nil {
		return nil, trace.Wrap(err)
	}
	s.emitSessionMFA(ctx, events.AuthLogin, user.Name, req, "")
	return &authapi.SessionCertResponse{Cert: ssh.MarshalAuthorizedKey(cert)}, nil
}

// sessionNode is the node a per-session certificate is for: one of this
// cluster's, by UUID.
func (s *Server) sessionNode(ctx context.Context, uuid string) (*services.Node, error) {
	nodes, err := s.store.GetNodes(ctx, s.cfg.ClusterName)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	for i := range nodes {
		if nodes[i].UUID == uuid {
			return &nodes[i], nil
		}
	}
	return nil, trace.NotFound("node %q not found", uuid)
}

// verifySessionFactor checks the TOTP code or the passkey's answer of req
// for user: spent once, like at a login.
func (s *Server) verifySessionFactor(ctx context.Context, user *services.User, req authapi.SessionCertRequest) error {
	pref, err := s.authPreference(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	devs, err := s.mfaDevices(ctx, user)
	if err != nil {
		return trace.Wrap(err)
	}
	switch {
	case req.OTP != "":
		if pref != nil && pref.Required() && !pref.AllowsOTP() {
			return trace.AccessDenied("OTP codes are not allowed: auth_preference second_factor is %q", pref.Spec.SecondFactor)
		}
		_, err := totpVerifier{s}.Verify(ctx, user, devs, mfaResponse{totpCode: req.OTP})
		return trace.Wrap(err)
	case req.ChallengeID != "":
		c, _, err := s.takeChallenge(ctx, req.ChallengeID, services.MFAPurposeSession)
		if err != nil {
			return trace.Wrap(err)
		}
		if c.User != user.Name {
			return trace.AccessDenied("the passkey challenge was issued to another user")
		}
		rp, err := s.relyingParty(ctx, pref)
		if err != nil {
			return trace.Wrap(err)
		}
		_, err = webAuthnVerifier{s: s, rp: rp}.Verify(ctx, user, devs, mfaResponse{challenge: c, assertion: req.WebAuthn, remoteAddr: req.RemoteAddr, method: methodSessionMFA})
		return trace.Wrap(err)
	}
	return trace.BadParameter("a fresh second factor is required for this session: an OTP code or a passkey")
}

// emitSessionMFA audits a per-session certificate issued or refused.
func (s *Server) emitSessionMFA(ctx context.Context, typ, user string, req authapi.SessionCertRequest, reason string) {
	fields := events.Fields{events.FieldRemoteAddr: req.RemoteAddr, events.FieldMethod: methodSessionMFA, events.FieldServerID: req.Node, events.FieldLogin: req.Login}
	if reason != "" {
		fields[events.FieldReason] = reason
	}
	s.cfg.Audit.Emit(ctx, events.Event{Type: typ, User: user, Fields: fields})
}

func (a *APIServer) beginSessionMFA(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.SessionMFABeginRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.BeginSessionMFA(ctx, req)
	return resp, trace.Wrap(err)
}

func (a *APIServer) issueSessionCert(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.SessionCertRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.IssueSessionCert(ctx, req)
	return resp, trace.Wrap(err)
}

// BeginSessionMFA starts a passkey ceremony for a new session (proxy).
func (c *Client) BeginSessionMFA(ctx context.Context, req authapi.SessionMFABeginRequest) (*authapi.MFAChallenge, error) {
	return call[authapi.MFAChallenge](ctx, c, http.MethodPost, "/v1/mfa/session/begin", nil, req)
}

// IssueSessionCert asks for a per-session certificate (proxy).
func (c *Client) IssueSessionCert(ctx context.Context, req authapi.SessionCertRequest) (*authapi.SessionCertResponse, error) {
	return call[authapi.SessionCertResponse](ctx, c, http.MethodPost, "/v1/mfa/session/certs", nil, req)
}
