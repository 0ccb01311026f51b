package web

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// brokenAuth is a fake of the narrow SSHLoginAuthenticator: auth answers
// with an error of no known kind (a bug, a corrupt record).
type brokenAuth struct{ err error }

func (b brokenAuth) AuthenticateSSHUser(context.Context, authapi.SSHLoginRequest) (*authapi.SSHLoginResponse, error) {
	return nil, b.err
}

func (b brokenAuth) CreateSSOAuthRequest(context.Context, authapi.SSOAuthRequest) (*authapi.SSOAuthResponse, error) {
	return nil, b.err
}

func (b brokenAuth) ValidateSSOCallback(context.Context, authapi.SSOCallbackRequest) (*authapi.SSOCallbackResponse, error) {
	return nil, b.err
}

func (b brokenAuth) GetSSOConnectors(context.Context) ([]authapi.SSOConnectorInfo, error) {
	return nil, b.err
}

// failingStore is a session store whose backend refuses every write.
type failingStore struct {
	SessionStore
	err error
}

func (f failingStore) CreateSession(context.Context, SessionRef, SessionRecord) error { return f.err }

// noRoutes and noNodes stand in for the router and node list, which a
// login never calls.
type noRoutes struct{}

func (noRoutes) DialHost(context.Context, proxy.RouteRequest) (net.Conn, proxy.Route, error) {
	return nil, proxy.Route{}, errors.New("not dialed in this test")
}

type noNodes struct{}

func (noNodes) GetNodes(context.Context, string) ([]services.Node, error) { return nil, nil }

var requestIDAnswer = regexp.MustCompile(`^internal error \(request id ([0-9a-f]{16})\); see the proxy's log$`)

// TestInternalErrorNamesRequestID: where the web API answers "see the
// proxy's log", the log really has the cause, under the request id the
// user was shown, and the answer has nothing of the cause.
func TestInternalErrorNamesRequestID(t *testing.T) {
	ctx := context.Background()
	env := newLoginEnv(t)
	_, err := env.auth.CreateUser(ctx, testUser, []byte(testPassword), []string{"alice"}, nil, false)
	require.NoError(t, err)
	pair, err := LoadOrCreateTLS(t.TempDir(), "", "", nil, time.Now())
	require.NoError(t, err)
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)

	for _, tc := range []struct {
		name, path, body string
		auth             SSHLoginAuthenticator
		sessions         SessionStore
		cause            string
	}{{
		name: "psh login, auth fails oddly", path: "/webapi/ssh/certs",
		body:  `{"user":"alice","password":"x","otp_token":"","pub_key":"` + strings.TrimSpace(string(pub)) + `","ttl_seconds":60}`,
		auth:  brokenAuth{errors.New("record 17 of /users is corrupt")},
		cause: "record 17 of /users is corrupt",
	}, {
		name: "web login, session store down", path: "/webapi/sessions",
		body:     `{"user":"alice","password":"` + testPassword + `","otp_token":""}`,
		auth:     env.auth,
		sessions: failingStore{err: errors.New("sqlite: disk I/O error")},
		cause:    "sqlite: disk I/O error",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			logger, hook := logtest.NewNullLogger()
			wsc := WebSessionsConfig{Router: noRoutes{}, Nodes: noNodes{}, Roles: env.store, Store: tc.sessions}
			s, err := NewServer(Config{
				ClusterName: "c1", ProxySSHAddr: "127.0.0.1:3023", Certificate: pair, Auth: tc.auth, WebSessions: wsc,
				Deps: observe.Deps{Clock: env.clock, Logger: logger.WithField("component", "web")},
			})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, s.Shutdown(ctx)) })

			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body))
			s.srv.Handler.ServeHTTP(rec, req)
			require.Equal(t, http.StatusInternalServerError, rec.Code, rec.Body.String())
			var answer struct{ Error string }
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &answer))
			m := requestIDAnswer.FindStringSubmatch(answer.Error)
			require.NotNil(t, m, "answer %q names no request id", answer.Error)
			require.NotContains(t, answer.Error, tc.cause, "the cause is for the log, not the user")

			var logged *logrus.Entry
			for _, e := range hook.AllEntries() {
				if e.Data["request_id"] == m[1] {
					logged = e
				}
			}
			require.NotNil(t, logged, "no log line has request_id %s", m[1])
			require.Contains(t, logged.Data[logrus.ErrorKey].(error).Error(), tc.cause)
			require.Equal(t, testUser, logged.Data["user"])
		})
	}
}
