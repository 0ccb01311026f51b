package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

func (c *cli) registerAuth(app *kingpin.Application, add adder) {
	a := app.Command("auth", "Certificate operations.")
	var user, out string
	var ttl time.Duration
	s := a.Command("sign", "Issue a key and user certificate for a robot or CI job: writes PATH, PATH.pub, PATH-cert.pub and PATH.known_hosts.")
	s.Flag("user", "Postern user the certificate is for.").Required().StringVar(&user)
	s.Flag("ttl", "Certificate lifetime (capped by the user's roles).").Default("1h").DurationVar(&ttl)
	s.Flag("out", "Output path of the private key.").Required().StringVar(&out)
	add(s, func(ctx context.Context) error { return c.authSign(ctx, user, ttl, out) })
}

func (c *cli) authSign(ctx context.Context, user string, ttl time.Duration, out string) error {
	if ttl <= 0 {
		return trace.BadParameter("--ttl must be positive")
	}
	clt, id, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	priv, pub, err := utils.GenerateKeyPair()
	if err != nil {
		return trace.Wrap(err)
	}
	cert, err := clt.GenerateUserCert(ctx, authapi.UserCertRequest{User: user, PublicKey: pub, TTL: ttl})
	if err != nil {
		return trace.Wrap(err)
	}
	hostCA, err := clt.GetCertAuthority(ctx, id.ClusterName, services.HostCA, false)
	if err != nil {
		return trace.Wrap(err)
	}
	lines := authapi.KnownHostsLines(hostCA.SSHPublicKeys)
	// Each leaf's host CA too, as psh writes it: scoped to *.LEAF, so
	// that a leaf's CA never vouches for this cluster's hosts.
	leaves, err := clt.GetRemoteClusters(ctx)
	if err != nil {
		return trace.Wrap(err, "listing leaf clusters")
	}
	slices.SortFunc(leaves, func(a, b services.RemoteCluster) int { return strings.Compare(a.Name, b.Name) })
	for _, rc := range leaves {
		ca, err := clt.GetCertAuthority(ctx, rc.Name, services.HostCA, false)
		if trace.IsNotFound(err) {
			continue // being removed right now
		}
		if err != nil {
			return trace.Wrap(err)
		}
		lines = append(lines, authapi.ScopedKnownHostsLines(strings.Join(authz.HostAuthorityPatterns(rc.Name, id.ClusterName), ","), ca.SSHPublicKeys)...)
	}
	knownHosts := strings.Join(lines, "\n") + "\n"
	// All four files or none: a key without its certificate is useless,
	// and the temporaries are created O_EXCL (see utils.WriteFilesAtomic).
	if err := utils.WriteFilesAtomic([]utils.File{
		{Path: out, Data: priv, Mode: 0o600},
		{Path: out + ".pub", Data: pub, Mode: 0o644},
		{Path: out + "-cert.pub", Data: cert, Mode: 0o644},
		{Path: out + ".known_hosts", Data: []byte(knownHosts), Mode: 0o644},
	}); err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "Wrote %s, %s.pub, %s-cert.pub and %s.known_hosts (valid for %s).\n", out, out, out, out, ttl)
	return nil
}
