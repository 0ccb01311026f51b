package web

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webapi"
)

// browser is one browser's cookie jar against the env: its tabs share
// the cookies, each tab holds its own token (sessionStorage).
type browser struct {
	e  *termEnv
	hc *http.Client
}

func (e *termEnv) browser(t *testing.T) *browser {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &browser{e: e, hc: &http.Client{Transport: e.http.Transport, Jar: jar}}
}

// do sends a request as a page of this site would (Sec-Fetch-Site
// same-origin unless hdr says otherwise), with token as the bearer.
func (b *browser) do(t *testing.T, method, path, body, token string, hdr http.Header) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, b.e.url+path, rd)
	require.NoError(t, err)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for k, v := range hdr {
		req.Header[k] = v
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := b.hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, data
}

// login logs a tab in and returns its token.
func (b *browser) login(t *testing.T) string {
	t.Helper()
	code, body := b.do(t, http.MethodPost, "/webapi/sessions", fmt.Sprintf(`{"user":%q,"password":%q,"otp_token":""}`, testUser, testPassword), "", nil)
	require.Equal(t, http.StatusOK, code, string(body))
	var out webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &out))
	return out.Token
}

// newTab asks for the browser's session token as a new tab does.
func (b *browser) newTab(t *testing.T, hdr http.Header) (int, webapi.CreateSessionResponse, string) {
	t.Helper()
	code, body := b.do(t, http.MethodPost, "/webapi/sessions/token", "", "", hdr)
	var out webapi.CreateSessionResponse
	if code == http.StatusOK {
		require.NoError(t, json.Unmarshal(body, &out))
	}
	return code, out, string(body)
}

func (b *browser) nodes(t *testing.T, token string) int {
	t.Helper()
	code, _ := b.do(t, http.MethodGet, "/webapi/nodes", "", token, nil)
	return code
}

// TestSecondTabLoginKeepsTheFirst: a second login in the same browser
// (another tab) leaves the first tab's session working, and logging the
// second out leaves the first alone too. With one browser-wide cookie the
// second login replaced the first tab's cookie, and the first tab was
// logged out.
func TestSecondTabLoginKeepsTheFirst(t *testing.T) {
	e := newTermEnv(t)
	b := e.browser(t)
	first := b.login(t)
	require.Equal(t, http.StatusOK, b.nodes(t, first))
	second := b.login(t)
	require.NotEqual(t, first, second)
	require.Equal(t, http.StatusOK, b.nodes(t, first), "the first tab after the second tab's login")
	require.Equal(t, http.StatusOK, b.nodes(t, second))

	code, _ := b.do(t, http.MethodDelete, "/webapi/sessions", "", second, nil)
	require.Equal(t, http.StatusNoContent, code)
	require.Equal(t, http.StatusUnauthorized, b.nodes(t, second), "the second tab logged out")
	require.Equal(t, http.StatusOK, b.nodes(t, first), "the first tab after the second tab's logout")

	// Another browser's cookies do not make a token work.
	other := e.browser(t)
	other.login(t)
	require.Equal(t, http.StatusUnauthorized, other.nodes(t, first))
}

// TestNewTabAdoptsTheBrowserSession: a new tab (cookies, no token) gets
// the token of the browser's latest login from POST /webapi/sessions/token,
// only as a same-origin request; a browser without a live session is told
// to log in.
func TestNewTabAdoptsTheBrowserSession(t *testing.T) {
	e := newTermEnv(t)
	b := e.browser(t)

	code, _, body := b.newTab(t, nil)
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, body, msgNoBrowserSession)

	first := b.login(t)
	code, got, body := b.newTab(t, nil)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, first, got.Token)
	require.Equal(t, testUser, got.User)
	require.Equal(t, http.StatusOK, b.nodes(t, got.Token), "the adopted token works")

	// Cross-site and same-site (a sibling subdomain) requests, and a
	// foreign Origin, are refused without a token.
	for _, hdr := range []http.Header{
		{"Sec-Fetch-Site": {"cross-site"}},
		{"Sec-Fetch-Site": {"same-site"}},
		{"Sec-Fetch-Site": {"none"}},
		{"Origin": {"https://evil.example"}},
	} {
		code, got, body := b.newTab(t, hdr)
		require.Equal(t, http.StatusForbidden, code, "%v: %s", hdr, body)
		require.Empty(t, got.Token)
		require.NotContains(t, body, first)
	}
	// Not a GET: no <img> or <script> can make it.
	code, body2 := b.do(t, http.MethodGet, "/webapi/sessions/token", "", "", nil)
	require.NotEqual(t, http.StatusOK, code)
	require.NotContains(t, string(body2), first)

	// The latest login is the one adopted; when it is logged out, the
	// earlier one, still live in its tab, is.
	second := b.login(t)
	_, got, _ = b.newTab(t, nil)
	require.Equal(t, second, got.Token)
	code, _ = b.do(t, http.MethodDelete, "/webapi/sessions", "", second, nil)
	require.Equal(t, http.StatusNoContent, code)
	_, got, _ = b.newTab(t, nil)
	require.Equal(t, first, got.Token)

	code, _ = b.do(t, http.MethodDelete, "/webapi/sessions", "", first, nil)
	require.Equal(t, http.StatusNoContent, code)
	code, _, _ = b.newTab(t, nil)
	require.Equal(t, http.StatusUnauthorized, code, "every session logged out")
}
