package webterm

import (
	"reflect"
	"strings"
	"testing"

	"github.com/postern-dev/postern/lib/refdoc"
)

// jsonNames are the JSON field names of a wire struct.
func jsonNames(v any) []string {
	var out []string
	t := reflect.TypeOf(v)
	for i := 0; i < t.NumField(); i++ {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

// TestReferenceDocumentsTheProtocol fails when the web terminal's
// messages gain a field, or the protocol a frame type, that
// docs/reference.md's terminal section does not describe.
func TestReferenceDocumentsTheProtocol(t *testing.T) {
	sec := refdoc.Load(t).Section(t, "Web terminal protocol (`GET /webapi/terminal`)")
	sec.Section(t, "Terminal params").RequireCode(t, "terminal params", jsonNames(TerminalParams{})...)
	sec.Section(t, "First message").RequireCode(t, "first-message fields", jsonNames(AuthMessage{})...)
	sec.Section(t, "Session frame").RequireCode(t, "session frame fields", jsonNames(Session{})...)
	var frames []string
	for name, v := range refdoc.StringConsts(t, ".") {
		if strings.HasPrefix(name, "Frame") && len(v) == 1 {
			frames = append(frames, v)
		}
	}
	if len(frames) < 10 {
		t.Fatalf("found only the frame types %q", frames)
	}
	sec.Section(t, "Frames").RequireCode(t, "frame types", frames...)
	sec.RequireCode(t, "subprotocol", TerminalSubprotocol)
}
