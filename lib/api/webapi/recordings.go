package webapi

import (
	"encoding/json"
	"fmt"
	"time"
)

// RecordingsResponse is GET /webapi/recordings: the recordings the user may
// see, newest first.
type RecordingsResponse struct {
	Items []RecordingItem `json:"items"`
}

// RecordingItem is one recording of a listing.
type RecordingItem struct {
	SessionID    string    `json:"session_id"`
	Started      time.Time `json:"started"`
	User         string    `json:"user"`
	Login        string    `json:"login"`
	Node         string    `json:"node"`
	NodeHostname string    `json:"node_hostname,omitempty"`
	Command      string    `json:"command,omitempty"`
	// Complete is false while the session runs and when its node died
	// before the final chunk (the recording is incomplete).
	Complete bool   `json:"complete"`
	Chunks   int    `json:"chunks"`
	Cols     uint32 `json:"cols"`
	Rows     uint32 `json:"rows"`
}

// RecordingIndex is GET /webapi/recordings/{id}/index: asciinema-player's
// segmented recording index (version 1), plus Postern's fields.
type RecordingIndex struct {
	Version  int                   `json:"version"`
	Duration float64               `json:"duration"`
	Term     RecordingTerm         `json:"term"`
	Segments []RecordingSegmentRef `json:"segments"`
	Markers  []RecordingMarker     `json:"markers"`
	Postern  RecordingInfo         `json:"postern"`
}

// RecordingTerm is the terminal size at the start.
type RecordingTerm struct {
	Cols uint32 `json:"cols"`
	Rows uint32 `json:"rows"`
}

// RecordingSegmentRef is where a segment starts (seconds) and its URL,
// relative to the index.
type RecordingSegmentRef struct {
	Start float64 `json:"start"`
	URL   string  `json:"url"`
}

// RecordingMarker is a marker event; it is written as [time, label].
type RecordingMarker struct {
	Time  float64
	Label string
}

// MarshalJSON writes [time, label].
func (m RecordingMarker) MarshalJSON() ([]byte, error) {
	return json.Marshal([]any{m.Time, m.Label})
}

// RecordingInfo is what the player page shows beside the player.
type RecordingInfo struct {
	SessionID    string    `json:"session_id"`
	User         string    `json:"user"`
	Login        string    `json:"login"`
	Node         string    `json:"node"`
	NodeHostname string    `json:"node_hostname,omitempty"`
	Command      string    `json:"command,omitempty"`
	Started      time.Time `json:"started"`
	Complete     bool      `json:"complete"`
	Chunks       int       `json:"chunks"`
	// Integrity is empty when the hash chain checked out as far as it was
	// read, else what is wrong (pctl recordings verify names the chunk).
	Integrity string `json:"integrity,omitempty"`
	// Verification is the verdict on the hash chain of the chunks read so
	// far, which the player shows above the recording.
	Verification RecordingVerification `json:"verification"`
}

// RecordingVerification is what the proxy found checking a recording's
// hash chain.
type RecordingVerification struct {
	// State is "verified", "incomplete" (no final chunk: the session runs
	// or its node died; not tampering) or "tampered".
	State string `json:"state"`
	// Chunks and Bytes are what the chain vouches for, from the start;
	// Until is the time of its last event (where a tampered recording
	// stops being vouched for).
	Chunks int     `json:"chunks"`
	Bytes  int64   `json:"bytes"`
	Until  float64 `json:"until"`
	// Audited is true when the chain was checked against the session.end
	// audit event's final hash (the web does not: pctl recordings verify).
	Audited bool `json:"audited"`
	// BrokenChunk, Problem and Reason say where and how the chain breaks
	// (tampered only).
	BrokenChunk *int   `json:"broken_chunk,omitempty"`
	Problem     string `json:"problem,omitempty"`
	Reason      string `json:"reason,omitempty"`
	// Summary is the verdict in one sentence.
	Summary string `json:"summary"`
}

// RecordingSnapshot is a segment's starting screen: replaying Init on a
// reset terminal of that size rebuilds it.
type RecordingSnapshot struct {
	Cols uint32 `json:"cols"`
	Rows uint32 `json:"rows"`
	Init string `json:"init"`
}

// UnmarshalJSON reads [time, label].
func (m *RecordingMarker) UnmarshalJSON(b []byte) error {
	var pair []json.RawMessage
	if err := json.Unmarshal(b, &pair); err != nil || len(pair) != 2 {
		return fmt.Errorf("marker: want [time, label]")
	}
	if err := json.Unmarshal(pair[0], &m.Time); err != nil {
		return fmt.Errorf("marker time: %w", err)
	}
	if err := json.Unmarshal(pair[1], &m.Label); err != nil {
		return fmt.Errorf("marker label: %w", err)
	}
	return nil
}

// RecordingMarkers is GET /webapi/recordings/{id}/markers.
type RecordingMarkers struct {
	Markers []RecordingMarker `json:"markers"`
	// Verification is the index's verdict on the hash chain, for the
	// banner the player page shows before the player opens.
	Verification RecordingVerification `json:"verification"`
}
