package sshproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/srv"
)

// RecordingSource reads recordings from auth (auth.Client as the proxy).
type RecordingSource interface {
	ListRecordings(ctx context.Context) ([]recording.Meta, error)
	GetRecording(ctx context.Context, session string, fn func(recording.Chunk) error) error
}

// errRecordingNotFound is the one answer for a recording that does not
// exist and one the caller may not see.
func errRecordingNotFound(id string) error {
	return trace.NotFound("recording %q not found", id)
}

// recordingsSubsystem serves SubsystemRecordings: the caller's recordings
// (all of them for a reviewer).
func (h *Handler) recordingsSubsystem(ctx context.Context, id *authz.Identity) (srv.SubsystemFunc, error) {
	if h.cfg.Recordings == nil {
		return nil, trace.NotImplemented("this proxy does not serve recordings")
	}
	list, err := h.cfg.Recordings.ListRecordings(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	out := []proxyapi.RecordingEntry{}
	for _, m := range list {
		if !id.CanViewRecording(m.User) {
			continue
		}
		node := m.NodeHostname
		if node == "" {
			node = m.Node
		}
		out = append(out, proxyapi.RecordingEntry{
			SessionID: m.SessionID, Started: time.Unix(m.Timestamp, 0).UTC(), User: m.User,
			Login: m.Login, Node: node, Command: m.Command, Complete: m.Complete,
		})
	}
	return func(ctx context.Context, ch ssh.Channel) error {
		data, err := json.Marshal(out)
		if err != nil {
			return trace.Wrap(err)
		}
		_, err = ch.Write(data)
		return trace.Wrap(err)
	}, nil
}

// playSubsystem serves SubsystemRecordingPrefix+ID: the recording as an
// asciicast file, streamed chunk by chunk. Every playback is audited.
func (h *Handler) playSubsystem(ctx context.Context, id *authz.Identity, name string) (srv.SubsystemFunc, error) {
	if h.cfg.Recordings == nil {
		return nil, trace.NotImplemented("this proxy does not serve recordings")
	}
	sid, err := h.authorizePlay(ctx, id, strings.TrimPrefix(name, proxyapi.SubsystemRecordingPrefix))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return func(ctx context.Context, ch ssh.Channel) error {
		var tail recording.ExportTail
		err := h.cfg.Recordings.GetRecording(ctx, sid, func(c recording.Chunk) error {
			b, err := recording.DecodeChunk(c.Data)
			if err != nil {
				return trace.Wrap(err)
			}
			tail.Add(c, b)
			_, err = ch.Write(b)
			return trace.Wrap(err)
		})
		if err != nil {
			return trace.Wrap(err)
		}
		return trace.Wrap(tail.Finish(ch))
	}, nil
}

// authorizePlay checks that the caller may see recording sid and audits
// the playback; a recording they may not see is refused as missing.
func (h *Handler) authorizePlay(ctx context.Context, id *authz.Identity, sid string) (string, error) {
	if err := recording.CheckSessionID(sid); err != nil {
		return "", trace.Wrap(err)
	}
	owner, err := h.recordingOwner(ctx, sid)
	if err != nil {
		return "", trace.Wrap(err)
	}
	if !id.CanViewRecording(owner) {
		h.cfg.Audit.Emit(ctx, events.Event{Type: events.AccessDenied, User: id.User, Fields: events.Fields{
			events.FieldKind: "recording", events.FieldSessionID: sid, events.FieldReason: "not the user's recording and no review_recordings role",
		}})
		return "", errRecordingNotFound(sid)
	}
	h.cfg.Audit.Emit(ctx, events.Event{Type: events.RecordingPlay, User: id.User, Fields: events.Fields{
		events.FieldSessionID: sid, events.FieldMethod: "psh",
	}})
	return sid, nil
}

// chunksSubsystem serves SubsystemRecordingChunksPrefix+ID: the stored
// chunks as they are, hashes included, for psh to verify. Nothing is
// checked or decoded here: the point is that the client checks.
func (h *Handler) chunksSubsystem(ctx context.Context, id *authz.Identity, name string) (srv.SubsystemFunc, error) {
	if h.cfg.Recordings == nil {
		return nil, trace.NotImplemented("this proxy does not serve recordings")
	}
	sid, err := h.authorizePlay(ctx, id, strings.TrimPrefix(name, proxyapi.SubsystemRecordingChunksPrefix))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return func(ctx context.Context, ch ssh.Channel) error {
		bw := bufio.NewWriterSize(ch, 64<<10)
		enc := json.NewEncoder(bw)
		err := h.cfg.Recordings.GetRecording(ctx, sid, func(c recording.Chunk) error {
			return trace.Wrap(enc.Encode(c))
		})
		if err != nil {
			return trace.Wrap(err)
		}
		return trace.Wrap(bw.Flush())
	}, nil
}

// recordingOwner is the user a stored recording belongs to.
func (h *Handler) recordingOwner(ctx context.Context, sid string) (string, error) {
	list, err := h.cfg.Recordings.ListRecordings(ctx)
	if err != nil {
		return "", trace.Wrap(err)
	}
	for _, m := range list {
		if m.SessionID == sid {
			return m.User, nil
		}
	}
	return "", errRecordingNotFound(sid)
}
