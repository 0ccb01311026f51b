package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
)

type body struct {
	User  string   `json:"user"`
	N     int      `json:"n"`
	Items []string `json:"items,omitempty"`
}

func TestUnmarshalStrict(t *testing.T) {
	for _, tc := range []struct {
		name, in, err string
		want          body
	}{
		{name: "object", in: `{"user":"alice","n":2}`, want: body{User: "alice", N: 2}},
		{name: "white space around", in: " \n{\"user\":\"a\"}\n\t", want: body{User: "a"}},
		{name: "empty", in: "", err: "empty body"},
		{name: "only white space", in: " \r\n\t", err: "empty body"},
		{name: "unknown field", in: `{"user":"a","admin":true}`, err: `unknown field "admin"`},
		{name: "second object", in: `{"user":"a"}{"user":"b"}`, err: "trailing data after the JSON object"},
		{name: "trailing garbage", in: `{"user":"a"} x`, err: "trailing data after the JSON object"},
		{name: "trailing bracket", in: `{"user":"a"}]`, err: "trailing data after the JSON object"},
		{name: "wrong type", in: `{"n":"two"}`, err: "json: "},
		{name: "truncated", in: `{"user":"a"`, err: "unexpected EOF"},
		{name: "not JSON", in: `user=a`, err: "invalid character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got body
			err := UnmarshalStrict([]byte(tc.in), &got)
			if tc.err == "" {
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
				return
			}
			require.Error(t, err)
			require.True(t, trace.IsBadParameter(err), "%T %v", trace.Unwrap(err), err)
			require.Contains(t, err.Error(), tc.err)
		})
	}
}

func TestReadJSON(t *testing.T) {
	const limit = 32
	t.Run("fits", func(t *testing.T) {
		var got body
		in := `{"user":"` + strings.Repeat("a", limit-11) + `"}`
		require.Len(t, in, limit)
		require.NoError(t, ReadJSON(strings.NewReader(in), limit, &got))
		require.Equal(t, strings.Repeat("a", limit-11), got.User)
	})
	t.Run("one byte too many", func(t *testing.T) {
		var got body
		in := `{"user":"` + strings.Repeat("a", limit-10) + `"}`
		err := ReadJSON(strings.NewReader(in), limit, &got)
		require.True(t, trace.IsLimitExceeded(err), "%v", err)
		require.Equal(t, "request body too large", trace.UserMessage(err))
	})
	t.Run("behind MaxBytesReader", func(t *testing.T) {
		// The auth API bounds bodies with http.MaxBytesReader before the
		// handler reads them: its error must read the same as ours.
		rec := httptest.NewRecorder()
		r := http.MaxBytesReader(rec, ioNopCloser{strings.NewReader(strings.Repeat(" ", 2*limit))}, limit)
		var got body
		err := ReadJSON(r, 4*limit, &got)
		require.True(t, trace.IsLimitExceeded(err), "%v", err)
	})
	t.Run("empty", func(t *testing.T) {
		var got body
		err := ReadJSON(strings.NewReader(""), limit, &got)
		require.True(t, trace.IsBadParameter(err), "%v", err)
		require.Equal(t, "empty request body", trace.UserMessage(err))
	})
	t.Run("unknown field", func(t *testing.T) {
		var got body
		err := ReadJSON(strings.NewReader(`{"admin":true}`), limit, &got)
		require.True(t, trace.IsBadParameter(err), "%v", err)
		require.Equal(t, `invalid request body: json: unknown field "admin"`, trace.UserMessage(err))
	})
}

type ioNopCloser struct{ *strings.Reader }

func (ioNopCloser) Close() error { return nil }

// FuzzUnmarshalStrict checks what UnmarshalStrict promises against the
// standard library: whatever it accepts is one valid JSON value that
// encoding/json decodes to the same thing, and whatever follows an accepted
// value makes it fail. Seeds: testdata/fuzz/FuzzUnmarshalStrict.
func FuzzUnmarshalStrict(f *testing.F) {
	for _, s := range []string{`{"user":"a","n":1}`, `{"items":["x"]}`, `{}`, ` {"user":"\u00e9"} `, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var strict body
		err := UnmarshalStrict(data, &strict)
		if err != nil {
			require.True(t, trace.IsBadParameter(err), "%v", err)
			return
		}
		require.True(t, json.Valid(data), "accepted invalid JSON %q", data)
		var loose body
		require.NoError(t, json.Unmarshal(data, &loose))
		require.Equal(t, loose, strict)
		var again body
		glued := append(bytes.Clone(data), []byte(`{}`)...)
		require.Error(t, UnmarshalStrict(glued, &again), "accepted %q", glued)
	})
}
