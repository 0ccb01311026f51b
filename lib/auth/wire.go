package auth

import (
	"encoding/json"
	"net/http"

	"github.com/postern-dev/postern/lib/api/authapi"
)

// The error format (authapi.ErrorResponse) and its kinds live in authapi,
// shared with the client that reads them back.

func writeError(w http.ResponseWriter, err error) {
	_, status := authapi.ErrorKind(err)
	writeJSON(w, status, authapi.ErrorResponse{Error: authapi.NewErrorBody(err)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
