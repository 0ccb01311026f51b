package events

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/refdoc"
)

// eventTypeValue is how an event type is spelled: dotted snake_case
// ("session.end", "host.join.failed").
var eventTypeValue = regexp.MustCompile(`^[a-z_]+(\.[a-z_]+)+$`)

// notEventTypes are string constants of this package that look like an
// event type and are not one.
var notEventTypes = []string{"FileName"}

// TestReferenceDocumentsEveryEvent fails when a new audit event type or
// field name is not in docs/reference.md's audit section.
func TestReferenceDocumentsEveryEvent(t *testing.T) {
	consts := refdoc.StringConsts(t, ".")
	var types, fields []string
	for name, v := range consts {
		switch {
		case strings.HasPrefix(name, "Field"):
			fields = append(fields, v)
		case eventTypeValue.MatchString(v) && !slices.Contains(notEventTypes, name):
			types = append(types, v)
		}
	}
	slices.Sort(types)
	slices.Sort(fields)
	// The scan must find what is known to be there.
	require.Contains(t, types, SessionEnd)
	require.Contains(t, types, RecordingFailed)
	require.Contains(t, fields, FieldRecordingReason)
	sec := refdoc.Load(t).Section(t, "Audit events")
	sec.RequireCode(t, "audit event types", types...)
	sec.RequireCode(t, "audit event fields", fields...)
}
