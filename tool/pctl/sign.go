package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/services"
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
	priv, pub, err := auth.GenerateKeyPair()
	if err != nil {
		return trace.Wrap(err)
	}
	cert, err := clt.GenerateUserCert(ctx, auth.UserCertRequest{User: user, PublicKey: pub, TTL: ttl})
	if err != nil {
		return trace.Wrap(err)
	}
	hostCA, err := clt.GetCertAuthority(ctx, id.ClusterName, services.HostCA, false)
	if err != nil {
		return trace.Wrap(err)
	}
	knownHosts := strings.Join(auth.KnownHostsLines(hostCA.SSHPublicKeys), "\n") + "\n"
	// Write everything to temp names first and rename at the end, so a
	// failure never leaves a key without its certificate.
	files := []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{out, priv, 0o600},
		{out + ".pub", pub, 0o644},
		{out + "-cert.pub", cert, 0o644},
		{out + ".known_hosts", []byte(knownHosts), 0o644},
	}
	var tmps []string
	defer func() {
		for _, t := range tmps {
			os.Remove(t)
		}
	}()
	for _, f := range files {
		tmp := f.path + ".tmp"
		if err := os.WriteFile(tmp, f.data, f.mode); err != nil {
			return trace.ConvertSystemError(err)
		}
		tmps = append(tmps, tmp)
	}
	for i, f := range files {
		if err := os.Rename(tmps[i], f.path); err != nil {
			return trace.ConvertSystemError(err)
		}
	}
	tmps = nil
	fmt.Fprintf(c.stdout, "Wrote %s, %s.pub, %s-cert.pub and %s.known_hosts (valid for %s).\n", out, out, out, out, ttl)
	return nil
}
