package service

import (
	"context"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/sirupsen/logrus"
	"gopkg.in/yaml.v3"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/sdnotify"
)

// daemonHooks are the daemon's side of its service manager (Run only; Start
// alone, as tests and embedders use it, has none): READY=1 to
// $NOTIFY_SOCKET once every listener accepts, STOPPING=1 when a shutdown
// starts, and SIGHUP, which re-reads the config file and applies what a
// running process can change: the log level (debug) and the log format
// (log_format). A changed key that needs a restart is named in the log,
// never applied halfway; an unreadable or invalid file is refused and the
// process keeps its settings. SIGHUP never stops the process.
type daemonHooks struct {
	p      *Process
	notify *sdnotify.Notifier
	// logger is the process logger when Run built it (nil when one was
	// injected: nothing to reload then).
	logger *logrus.Logger
	// flagDebug and flagFormat are what command-line flags set at start:
	// they keep winning over the file on a reload.
	flagDebug  bool
	flagFormat string

	// mu guards file, the config file as last applied.
	mu   sync.Mutex
	file config.FileConfig

	ready atomic.Bool
	hup   chan os.Signal
	done  chan struct{}
	wg    sync.WaitGroup
}

// startDaemonHooks takes SIGHUP over (from here on it reloads instead of
// ending the process) and reads $NOTIFY_SOCKET; stop releases SIGHUP.
func (p *Process) startDaemonHooks() *daemonHooks {
	h := &daemonHooks{
		p:      p,
		notify: sdnotify.FromEnv(),
		hup:    make(chan os.Signal, 1),
		done:   make(chan struct{}),
	}
	h.logger, _ = p.opts.Logger.(*logrus.Logger)
	if entry, ok := p.log.(*logrus.Entry); ok && h.logger == nil {
		h.logger = entry.Logger
	}
	h.file = p.cfg.FileConfig
	if p.cfg.ConfigFile != "" {
		// What the file said at start tells the flags apart: a value the
		// running config has and the file had not came from a flag.
		if fc, err := config.ReadFile(p.cfg.ConfigFile); err == nil {
			h.file = *fc
		}
	}
	h.flagDebug = p.cfg.Debug && !h.file.Debug
	if p.cfg.LogFormat != logFormatOf(h.file.LogFormat) {
		h.flagFormat = p.cfg.LogFormat
	}
	signal.Notify(h.hup, syscall.SIGHUP)
	h.wg.Add(1)
	go h.loop()
	return h
}

// logFormatOf is a log_format value with its default.
func logFormatOf(s string) string {
	if s == "" {
		return "text"
	}
	return s
}

// started sends READY=1 and makes STOPPING=1 the first step of Shutdown.
func (h *daemonHooks) started() {
	// Closers run in reverse: registered after Start, this one runs first.
	h.p.onShutdown(func(context.Context) error {
		h.ready.Store(false)
		h.warn(h.notify.Stopping("Shutting down: draining sessions."))
		return nil
	})
	h.ready.Store(true)
	h.warn(h.notify.Ready(h.status()))
}

func (h *daemonHooks) status() string {
	return "Serving: roles " + strings.Join(h.p.cfg.Roles, ",") + ", cluster " + h.p.clusterName + "."
}

func (h *daemonHooks) stop() {
	signal.Stop(h.hup)
	close(h.done)
	h.wg.Wait()
}

func (h *daemonHooks) loop() {
	defer h.wg.Done()
	for {
		select {
		case <-h.done:
			return
		case <-h.hup:
			h.reload()
		}
	}
}

func (h *daemonHooks) warn(err error) {
	if err != nil {
		h.p.log.WithError(err).Warn("Cannot notify the service manager.")
	}
}

// reload applies the config file's reloadable keys (see daemonHooks).
func (h *daemonHooks) reload() {
	// Before READY=1 the manager is still waiting for start-up: no
	// RELOADING=1/READY=1 pair then (the READY=1 would end its wait early).
	notify := h.ready.Load()
	if notify {
		h.warn(h.notify.Reloading())
	}
	status := h.reloadFile()
	if notify && h.ready.Load() {
		h.warn(h.notify.Ready(status))
	}
}

// reloadFile does the reload and returns the status line to show.
func (h *daemonHooks) reloadFile() string {
	log := h.p.log.WithField("signal", "SIGHUP")
	path := h.p.cfg.ConfigFile
	if path == "" {
		log.Info("Reload: started without --config, there is no config file to re-read; nothing changed.")
		return h.status()
	}
	fc, err := config.ReadFile(path)
	if err == nil {
		// The whole file must still be valid: a reload never applies part
		// of a file the next start would refuse.
		check := config.Config{FileConfig: *fc}
		err = check.CheckAndSetDefaults()
	}
	if err != nil {
		log.WithError(err).Error("Reload refused: the config file is not valid; the running settings are kept.")
		return h.status() + " Last reload refused: " + err.Error()
	}
	debug := fc.Debug || h.flagDebug
	format := logFormatOf(fc.LogFormat)
	if h.flagFormat != "" {
		format = h.flagFormat
	}
	if h.logger != nil {
		fresh := newLogger(os.Stderr, format, debug)
		h.logger.SetFormatter(fresh.Formatter)
		h.logger.SetLevel(fresh.GetLevel())
	}
	h.mu.Lock()
	restart := changedKeys(h.file, *fc, "debug", "log_format")
	h.file = *fc
	h.mu.Unlock()
	fields := logrus.Fields{"config": path, "debug": debug, "log_format": format}
	if len(restart) > 0 {
		h.p.log.WithFields(fields).WithField("needs_restart", strings.Join(restart, ",")).
			Warn("Reload: applied debug and log_format; the other changed keys take effect only at the next restart.")
	} else {
		h.p.log.WithFields(fields).Info("Reload: applied debug and log_format from the config file.")
	}
	return h.status()
}

// changedKeys lists the top-level keys of postern.yaml whose values differ
// between a and b, except those in skip.
func changedKeys(a, b config.FileConfig, skip ...string) []string {
	ma, mb := yamlKeys(a), yamlKeys(b)
	seen := map[string]bool{}
	var out []string
	for _, m := range []map[string]any{ma, mb} {
		for k := range m {
			if seen[k] {
				continue
			}
			seen[k] = true
			if !slices.Contains(skip, k) && !reflect.DeepEqual(ma[k], mb[k]) {
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

func yamlKeys(fc config.FileConfig) map[string]any {
	m := map[string]any{}
	if data, err := yaml.Marshal(fc); err == nil {
		_ = yaml.Unmarshal(data, &m)
	}
	return m
}
