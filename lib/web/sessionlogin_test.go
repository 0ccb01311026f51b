package web

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCreateSessionRefusesTrailingData: the browser login reads its body
// with the one strict decoder, like every other endpoint: a second object
// glued after the first (which a different parser in front of the proxy
// might read instead) is refused, not ignored.
func TestCreateSessionRefusesTrailingData(t *testing.T) {
	e := newTermEnv(t)
	good := fmt.Sprintf(`{"user":%q,"password":%q,"otp_token":""}`, testUser, testPassword)
	for _, body := range []string{good + `{"user":"mallory"}`, good + ` x`, good[:len(good)-1] + `,"admin":true}`, ``} {
		resp, data := e.do(t, http.MethodPost, "/webapi/sessions", body, webSession{}, nil)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", body, data)
		require.Empty(t, resp.Cookies(), body)
	}
	resp, data := e.do(t, http.MethodPost, "/webapi/sessions", good, webSession{}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(data))
}
