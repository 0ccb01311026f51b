package service

import (
	"syscall"

	"github.com/sirupsen/logrus"
)

// raiseFileLimit lifts the soft RLIMIT_NOFILE to the hard limit. Every
// forwarded session holds descriptors (the proxy: the client's socket and
// the node's; a node: a socket, a pty or pipes), and the soft limit most
// systems start services with (1,024) would refuse the 512th `ssh -J`
// long before memory or CPU run out. Raising the soft limit up to the hard
// one needs no privilege; above the hard limit is the administrator's call
// (LimitNOFILE= in the systemd unit), which the log line says.
func raiseFileLimit(log logrus.FieldLogger) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.WithError(err).Warn("Cannot read the file descriptor limit (RLIMIT_NOFILE); leaving it as it is.")
		return
	}
	before := lim.Cur
	fields := logrus.Fields{"soft": before, "hard": lim.Max}
	if lim.Cur >= lim.Max {
		log.WithFields(fields).Info("File descriptor limit (RLIMIT_NOFILE) is at the hard limit; raise the hard limit (LimitNOFILE= in the systemd unit) to hold more sessions.")
		return
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.WithError(err).WithFields(fields).
			Warn("Cannot raise the file descriptor limit to the hard limit; each session needs a few descriptors, so connections beyond the soft limit will fail. Raise it with ulimit -n or LimitNOFILE=.")
		return
	}
	log.WithFields(logrus.Fields{"from": before, "to": lim.Cur, "hard": lim.Max}).
		Info("File descriptor limit (RLIMIT_NOFILE) raised to the hard limit; raise the hard limit (LimitNOFILE= in the systemd unit) to hold more sessions.")
}

// fileLimit is the process's RLIMIT_NOFILE (soft, hard); ok is false when
// it cannot be read or is unlimited.
func fileLimit() (soft, hard uint64, ok bool) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > 1<<40 { // RLIM_INFINITY is all ones
		return 0, 0, false
	}
	return lim.Cur, lim.Max, true
}
