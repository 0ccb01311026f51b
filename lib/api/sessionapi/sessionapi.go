// Package sessionapi is the wire format of shared sessions, spoken by
// the node (lib/srv/party) and its clients (psh, the web API): the join
// and list subsystems' names, the join modes and the listing entry.
package sessionapi

import (
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/gravitational/trace"
)

// Mode is how a party takes part in a session.
type Mode string

const (
	// Observer sees the output and cannot type.
	Observer Mode = "observer"
	// Peer sees the output and may type.
	Peer Mode = "peer"
	// Moderator may type and may end the session for everyone; only
	// moderators count for a session that requires them.
	Moderator Mode = "moderator"
)

// Modes are the modes, in order of what they allow.
var Modes = []Mode{Observer, Peer, Moderator}

// ParseMode reads a mode as a user writes it.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", trace.BadParameter("unknown session join mode %q (want observer, peer or moderator)", s)
}

// ParseSessionID checks a session id from outside (a join request): the
// node's session ids are UUIDs, and anything else is refused before it
// is looked up or logged.
func ParseSessionID(s string) (string, error) {
	if len(s) != 36 {
		return "", trace.BadParameter("malformed session id %q: want a UUID", truncate(s))
	}
	u, err := uuid.Parse(s)
	if err != nil {
		return "", trace.BadParameter("malformed session id %q: want a UUID", truncate(s))
	}
	return u.String(), nil
}

func truncate(s string) string {
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}

// Info is what a listing shows of a session.
type Info struct {
	ID           string    `json:"id"`
	User         string    `json:"user"`
	Login        string    `json:"login"`
	Node         string    `json:"node"`
	Started      time.Time `json:"started"`
	Participants []string  `json:"participants"`
}

// JoinPrefix starts the subsystem name that joins a session:
// "join@SESSION_ID", or "join@SESSION_ID/MODE" (observer when left out).
const JoinPrefix = "join@"

// JoinSubsystem is the subsystem name that joins session id in mode.
func JoinSubsystem(id string, mode Mode) string { return JoinPrefix + id + "/" + string(mode) }

// ParseJoinRequest reads a join subsystem name from a client. Anything
// but a well-formed UUID and a known mode is refused, with what was
// wrong named, before anything is looked up.
func ParseJoinRequest(name string) (id string, mode Mode, err error) {
	rest, ok := strings.CutPrefix(name, JoinPrefix)
	if !ok {
		return "", "", trace.BadParameter("not a join request: %q", truncate(name))
	}
	rawID, rawMode, hasMode := strings.Cut(rest, "/")
	if id, err = ParseSessionID(rawID); err != nil {
		return "", "", err
	}
	mode = Observer
	if hasMode {
		if mode, err = ParseMode(rawMode); err != nil {
			return "", "", err
		}
	}
	return id, mode, nil
}

// ListSubsystem is the node subsystem that lists the live sessions the
// caller may join (a JSON array of Info).
const ListSubsystem = "sessions"
