package proxy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// AmbiguousHostError is returned by Route when a host matches several nodes
// and the strategy is unambiguous_match. Its message is the user-visible
// text of routing rule 5 (docs/reference.md, Routing): a header line, then one line per candidate with
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
// "UUID addr=ADDR labels=k=v,k2=v2 last_heartbeat=RFC3339". Node-supplied
// text is escaped (services.EscapeText): this line reaches terminals.
func CandidateLine(n services.Node) string {
	return services.EscapeText(n.UUID) + " addr=" + services.EscapeText(n.Addr) + " labels=" + services.FormatLabels(n.Labels) + " last_heartbeat=" + formatHeartbeat(n.LastHeartbeat)
}

func formatHeartbeat(t time.Time) string {
	if t.IsZero() {
		return "unknown"
	}
	return t.UTC().Format(time.RFC3339)
}

func quoteHost(h string) string { return strconv.Quote(h) }
