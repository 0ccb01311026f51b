package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/pquerna/otp/totp"
	"github.com/stretchr/testify/require"
)

// TestAuthPreferenceSecondFactor: an admin requires a second factor with
// auth_preference; psh then asks every user for a code, a user without
// one cannot log in, reset-mfa takes a lost factor away, and removing the
// preference returns to per-user enrolment.
func TestAuthPreferenceSecondFactor(t *testing.T) {
	c := newAllInOne(t)
	out := mustPctl(t, c.dataDir, "otp password 1\n", "users", "add", "bob", "--logins", c.login, "--otp")
	m := regexp.MustCompile(`secret=([A-Z2-7]+)`).FindStringSubmatch(out)
	require.NotNil(t, m, out)

	pref := filepath.Join(t.TempDir(), "pref.yaml")
	require.NoError(t, os.WriteFile(pref, []byte("kind: auth_preference\nspec:\n  second_factor: otp\n"), 0o600))
	require.Contains(t, mustPctl(t, c.dataDir, "", "create", "-f", pref), "auth_preference saved")
	require.Contains(t, mustPctl(t, c.dataDir, "", "get", "auth_preference"), "second_factor: otp")

	e := newPshEnv(t, c)
	// alice has no factor: refused while one is required.
	_, errOut, code := e.run(t, alicePassword+"\n\n", "login", "--proxy", e.webAddr(), "--user", "alice", "--cacert", e.caCert())
	require.Equal(t, 1, code)
	requireOneLineError(t, errOut, "invalid credentials")
	// bob's code works.
	code6, err := totp.GenerateCode(m[1], time.Now())
	require.NoError(t, err)
	e.login(t, "bob", "otp password 1\n"+code6+"\n")

	// A lost phone: the admin removes bob's factors, listed before.
	require.Regexp(t, `(?m)^bob\s.*\sotp\s+local\s*$`, mustPctl(t, c.dataDir, "", "users", "ls"))
	require.Contains(t, mustPctl(t, c.dataDir, "", "users", "reset-mfa", "bob"), "Removed 1 second factor")
	require.Regexp(t, `(?m)^bob\s.*\s-\s+local\s*$`, mustPctl(t, c.dataDir, "", "users", "ls"))

	// Without the preference alice logs in with her password alone.
	require.Contains(t, mustPctl(t, c.dataDir, "", "rm", "auth_preference"), "auth_preference removed")
	e2 := newPshEnv(t, c)
	e2.login(t, "alice", alicePassword+"\n")
}
