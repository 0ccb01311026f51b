package service

import (
	"context"
	"slices"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/services"
)

// hostIdentity returns the identity of a node or proxy role:
//   - with a local auth server, a fresh one is issued on every start (cheap,
//     and it picks up changed hostnames and addresses);
//   - otherwise the one kept in the data dir is reused, so a joined host
//     restarts without a token;
//   - otherwise the host joins with --token, checking the auth server
//     against --ca-pin, and keeps the result.
func (p *Process) hostIdentity(ctx context.Context, role string, principals []string) (*auth.Identity, error) {
	dir := p.cfg.IdentityDir(role)
	if p.authServer != nil {
		id, err := p.authServer.IssueIdentity(ctx, auth.IdentityRequest{
			ID: p.hostUUID, Role: role, Hostname: p.cfg.NodeName, Principals: principals,
		})
		if err != nil {
			return nil, trace.Wrap(err)
		}
		return id, trace.Wrap(auth.WriteIdentity(dir, id))
	}
	if id, err := auth.ReadIdentity(dir); err == nil {
		if id.ID != p.hostUUID {
			return nil, trace.BadParameter("identity in %s belongs to host %s, not %s", dir, id.ID, p.hostUUID)
		}
		return id, nil
	} else if !trace.IsNotFound(err) {
		return nil, trace.Wrap(err, "reading the %s identity in %s", role, dir)
	}
	if p.cfg.Token == "" || p.cfg.CAPin == "" {
		return nil, trace.BadParameter("this %s has not joined a cluster yet: start it with --token and --ca-pin (printed by `pctl tokens add --type %s`)", role, role)
	}
	id, err := auth.Join(ctx, auth.JoinParams{
		AuthAddr:             p.cfg.AuthServer,
		Token:                p.cfg.Token,
		CAPin:                p.cfg.CAPin,
		Role:                 role,
		UUID:                 p.hostUUID,
		Hostname:             p.cfg.NodeName,
		AdditionalPrincipals: principals,
		Clock:                p.clock,
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := auth.WriteIdentity(dir, id); err != nil {
		return nil, trace.Wrap(err)
	}
	p.log.WithField("role", role).Info("Joined the cluster.")
	return id, nil
}

// accessPoint is what node and proxy roles read from auth: the store when
// auth runs in this process, the auth API otherwise.
type accessPoint interface {
	GetCertAuthority(ctx context.Context, clusterName string, t services.CertAuthType, withSecrets bool) (*services.CertAuthority, error)
	GetRole(ctx context.Context, name string) (*services.Role, error)
	GetClusterNetworkingConfig(ctx context.Context) (*services.ClusterNetworkingConfig, error)
	UpsertNode(ctx context.Context, n services.Node) error
	GetNodes(ctx context.Context, cluster string) ([]services.Node, error)
}

var (
	_ accessPoint = (*services.Store)(nil)
	_ accessPoint = (*auth.Client)(nil)
)

// accessPointFor returns the store, or a client of the remote auth server
// authenticated as id.
func (p *Process) accessPointFor(id *auth.Identity) (accessPoint, error) {
	if p.store != nil {
		return p.store, nil
	}
	if p.authClient == nil {
		clt, err := auth.NewClient(auth.ClientConfig{Addr: p.cfg.AuthServer, Identity: id, Clock: p.clock})
		if err != nil {
			return nil, trace.Wrap(err)
		}
		p.authClient = clt
		p.onShutdown(func(context.Context) error { return clt.Close() })
	}
	p.clusterName = id.ClusterName
	return p.authClient, nil
}

func appendUnique(dst []string, vals ...string) []string {
	for _, v := range vals {
		if v != "" && !slices.Contains(dst, v) {
			dst = append(dst, v)
		}
	}
	return dst
}
