package web

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/services"
)

// Per-session MFA in the web terminal (role option require_session_mfa).
// Before a new terminal to such a node, the page proves a passkey: POST
// /webapi/mfa/session/begin says whether the node needs it and gives the
// challenge; POST /webapi/mfa/session/finish has auth check the answer
// and certify this session's key for that node and login alone, for a
// minute (lib/auth/sessionmfa.go), and answers a single-use token that
// the terminal's first message carries. The terminal then connects with
// that certificate; without one, it refuses the node. A resumed terminal
// is the same SSH session: it asks nothing.

// SessionMFAAuthenticator is what these endpoints need from auth.
type SessionMFAAuthenticator interface {
	BeginSessionMFA(ctx context.Context, req authapi.SessionMFABeginRequest) (*authapi.MFAChallenge, error)
	IssueSessionCert(ctx context.Context, req authapi.SessionCertRequest) (*authapi.SessionCertResponse, error)
}

var (
	_ SessionMFAAuthenticator = (*auth.Server)(nil)
	_ SessionMFAAuthenticator = (*auth.Client)(nil)
)

// msgTerminalNeedsMFA refuses a new terminal to a node that needs a fresh
// factor, opened without (or with a spent) token.
const msgTerminalNeedsMFA = "this node requires a fresh second factor for each session (require_session_mfa): confirm with your passkey, then connect"

// sessionGrant is a per-session certificate waiting for its terminal.
type sessionGrant struct {
	node, login string
	signer      ssh.Signer
	expires     time.Time
}

// sessionGrants holds a web session's grants by token.
type sessionGrants struct {
	// mu guards byToken.
	mu      sync.Mutex
	byToken map[string]*sessionGrant
}

