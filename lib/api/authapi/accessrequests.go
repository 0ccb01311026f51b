package authapi

import (
	"github.com/postern-dev/postern/lib/services"
)

// Access requests (POST /v1/access_requests/*). A user reaches them
// through the proxy, which passes the user's own certificate (UserCert):
// auth checks it against the user CA and acts for the user it names, so a
// proxy cannot speak for a user it holds no valid certificate of. An
// admin (pctl) sends no UserCert and sees and reviews every request.

// AccessRequestCreate asks for roles (POST /v1/access_requests).
type AccessRequestCreate struct {
	// UserCert is the requester's certificate, authorized_keys format.
	UserCert []byte   `json:"user_cert"`
	Roles    []string `json:"roles"`
	Reason   string   `json:"reason,omitempty"`
	// TTL is how long the grant should last; zero means the cap.
	TTL services.Duration `json:"ttl,omitempty"`
}

// AccessRequestQuery names requests (POST /v1/access_requests/list: ID
// empty; /get: one).
type AccessRequestQuery struct {
	UserCert []byte `json:"user_cert,omitempty"`
	ID       string `json:"id,omitempty"`
}

// AccessRequestReview approves or denies (POST /v1/access_requests/review).
type AccessRequestReview struct {
	UserCert []byte `json:"user_cert,omitempty"`
	ID       string `json:"id"`
	// State is services.RequestApproved or services.RequestDenied.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// AccessRequestCert asks for a certificate carrying an approved request's
// roles (POST /v1/access_requests/cert).
type AccessRequestCert struct {
	UserCert []byte `json:"user_cert"`
	ID       string `json:"id"`
	// PublicKey is the key to certify, authorized_keys format.
	PublicKey []byte `json:"public_key"`
}
