package srv

import (
	"context"
	"fmt"
	"io"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
)

// RecorderConfig configures a Recorder.
type RecorderConfig struct {
	// Spool is where chunks are written as they close (the node's
	// DATA_DIR/recordings). Required.
	Spool recording.DirStorage
	// Settings returns the cluster's recording settings (session_recording,
	// record_input, max_recording_bytes in the networking config). It is
	// called once per session: the node has no cached networking view yet,
	// so a change applies to the sessions that start after it. Required.
	Settings func(ctx context.Context) (*services.ClusterNetworkingConfig, error)
	// Notify is called when a chunk is on disk (the uploader's Notify).
	// Nil means nobody is told.
	Notify func()
	// Clock times the events; nil means the real clock.
	Clock clockwork.Clock
}

// Recorder starts the recordings of a node's pty sessions.
type Recorder struct{ cfg RecorderConfig }

// NewRecorder checks cfg.
func NewRecorder(cfg RecorderConfig) (*Recorder, error) {
	if cfg.Spool.Dir == "" {
		return nil, trace.BadParameter("srv recorder: missing Spool")
	}
	if cfg.Settings == nil {
		return nil, trace.BadParameter("srv recorder: missing Settings")
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	return &Recorder{cfg: cfg}, nil
}

// startRecording starts the session's recording when the server records
// and the cluster setting is not "off". A failure to start is logged and
// the session runs unrecorded: like the cap, recording never costs the
// user their session (the missing recording is visible in listings, and
// the settings error in the node's log).
func (s *session) startRecording(spec procSpec) *recording.Writer {
	r := s.c.cfg.Recorder
	if r == nil || spec.pty == nil {
		return nil
	}
	set, err := r.cfg.Settings(s.ctx)
	if err != nil {
		s.log.WithError(err).Warn("Reading the recording settings failed; this session is not recorded.")
		return nil
	}
	if set.Spec.SessionRecording == services.RecordingOff {
		return nil
	}
	node := s.c.auth.node
	h := recording.Header{
		Width: spec.pty.Columns, Height: spec.pty.Rows, Command: s.getCommand(),
		SessionID: s.id, User: s.c.auth.id.User, Login: s.c.auth.id.Login,
		Node: node.UUID, NodeHostname: node.Hostname, Cluster: s.c.cfg.ClusterName,
	}
	if spec.pty.Term != "" {
		h.Env = map[string]string{"TERM": spec.pty.Term}
	}
	w, err := recording.New(recording.Config{
		Header:      h,
		Sink:        &recording.DirSink{Storage: r.cfg.Spool, Session: s.id, Notify: r.cfg.Notify},
		Clock:       r.cfg.Clock,
		MaxBytes:    set.Spec.MaxRecordingBytes,
		RecordInput: set.Spec.RecordInput,
		Logger:      s.log,
		OnCap: func() {
			s.log.WithField("max_recording_bytes", set.Spec.MaxRecordingBytes).Warn("Recording reached its cap and stopped; the session goes on.")
			s.c.emit(events.RecordingCapped, events.Fields{events.FieldSessionID: s.id, "max_recording_bytes": set.Spec.MaxRecordingBytes})
		},
	})
	if err != nil {
		s.log.WithError(err).Warn("Starting the recording failed; this session is not recorded.")
		return nil
	}
	if cmd := s.getCommand(); cmd != "" {
		w.Marker("exec: " + cmd)
	}
	return w
}

// recorded tees dst: what is written goes to dst and then, if dst took
// it, to record. record never fails, so the copy's behaviour is dst's.
func recorded(dst io.Writer, record func([]byte)) io.Writer {
	return recordingWriter{dst: dst, record: record}
}

type recordingWriter struct {
	dst    io.Writer
	record func([]byte)
}

func (w recordingWriter) Write(p []byte) (int, error) {
	n, err := w.dst.Write(p)
	if n > 0 {
		w.record(p[:n])
	}
	return n, err
}

// exitLabel is the recording's last marker.
func exitLabel(st exitResult) string {
	if st.signal != "" {
		return "exit-signal " + st.signal
	}
	return fmt.Sprintf("exit-status %d", st.code)
}

// closeRecording ends the recording with the exit marker and returns its
// final hash ("" without a recording).
func (s *session) closeRecording(st exitResult) string {
	s.mu.Lock()
	w := s.rec
	s.mu.Unlock()
	if w == nil {
		return ""
	}
	final, err := w.Close(exitLabel(st))
	if err != nil {
		s.log.WithError(err).Warn("Recording is incomplete: a chunk could not be stored.")
	}
	return final
}
