package integration

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/service"
)

// TestLockedUserLoginSaysLocked is issue 24 item 11: a locked user who
// gives the right password is told that access is locked and why, by psh
// login and by the web login (both endpoints), as the SSH refusal says;
// with a wrong password the answer stays "invalid credentials", so the
// lock is never revealed to someone who does not hold the password.
func TestLockedUserLoginSaysLocked(t *testing.T) {
	c := newAllInOne(t)
	e := newPshEnv(t, c)
	webAddr := c.p.Addr(service.ListenerWeb).String()
	hc := c.webClientFrom(t, "127.0.0.1")

	mustPctl(t, c.dataDir, "", "lock", "--user", "alice", "--ttl", "10m", "--message", "incident 42")
	const want = "postern: access for user alice is locked: incident 42"

	// psh login, wrong password: nothing about the lock.
	_, errOut, code := e.run(t, "wrong\n", "login", "--proxy", e.webAddr(), "--user", "alice", "--cacert", e.caCert())
	require.Equal(t, 1, code)
	requireOneLineError(t, errOut, "invalid credentials")
	require.NotContains(t, errOut, "locked")
	// The right password: the lock and its reason.
	_, errOut, code = e.run(t, alicePassword+"\n", "login", "--proxy", e.webAddr(), "--user", "alice", "--cacert", e.caCert())
	require.Equal(t, 1, code)
	requireOneLineError(t, errOut, want)
	require.NotContains(t, errOut, "invalid credentials")

	// The web login and the CLI's endpoint, over HTTP.
	webLoginStatus := func(password string) (int, string) {
		resp, err := hc.Post("https://"+webAddr+"/webapi/sessions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"user":"alice","password":%q,"otp_token":""}`, password)))
		require.NoError(t, err)
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(data)
	}
	status, body := webLoginStatus("wrong")
	require.Equal(t, http.StatusUnauthorized, status, body)
	require.Contains(t, body, "invalid credentials")
	require.NotContains(t, body, "locked")
	status, body = webLoginStatus(alicePassword)
	require.Equal(t, http.StatusForbidden, status, body)
	require.Contains(t, body, want)

	status, body, err := postCerts(t, hc, webAddr, "alice", "wrong")
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, status, body)
	require.NotContains(t, body, "locked")
	status, body, err = postCerts(t, hc, webAddr, "alice", alicePassword)
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, status, body)
	require.Contains(t, body, want)

	// Unlocked, the same password logs in.
	mustPctl(t, c.dataDir, "", "unlock", "--user", "alice")
	e.login(t, "alice", alicePassword+"\n")
}
