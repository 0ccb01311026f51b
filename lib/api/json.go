package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/gravitational/trace"
)

// UnmarshalStrict decodes data, which must be exactly one JSON value, into
// v. It is the one decoder for bodies that come from a peer (a request, a
// websocket frame):
//
//   - a field v does not have is refused, so a client's typo or a field
//     from a newer client is an error, not a setting silently ignored;
//   - anything after the value is refused ("{...}{...}" or "{...} x"),
//     so two objects glued together cannot be read as the first one while
//     a different parser in front of us reads the second;
//   - an empty body (or only white space) is refused with its own message.
//
// Every error is trace.BadParameter; its message says what was wrong
// ("empty body", encoding/json's `json: unknown field "x"`, "trailing data
// after the JSON object"), names only what the sender sent, and is meant
// to follow the caller's own prefix ("invalid login request: ...").
func UnmarshalStrict(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return trace.BadParameter("empty body")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return trace.BadParameter("%v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return trace.BadParameter("trailing data after the JSON object")
	}
	return nil
}

// ReadJSON reads a request body, at most limit bytes of r, and decodes it
// with UnmarshalStrict. A longer body is trace.LimitExceeded("request body
// too large"), whether this function or an http.MaxBytesReader in front of
// it noticed; an empty one is trace.BadParameter("empty request body"); any
// other refusal is trace.BadParameter("invalid request body: ...").
func ReadJSON(r io.Reader, limit int64, v any) error {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return trace.LimitExceeded("request body too large")
		}
		return trace.BadParameter("could not read request body")
	}
	if int64(len(data)) > limit {
		return trace.LimitExceeded("request body too large")
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return trace.BadParameter("empty request body")
	}
	if err := UnmarshalStrict(data, v); err != nil {
		return trace.BadParameter("invalid request body: %v", trace.UserMessage(err))
	}
	return nil
}
