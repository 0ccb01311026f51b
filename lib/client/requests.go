package client

import (
	"context"
	"encoding/json"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// maxRequestsAnswer bounds an access request answer psh reads.
const maxRequestsAnswer = 16 << 20

// AccessRequestOp runs one access request operation on the proxy's
// `access-request:` subsystem and decodes its JSON answer into out.
func AccessRequestOp(ctx context.Context, creds *Credentials, op proxyapi.AccessRequestOp, out any) error {
	js, err := json.Marshal(op)
	if err != nil {
		return trace.Wrap(err)
	}
	data, err := readSubsystem(ctx, creds, proxyapi.SubsystemAccessRequestPrefix+string(js), maxRequestsAnswer, nil)
	if err != nil {
		return trace.Wrap(err)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return trace.BadParameter("the proxy sent an invalid access request answer: %v", err)
	}
	return nil
}

// WaitAccessRequest polls request id until it is no longer pending (or
// ctx ends), every interval on clock.
func WaitAccessRequest(ctx context.Context, creds *Credentials, id string, clock clockwork.Clock, interval time.Duration) (*services.AccessRequest, error) {
	for {
		var r services.AccessRequest
		if err := AccessRequestOp(ctx, creds, proxyapi.AccessRequestOp{Op: proxyapi.AccessRequestOpShow, ID: id}, &r); err != nil {
			return nil, trace.Wrap(err)
		}
		if r.State != services.RequestPending {
			return &r, nil
		}
		t := clock.NewTimer(interval)
		select {
		case <-t.Chan():
		case <-ctx.Done():
			t.Stop()
			return nil, trace.LimitExceeded("access request %s is still pending", id)
		}
	}
}

// LoginWithRequest replaces the stored certificate with one carrying
// approved request id's roles, for the same key: the certificate ends with
// the request (psh login --request-id). With agentSock set the key is also
// added to ssh-agent with the new certificate (agentErr says why not).
func (s *Store) LoginWithRequest(ctx context.Context, creds *Credentials, id, agentSock string) (cert *ssh.Certificate, agentErr error, err error) {
	var ans proxyapi.AccessRequestCertAnswer
	op := proxyapi.AccessRequestOp{Op: proxyapi.AccessRequestOpCert, ID: id, PublicKey: ssh.MarshalAuthorizedKey(creds.Cert.Key)}
	if err := AccessRequestOp(ctx, creds, op, &ans); err != nil {
		return nil, nil, trace.Wrap(err)
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey(ans.Cert)
	cert, ok := pub.(*ssh.Certificate)
	if err != nil || !ok {
		return nil, nil, trace.BadParameter("the proxy sent an invalid certificate")
	}
	if string(cert.Key.Marshal()) != string(creds.Cert.Key.Marshal()) {
		return nil, nil, trace.BadParameter("the proxy sent a certificate for another key")
	}
	if err := utils.WriteFileAtomic(s.CertPath(creds.Profile), ans.Cert, fileMode); err != nil {
		return nil, nil, trace.Wrap(err)
	}
	if agentSock != "" {
		agentErr = addToAgent(agentSock, creds.KeyPEM, cert, time.Now())
	}
	return cert, agentErr, nil
}
