package proxy

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// AmbiguousHostError is returned by Route when a host matches several nodes
// and the strategy is unambiguous_match. Its message is the user-visible
// text of SPEC.md rule 5: a header line, then one line per candidate with
// what a user needs to pick one (uuid, addr, labels, last heartbeat).
//
// It unwraps to a *trace.BadParameterError, so trace.IsBadParameter holds;
// IsAmbiguousHost tells it apart from other bad parameters.
type AmbiguousHostError struct {
	// Host is the host as the user wrote it.
	Host string
	// Cluster is the cluster it was looked up in.
	Cluster string
	// Candidates are the matching nodes, sorted by UUID.
	Candidates []services.Node
}

// Error renders the message.
func (e *AmbiguousHostError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ambiguous host %q matches %d nodes in cluster %q; connect by UUID instead:", e.Host, len(e.Candidates), e.Cluster)
	for _, n := range e.Candidates {
		b.WriteString("\n  ")
		b.WriteString(CandidateLine(n))
	}
	return b.String()
}

// Unwrap makes trace.IsBadParameter recognise the error.
func (e *AmbiguousHostError) Unwrap() error {
	return &trace.BadParameterError{Message: e.Error()}
}

// IsAmbiguousHost reports whether err is (or wraps) an AmbiguousHostError.
func IsAmbiguousHost(err error) bool {
	var a *AmbiguousHostError
	return errors.As(err, &a)
}

// CandidateLine describes one node on one line:
// "UUID addr=ADDR labels=k=v,k2=v2 last_heartbeat=RFC3339".
func CandidateLine(n services.Node) string {
	return n.UUID + " addr=" + n.Addr + " labels=" + FormatLabels(n.Labels) + " last_heartbeat=" + formatHeartbeat(n.LastHeartbeat)
}

// FormatLabels renders labels as "k=v,k2=v2" sorted by key ("-" when none),
// the form `pctl nodes ls` uses too.
func FormatLabels(labels map[string]string) string {
	if len(labels) == 0 {
		return "-"
	}
	keys := slices.Sorted(maps.Keys(labels))
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(labels[k])
	}
	return b.String()
}

func formatHeartbeat(t time.Time) string {
	if t.IsZero() {
		return "unknown"
	}
	return t.UTC().Format(time.RFC3339)
}

func quoteHost(h string) string { return strconv.Quote(h) }
