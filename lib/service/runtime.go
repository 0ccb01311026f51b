package service

import (
	"os"
	"runtime/debug"

	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/config"
)

// tuneRuntime applies the process-wide settings a daemon wants and a test
// binary does not: the GC target and the descriptor limit. Run calls it
// before Start; Start alone (tests, embedding) leaves the runtime as it is,
// since these are process globals that outlive one Process.
func tuneRuntime(cfg *config.Config, log logrus.FieldLogger) {
	setGCPercent(cfg, log)
	raiseFileLimit(log)
}

// setGCPercent sets the GC target: gc_percent (or --gc-percent) when set,
// else the GOGC environment variable when set (the operator's choice, the
// runtime already applied it), else config.DefaultGCPercent.
func setGCPercent(cfg *config.Config, log logrus.FieldLogger) {
	pct, source := cfg.GCPercent, "gc_percent"
	if pct == 0 {
		if env := os.Getenv("GOGC"); env != "" {
			log.WithField("gogc", env).Info("Garbage collector target from GOGC.")
			return
		}
		pct, source = config.DefaultGCPercent, "default"
	}
	debug.SetGCPercent(pct)
	log.WithFields(logrus.Fields{"gc_percent": pct, "source": source}).
		Info("Garbage collector target set: the heap may grow to (1 + gc_percent/100) times the live heap between collections (GOMEMLIMIT still bounds it).")
}
