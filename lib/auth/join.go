package auth

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/utils"
)

// JoinParams describe a host joining the cluster.
type JoinParams struct {
	// AuthAddr is the auth API's host:port; required.
	AuthAddr string
	// Token is the join token; required.
	Token string
	// CAPin is "sha256:HEX" of the cluster's TLS CA (see CAPin); required:
	// it is the only thing that authenticates the auth server to a host
	// that has no certificate yet.
	CAPin string
	// Role is RoleNode or RoleProxy.
	Role string
	// Hostname names the host; Addr is where it serves SSH (empty for a
	// proxy). There is no UUID: the auth server mints it and Join returns
	// it as the identity's ID.
	Hostname string
	Addr     string
	// AdditionalPrincipals become extra SSH principals, if the auth
	// server allows them (IPs and names no other host holds).
	AdditionalPrincipals []string
	// Clock is used to check the server's certificate; default real.
	Clock clockwork.Clock
	// Timeout bounds the whole join; zero means DefaultClientTimeout.
	Timeout time.Duration
	// Dial opens the byte stream to the auth API that the pinned TLS runs
	// over; nil means TCP to AuthAddr. A node behind NAT passes the
	// proxy's join relay (a raw relay: the pin still checks the auth
	// server itself, and the token travels inside that TLS).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// CheckAndSetDefaults validates the parameters.
func (p *JoinParams) CheckAndSetDefaults() error {
	switch {
	case p.AuthAddr == "":
		return trace.BadParameter("join: missing auth server address")
	case p.Token == "":
		return trace.BadParameter("join: missing token")
	case p.Role != RoleNode && p.Role != RoleProxy:
		return trace.BadParameter("join: role must be %q or %q, got %q", RoleNode, RoleProxy, p.Role)
	}
	if p.CAPin == "" {
		return trace.BadParameter("join: missing CA pin (--ca-pin sha256:HEX, printed by `pctl tokens add`)")
	}
	if err := checkCAPin(p.CAPin); err != nil {
		return trace.Wrap(err)
	}
	p.CAPin = strings.ToLower(p.CAPin)
	if p.Clock == nil {
		p.Clock = clockwork.NewRealClock()
	}
	if p.Timeout <= 0 {
		p.Timeout = DefaultClientTimeout
	}
	return nil
}

// Join exchanges a token for an identity: it generates the host's SSH and
// TLS keys locally (private keys never leave the host), sends the public
// halves with the token, and returns the identity. Its ID is the host UUID
// the auth server minted; the caller adopts it as the host's UUID and
// writes the identity with WriteIdentity.
func Join(ctx context.Context, p JoinParams) (*Identity, error) {
	if err := p.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()

	sshKey, sshPub, err := utils.GenerateKeyPair()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	tlsKey, tlsKeyPEM, err := generateTLSKey()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	tlsPub, err := x509.MarshalPKIXPublicKey(tlsKey.Public())
	if err != nil {
		return nil, trace.Wrap(err)
	}
	body, err := json.Marshal(authapi.RegisterRequest{
		Token:                p.Token,
		Role:                 p.Role,
		Hostname:             p.Hostname,
		Addr:                 p.Addr,
		AdditionalPrincipals: p.AdditionalPrincipals,
		SSHPublicKey:         sshPub,
		TLSPublicKey:         tlsPub,
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}

	addrs := SplitAuthAddrs(p.AuthAddr)
	if len(addrs) == 0 {
		return nil, trace.BadParameter("join: missing AuthAddr")
	}
	dial := p.Dial
	if dial == nil {
		// Any of several auth servers will do (failover.go).
		dial = newFailoverDialer(addrs, p.Timeout).DialContext
	}
	transport := &http.Transport{
		DialContext:       dial,
		TLSClientConfig:   joinTLSConfig(p.CAPin, p.Clock),
		DisableKeepAlives: true,
	}
	defer transport.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addrs[0]+"/v1/join", bytes.NewReader(body))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		var pinErr *pinMismatchError
		if errors.As(err, &pinErr) {
			return nil, trace.AccessDenied("%s", pinErr.Error())
		}
		return nil, trace.ConnectionProblem(err, "joining through auth server at %s: %v", p.AuthAddr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, authapi.ReadErrorResponse(resp)
	}
	var rr authapi.RegisterResponse
	if err := json.NewDecoder(resp.Body).Decode(&rr); err != nil {
		return nil, trace.ConnectionProblem(err, "auth server at %s: bad join response: %v", p.AuthAddr, err)
	}
	// The identity will trust exactly the CAs the server returned: make
	// sure the pinned one is among them rather than trusting the response.
	found := false
	for _, caPEM := range rr.TLSCACerts {
		if ca, err := parseCertPEM(caPEM); err == nil && caPinOf(ca) == p.CAPin {
			found = true
		}
	}
	if !found {
		return nil, trace.AccessDenied("join response does not contain the pinned CA %s", p.CAPin)
	}
	id, err := ParseIdentity(IdentityFiles{
		SSHKey:     sshKey,
		SSHCert:    rr.SSHCert,
		TLSCert:    rr.TLSCert,
		TLSKey:     tlsKeyPEM,
		TLSCACerts: rr.TLSCACerts,
	})
	if err != nil {
		return nil, trace.BadParameter("join response: %v", err)
	}
	// The minted UUID, the TLS identity and the host certificate must all
	// name the same host, or the identity would be unusable.
	if rr.UUID == "" || id.ID != rr.UUID || id.SSHCert == nil || id.SSHCert.KeyId != rr.UUID {
		return nil, trace.BadParameter("join response: the assigned UUID %q does not match the certificates", rr.UUID)
	}
	return id, nil
}

// pinMismatchError is returned from the TLS verification callback so Join
// can report it as such instead of as a generic connection failure.
type pinMismatchError struct {
	want string
	got  []string
}

func (e *pinMismatchError) Error() string {
	if len(e.got) == 0 {
		return "auth server CA pin mismatch: expected " + e.want + ", but the server presented no CA certificate"
	}
	return "auth server CA pin mismatch: expected " + e.want + ", server presented " + strings.Join(e.got, ", ")
}

// joinTLSConfig checks the auth server against a CA pin.
//
// The standard verifier cannot be used: the joining host has no CA to put
// in RootCAs, only a pin. So InsecureSkipVerify turns it off and
// VerifyConnection does the whole job. Checking the pin alone would not be
// enough: the CA certificate is public, and anyone can send it along with a
// leaf of their own. So the callback (1) finds the presented CA whose
// public key matches the pin, then (2) verifies the leaf against that CA
// as the only root, for server authentication and the join name — proving
// the server holds a key the pinned CA certified, which only the auth
// server does.
func joinTLSConfig(pin string, clock clockwork.Clock) *tls.Config {
	return &tls.Config{
		ServerName:         JoinServerName,
		InsecureSkipVerify: true,
		MinVersion:         tls.VersionTLS12,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("auth server presented no certificate")
			}
			var ca *x509.Certificate
			var seen []string
			for _, c := range cs.PeerCertificates[1:] {
				p := caPinOf(c)
				seen = append(seen, p)
				if p == pin && c.IsCA {
					ca = c
				}
			}
			if ca == nil {
				return &pinMismatchError{want: pin, got: seen}
			}
			roots := x509.NewCertPool()
			roots.AddCert(ca)
			if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				Roots:       roots,
				DNSName:     JoinServerName,
				CurrentTime: clock.Now(),
				KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			}); err != nil {
				return errors.New("auth server certificate is not signed by the pinned CA: " + err.Error())
			}
			return nil
		},
	}
}
