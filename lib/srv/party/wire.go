package party

import "github.com/postern-dev/postern/lib/api/sessionapi"

// The wire names live in lib/api/sessionapi, which clients link without
// linking the node; these are the node's names for them.
type (
	// Mode is how a party takes part in a session.
	Mode = sessionapi.Mode
	// Info is what a listing shows of a session.
	Info = sessionapi.Info
)

// Join modes.
const (
	Observer  = sessionapi.Observer
	Peer      = sessionapi.Peer
	Moderator = sessionapi.Moderator
)

// Subsystem names.
const (
	JoinPrefix    = sessionapi.JoinPrefix
	ListSubsystem = sessionapi.ListSubsystem
)

// Parsers and builders of the wire names.
var (
	ParseMode        = sessionapi.ParseMode
	ParseSessionID   = sessionapi.ParseSessionID
	ParseJoinRequest = sessionapi.ParseJoinRequest
	JoinSubsystem    = sessionapi.JoinSubsystem
)
