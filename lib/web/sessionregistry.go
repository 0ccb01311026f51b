package web

import (
	"context"
	"crypto/ed25519"
	"errors"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/services"
)

// The registry of this proxy's live web sessions: the in-memory half of
// each (its certificate and key, never stored anywhere) and the context
// that ends its terminals when the session ends.

// liveSession is a session's in-memory half: the key that authenticates
// to nodes on the user's behalf.
type liveSession struct {
	key string // hash of the session id: the store key
	// ref is the session's secrets, as its browser presented them: what
	// the store (the auth API) needs to act on the record.
	ref SessionRef
	// endID is services.WebSessionEndID(key): how the session watch
	// names the session's end.
	endID  string
	user   string
	signer ssh.Signer
	// keySigner signs for the session's key alone: with another certificate
	// for it (a leaf's, for a leaf's OpenSSH node) it logs in as that.
	keySigner ssh.Signer
	cert      *ssh.Certificate
	// hostCAs are the host CAs of the login's host_signers, each scoped
	// as psh scopes them: this cluster's for every name, a leaf's only
	// for *.LEAF, so a leaf's CA never vouches for a local node (a leaf
	// node's terminal is checked against that leaf's stored CA alone).
	hostCAs []authz.HostAuthority
	expires time.Time
	// registerOnly: the session can only register a second factor
	// (registeronly.go); it has no key, certificate or host CAs.
	registerOnly bool
	// grants are the per-session certificates this session got for new
	// terminals (sessionmfa.go).
	grants sessionGrants
	// ctx ends when the session is logged out or expires; terminals
	// opened with the session run under it.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// assumed is set when the session serves an access request it
	// assumed (requestassume.go): the session's own half to fall back to.
	assumed *assumption
}

// sessionRegistry holds the live halves of this proxy's web sessions.
type sessionRegistry struct {
	// mu guards byKey.
	mu    sync.Mutex
	byKey map[string]*liveSession
}

func (r *sessionRegistry) add(s *liveSession) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byKey == nil {
		r.byKey = map[string]*liveSession{}
	}
	r.byKey[s.key] = s
}

// setRef names the session by its secrets, and so its key and end id.
func (s *liveSession) setRef(ref SessionRef) {
	s.ref = ref
	s.key = ref.Key()
	s.endID = services.WebSessionEndID(s.key)
}

// byEndID returns the session the watch's end id names, nil if this
// proxy serves none by it.
func (r *sessionRegistry) byEndID(id string) *liveSession {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.byKey {
		if s.endID == id {
			return s
		}
	}
	return nil
}

func (r *sessionRegistry) get(key string) *liveSession {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byKey[key]
}

// remove drops a session and ends its terminals.
func (r *sessionRegistry) remove(key string) { r.removeCause(key, errLoggedOut) }

// closeAll ends every session's terminals (server shutdown).
func (r *sessionRegistry) closeAll() {
	r.mu.Lock()
	all := r.byKey
	r.byKey = nil
	r.mu.Unlock()
	for _, s := range all {
		s.cancel(errShuttingDown)
	}
}

func newLiveSession(priv ed25519.PrivateKey, resp *authapi.SSHLoginResponse, localCluster string) (*liveSession, error) {
	pub, _, _, _, err := ssh.ParseAuthorizedKey(resp.Cert)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	cert, ok := pub.(*ssh.Certificate)
	if !ok {
		return nil, trace.BadParameter("auth returned a plain key, not a certificate")
	}
	keySigner, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	signer, err := ssh.NewCertSigner(cert, keySigner)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	live := &liveSession{user: resp.Username, signer: signer, keySigner: keySigner, cert: cert}
	// This proxy's cluster; the certificate's own extension names the
	// same cluster for a login here, and stands in when the caller has no
	// name (tests of the registry alone).
	own := localCluster
	if own == "" {
		own = cert.Permissions.Extensions[services.CertExtensionCluster]
	}
	for _, hs := range resp.HostSigners {
		if own != "" && hs.ClusterName != "" && hs.ClusterName != own {
			// A leaf's host CA (host_signers lists every cluster's) must
			// never vouch for this cluster's nodes; a terminal to a leaf
			// checks that leaf's CA alone (leafHostKeys).
			continue
		}
		for _, k := range hs.CheckingKeys {
			ca, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
			if err != nil {
				return nil, trace.Wrap(err)
			}
			live.hostCAs = append(live.hostCAs, authz.HostAuthority{Key: ca, Patterns: authz.HostAuthorityPatterns(hs.ClusterName, localCluster)})
		}
	}
	return live, nil
}

// Causes that end a session's terminals, shown to the browser.
var (
	errLoggedOut    = errors.New("the web session ended (logged out or expired)")
	errShuttingDown = errors.New("the proxy is shutting down")
	// errShutdownGrace ends the terminals still open when the proxy's
	// shutdown_grace has passed: the shell is gone, and a new terminal
	// reaches the node through another proxy.
	errShutdownGrace = errors.New("the proxy shut down (its shutdown grace ended): this terminal was closed; open a new one to reach the node through another proxy")
)
