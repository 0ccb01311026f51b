// Package webapi holds the bodies of the proxy's web API (/webapi/...,
// docs/reference.md, Web API): what the proxy's lib/web serves and what psh and the
// browser UI send and read. The web terminal's frames are not here (they
// belong to the terminal's own protocol). See package api for why it
// imports nothing of the servers.
package webapi

import (
	"time"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/proxyapi"
)

// PingResponse is GET /webapi/ping: what a client learns before logging in.
type PingResponse struct {
	ClusterName  string `json:"cluster_name"`
	ProxySSHAddr string `json:"proxy_ssh_addr"`
	// TunnelAddr is the proxy's reverse tunnel port (nodes behind NAT
	// dial it); empty when the proxy takes no tunnels.
	TunnelAddr    string `json:"tunnel_addr,omitempty"`
	SecondFactor  string `json:"second_factor"`
	ServerVersion string `json:"server_version"`
}

// Values of PingResponse.SecondFactor.
const (
	SecondFactorOff = "off"
	SecondFactorOTP = "otp"
)

// SSHLoginRequest is the body of POST /webapi/ssh/certs (docs/reference.md).
type SSHLoginRequest struct {
	User     string `json:"user"`
	Password string `json:"password"`
	OTPToken string `json:"otp_token"`
	// PubKey is the key to certify, authorized_keys format.
	PubKey string `json:"pub_key"`
	// TTLSeconds is the wanted certificate lifetime; zero means the
	// roles' max_session_ttl (auth caps any value by it).
	TTLSeconds int64 `json:"ttl_seconds"`
}

// SSHLoginResponse is the answer of POST /webapi/ssh/certs.
type SSHLoginResponse struct {
	Username string `json:"username"`
	// Cert is the user certificate, authorized_keys format.
	Cert        string               `json:"cert"`
	HostSigners []authapi.HostSigner `json:"host_signers"`
}

// ErrorResponse is the body of every non-2xx answer of the web API.
type ErrorResponse struct {
	Error string `json:"error"`
}

// CreateSessionRequest is the body of POST /webapi/sessions.
type CreateSessionRequest struct {
	User     string `json:"user"`
	Password string `json:"password"`
	OTPToken string `json:"otp_token"`
}

// CreateSessionResponse is its answer; the session cookie is set alongside.
type CreateSessionResponse struct {
	Token   string    `json:"token"`
	Expires time.Time `json:"expires"`
	User    string    `json:"user"`
}

// NodesResponse is GET /webapi/nodes: the same entries as the proxy's
// `nodes` subsystem.
type NodesResponse struct {
	Items []proxyapi.NodeEntry `json:"items"`
}

// ClustersResponse is GET /webapi/clusters: the clusters the session user
// may reach (the proxy's own first), the set `proxysites` lists.
type ClustersResponse struct {
	Items []ClusterEntry `json:"items"`
}

// ClusterEntry is one cluster of ClustersResponse.
type ClusterEntry struct {
	Name          string    `json:"name"`
	Status        string    `json:"status"`
	LastConnected time.Time `json:"last_connected"`
	// Local marks the proxy's own cluster.
	Local bool `json:"local"`
}