// add keeps g under a new token and drops the expired ones.
func (g *sessionGrants) add(grant *sessionGrant, now time.Time) (string, error) {
	tok, err := randomHex()
	if err != nil {
		return "", trace.Wrap(err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byToken == nil {
		g.byToken = map[string]*sessionGrant{}
	}
	for k, v := range g.byToken {
		if !now.Before(v.expires) {
			delete(g.byToken, k)
		}
	}
	g.byToken[tok] = grant
	return tok, nil
}

// take spends the token's grant if it is for node and login and not
// expired; nil otherwise. A token is spent even when it does not match.
func (g *sessionGrants) take(tok, node, login string, now time.Time) *sessionGrant {
	if tok == "" {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	grant := g.byToken[tok]
	delete(g.byToken, tok)
	if grant == nil || grant.node != node || grant.login != login || !now.Before(grant.expires) {
		return nil
	}
	return grant
}

// sessionMFABody names the terminal's node (its UUID, as the terminal's
// params do), login and cluster; the finish adds the passkey's answer.
type sessionMFABody struct {
	Node        string          `json:"node"`
	Login       string          `json:"login"`
	Cluster     string          `json:"cluster,omitempty"`
	ChallengeID string          `json:"challenge_id,omitempty"`
	WebAuthn    json.RawMessage `json:"webauthn,omitempty"`
	// OTP is a TOTP code, for a user without a passkey.
	OTP string `json:"otp,omitempty"`
}

// sessionMFABeginResponse: required false, or the challenge, or otp
// true for a user without a passkey (the page asks for a code).
type sessionMFABeginResponse struct {
	Required bool `json:"required"`
	OTP      bool `json:"otp,omitempty"`
	*authapi.MFAChallenge
}

func (s *Server) sessionMFAAuth(w http.ResponseWriter) (SessionMFAAuthenticator, bool) {
	a, ok := s.cfg.Auth.(SessionMFAAuthenticator)
	if !ok || s.cfg.Auth == nil {
		writeError(w, http.StatusNotImplemented, "per-session MFA is not available on this proxy")
		return nil, false
	}
	return a, true
}

// sessionMFANode is the node body names if the session's user may reach
// it with body's login (a node they may not reach is not found, as
// everywhere), and whether a new session there needs a fresh factor.
// A leaf's nodes are the leaf's to decide: never asked here.
func (s *Server) sessionMFANode(ctx context.Context, live *liveSession, body sessionMFABody) (*services.Node, bool, error) {
	if body.Cluster != "" && body.Cluster != s.cfg.ClusterName {
		return nil, false, nil
	}
	id, err := s.identity(ctx, live)
	if err != nil {
		return nil, false, trace.Wrap(err)
	}
	nodes, err := s.cfg.WebSessions.Nodes.GetNodes(ctx, s.cfg.ClusterName)
	if err != nil {
		return nil, false, trace.Wrap(err)
	}
	for i := range nodes {
		n := &nodes[i]
		if n.UUID != body.Node {
			continue
		}
		if id.CheckLogin(n, body.Login) != nil {
			break
		}
		return n, id.CheckSessionMFA(n, s.cfg.ClusterName) != nil, nil
	}
	return nil, false, trace.NotFound("node %q not found", body.Node)
}

// sessionMFABegin serves POST /webapi/mfa/session/begin.
func (s *Server) sessionMFABegin(w http.ResponseWriter, r *http.Request, live *liveSession) {
	a, ok := s.sessionMFAAuth(w)
	if !ok {
		return
	}
	var body sessionMFABody
	if !readMFABody(w, r, &body) {
		return
	}
	log := s.cfg.Logger.WithField("user", live.user)
	_, required, err := s.sessionMFANode(r.Context(), live, body)
	if err != nil {
		writeMFAError(w, log, err)
		return
	}
	if !required {
		writeJSON(w, http.StatusOK, sessionMFABeginResponse{Required: false})
		return
	}
	ch, err := a.BeginSessionMFA(r.Context(), authapi.SessionMFABeginRequest{SessionMFAIdentity: authapi.SessionMFAIdentity{WebSession: ptr(sessionRequest(live))}})
	if trace.IsBadParameter(err) {
		// No passkey to ask for: a TOTP code then (auth says whether it
		// is one when it checks it).
		writeJSON(w, http.StatusOK, sessionMFABeginResponse{Required: true, OTP: true})
		return
	}
	if err != nil {
		writeMFAError(w, log, err)
		return
	}
	writeJSON(w, http.StatusOK, sessionMFABeginResponse{Required: true, MFAChallenge: ch})
}

// sessionMFAFinish serves POST /webapi/mfa/session/finish: {mfa_token}.
func (s *Server) sessionMFAFinish(w http.ResponseWriter, r *http.Request, live *liveSession) {
	a, ok := s.sessionMFAAuth(w)
	if !ok {
		return
	}
	var body sessionMFABody
	if !readMFABody(w, r, &body) {
		return
	}
	log := s.cfg.Logger.WithField("user", live.user)
	node, required, err := s.sessionMFANode(r.Context(), live, body)
	if err != nil {
		writeMFAError(w, log, err)
		return
	}
	if node == nil || !required {
		writeError(w, http.StatusBadRequest, "this node needs no per-session second factor")
		return
	}
	resp, err := a.IssueSessionCert(r.Context(), authapi.SessionCertRequest{
		SessionMFAIdentity: authapi.SessionMFAIdentity{WebSession: ptr(sessionRequest(live))},
		PublicKey:          ssh.MarshalAuthorizedKey(live.cert.Key), Node: node.UUID, Cluster: s.cfg.ClusterName, Login: body.Login,
		OTP: body.OTP, ChallengeID: body.ChallengeID, WebAuthn: body.WebAuthn, RemoteAddr: remoteHost(r.RemoteAddr),
	})
	if err != nil {
		writeMFAError(w, log, err)
		return
	}
	signer, cert, err := live.certSigner(resp.Cert)
	if err != nil {
		internalError(w, log, "Per-session MFA: unusable certificate from auth.", err)
		return
	}
	tok, err := live.grants.add(&sessionGrant{node: node.UUID, login: body.Login, signer: signer, expires: time.Unix(int64(cert.ValidBefore), 0)}, s.cfg.Clock.Now())
	if err != nil {
		internalError(w, log, "Per-session MFA: could not make a token.", err)
		return
	}
	log.WithField("node", node.UUID).Info("Per-session certificate for a web terminal.")
	writeJSON(w, http.StatusOK, map[string]string{"mfa_token": tok})
}

func ptr[T any](v T) *T { return &v }

// certSigner pairs a certificate auth issued for this session's key with
// the key.
func (l *liveSession) certSigner(data []byte) (ssh.Signer, *ssh.Certificate, error) {
	pub, _, _, _, err := ssh.ParseAuthorizedKey(data)
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	cert, ok := pub.(*ssh.Certificate)
	if !ok || l.keySigner == nil {
		return nil, nil, trace.BadParameter("not a certificate for this session's key")
	}
	signer, err := ssh.NewCertSigner(cert, l.keySigner)
	return signer, cert, trace.Wrap(err)
}
