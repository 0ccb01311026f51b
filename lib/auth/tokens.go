package auth

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/google/uuid"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// DefaultTokenTTL is how long `pctl tokens add` tokens live when no --ttl is
// given: long enough to copy the join command to a new machine and run it,
// short enough that a leaked command is soon worthless.
const DefaultTokenTTL = 30 * time.Minute

// CreateToken makes a single-use join token of type tokenType (node or
// proxy) valid for ttl (zero means DefaultTokenTTL). The token is 16 random
// bytes as 32 hex characters: unguessable, and safe in a shell command.
func (s *Server) CreateToken(ctx context.Context, tokenType string, ttl time.Duration) (*services.Token, error) {
	if err := services.CheckTokenType(tokenType); err != nil {
		return nil, trace.Wrap(err)
	}
	if ttl < 0 {
		return nil, trace.BadParameter("token TTL must be positive, got %v", ttl)
	}
	if ttl == 0 {
		ttl = DefaultTokenTTL
	}
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, trace.Wrap(err)
	}
	tok := services.Token{
		Name:    hex.EncodeToString(raw[:]),
		Type:    tokenType,
		Expires: s.clock.Now().Add(ttl).UTC(),
	}
	if err := s.store.CreateToken(ctx, tok); err != nil {
		return nil, trace.Wrap(err)
	}
	s.log.WithFields(map[string]any{"type": tokenType, "ttl": ttl.String()}).Info("Created join token.")
	return &tok, nil
}

// RegisterUsingToken spends a join token and certifies the joiner's keys.
//
// The auth server mints the host's UUID here: a UUID the joiner could
// choose would let anyone holding a node token take over an existing
// node's identity (its certificate names, its inventory record, its
// users). A request carrying a UUID is refused. The certificate names are
// derived from the minted UUID and the hostname, plus only the extra
// principals checkExtraPrincipal allows.
//
// Everything that can be checked without the token is checked first, so a
// malformed request never burns a token; ConsumeToken is the single commit
// point (one winner among concurrent joins with the same token).
func (s *Server) RegisterUsingToken(ctx context.Context, req authapi.RegisterRequest) (resp *authapi.RegisterResponse, err error) {
	id := uuid.NewString()
	log := s.log.WithFields(map[string]any{"hostname": req.Hostname, "role": req.Role, "remote_addr": req.RemoteAddr})
	defer func() {
		if err != nil {
			log.WithError(err).Warn("Refused join.")
		}
	}()
	if req.Role != RoleNode && req.Role != RoleProxy {
		return nil, trace.BadParameter("join role must be %q or %q, got %q", RoleNode, RoleProxy, req.Role)
	}
	if req.UUID != "" {
		return nil, trace.BadParameter("join request carries uuid %q: the auth server assigns host UUIDs at join, a host cannot choose one (upgrade the joining host)", req.UUID)
	}
	if req.Token == "" {
		return nil, trace.BadParameter("missing join token")
	}
	if req.Addr != "" {
		if _, _, err := services.SplitAddr(req.Addr); err != nil {
			return nil, trace.Wrap(err)
		}
	}
	if req.Hostname != "" {
		// This cluster's own name only: the leaves' names are for token
		// holders (below).
		if err := s.checkHostHostname(req.Role, req.Hostname, id, req.Addr, []string{s.cfg.ClusterName}); err != nil {
			return nil, trace.Wrap(err)
		}
	}
	if _, err := parseAuthorizedKey(req.SSHPublicKey); err != nil {
		return nil, trace.Wrap(err)
	}
	tlsPub, err := parsePublicKey(req.TLSPublicKey)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	// Only a token holder gets the auth server to read the inventory.
	if _, err := s.store.CheckToken(ctx, req.Token, req.Role); err != nil {
		return nil, trace.Wrap(err)
	}
	if req.Hostname != "" {
		clusters, err := s.knownClusters(ctx)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		if err := s.checkHostHostname(req.Role, req.Hostname, id, req.Addr, clusters); err != nil {
			return nil, trace.Wrap(err)
		}
	}
	extra := append([]string(nil), req.AdditionalPrincipals...)
	if req.Addr != "" {
		host, _, _ := services.SplitAddr(req.Addr)
		extra = append(extra, host)
	}
	principals, err := s.joinPrincipals(ctx, req.Role, id, req.Hostname, extra)
	if err != nil {
		return nil, trace.Wrap(err)
	}

	if _, err := s.store.ConsumeToken(ctx, req.Token, req.Role); err != nil {
		return nil, trace.Wrap(err)
	}

	sshCert, err := s.GenerateHostCert(ctx, HostCertRequest{
		PublicKey:  req.SSHPublicKey,
		UUID:       id,
		Hostname:   req.Hostname,
		Principals: principals,
		Role:       req.Role,
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	tlsCert, err := s.signIdentityTLS(tlsPub, id, req.Role, nil, nil)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	log.WithFields(map[string]any{"uuid": id, "principals": principals}).Info("Host joined the cluster.")
	return &authapi.RegisterResponse{
		UUID:          id,
		SSHCert:       sshCert,
		TLSCert:       tlsCert,
		TLSCACerts:    [][]byte{s.hostCA.TLSCert},
		SSHHostCAKeys: s.HostCAKeys(),
		SSHUserCAKeys: s.UserCAKeys(),
	}, nil
}
