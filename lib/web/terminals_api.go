package web

import (
	"net/http"
	"time"

	"github.com/gravitational/trace"
)

// TerminalItem is one entry of GET /webapi/terminals.
type TerminalItem struct {
	ID           string    `json:"id"`
	Node         string    `json:"node"`
	NodeHostname string    `json:"node_hostname"`
	Cluster      string    `json:"cluster"`
	Login        string    `json:"login"`
	Started      time.Time `json:"started"`
	BytesOut     uint64    `json:"bytes_out"`
	BytesIn      uint64    `json:"bytes_in"`
	// State is "attached" or "detached".
	State string `json:"state"`
}

// TerminalsResponse is GET /webapi/terminals.
type TerminalsResponse struct {
	Items []TerminalItem `json:"items"`
}

// ResumeTokenResponse is POST /webapi/terminals/{id}/resume.
type ResumeTokenResponse struct {
	Resume string `json:"resume"`
}

// listTerminals serves GET /webapi/terminals: the terminals of the
// caller's web session on this proxy, attached and detached. Another web
// session's terminals (even the same user's) are not listed: they are
// bound to that session's key.
func (s *Server) listTerminals(w http.ResponseWriter, r *http.Request, live *liveSession) {
	out := TerminalsResponse{Items: []TerminalItem{}}
	for _, t := range s.web.terms.list(live) {
		t.mu.Lock()
		item := TerminalItem{
			ID: t.id, Node: t.nodeUUID, NodeHostname: t.nodeHostname, Cluster: t.cluster, Login: t.params.Login,
			Started: t.started.UTC(), BytesOut: t.hist.end(), BytesIn: t.input, State: "detached",
		}
		if t.att != nil {
			item.State = "attached"
		}
		t.mu.Unlock()
		out.Items = append(out.Items, item)
	}
	writeJSON(w, http.StatusOK, out)
}

// endTerminal serves DELETE /webapi/terminals/{id}: the terminal ends as
// if its browser had closed it.
func (s *Server) endTerminal(w http.ResponseWriter, r *http.Request, live *liveSession) {
	t, err := s.web.terms.get(live, r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusNotFound, trace.UserMessage(err))
		return
	}
	t.cancel(&sessionEnd{code: -1, reason: "ended from the sessions list"})
	<-t.done
	w.WriteHeader(http.StatusNoContent)
}

// resumeTerminal serves POST /webapi/terminals/{id}/resume: a fresh
// resume token for a terminal of the caller's own web session (the
// sessions list's "resume" in a tab that does not hold the token). The
// previous token stops working, as on every resume.
func (s *Server) resumeTerminal(w http.ResponseWriter, r *http.Request, live *liveSession) {
	t, err := s.web.terms.get(live, r.PathValue("id"))
	if err == nil && !t.resumable {
		err = trace.NotFound("terminal %q is not resumable", t.id)
	}
	var token string
	if err == nil {
		token, err = s.web.terms.rotate(t)
	}
	if err != nil {
		writeError(w, http.StatusNotFound, trace.UserMessage(err))
		return
	}
	writeJSON(w, http.StatusOK, ResumeTokenResponse{Resume: token})
}
