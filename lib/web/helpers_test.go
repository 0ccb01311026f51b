package web

import (
	"net/http"

	"github.com/pquerna/otp"
)

// otpKeyFromURL extracts the TOTP secret from an otpauth:// URL.
func otpKeyFromURL(url string) (string, error) {
	key, err := otp.NewKeyFromURL(url)
	if err != nil {
		return "", err
	}
	return key.Secret(), nil
}

// recorder is a minimal http.ResponseWriter for handler-level tests.
type recorder struct {
	code   int
	header http.Header
	body   []byte
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(p []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	r.body = append(r.body, p...)
	return len(p), nil
}
func (r *recorder) WriteHeader(code int) { r.code = code }
