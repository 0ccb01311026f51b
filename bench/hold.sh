#!/bin/bash
# bench/hold.sh: scale (issue 17 item 5). One Postern proxy (auth+proxy
# process) and a node process on loopback; `psh bench ssh --jump` (x/crypto
# clients in one process, each session an `ssh -J`-style direct-tcpip
# channel, as OpenSSH's ProxyJump opens) first holds HOLD_N idle sessions,
# then starts new ones open loop at HOLD_RATE/s for HOLD_DURATION while they
# stay open, and reports the new sessions' setup percentiles, failures and
# the proxy's RSS and goroutines per held session (its /metrics).
#
# Limits that apply (the script prints them): each process's descriptor
# limit (RLIMIT_NOFILE; the daemon raises its soft limit to the hard one,
# which only root with CAP_SYS_RESOURCE can raise past). Per held session
# the proxy holds 2 sockets (client, node), the node 1, the bench client 1:
# with a hard limit L the proxy caps HOLD_N at about L/2 - a few hundred.
# The client spreads over 127.0.0.2-251 (the proxy admits 20 new
# connections per second per source address, after a burst of 250); the
# proxy -> node leg uses 127.0.0.1's ephemeral ports (ip_local_port_range).
#
# usage: bench/hold.sh            env: HOLD_N=9000 HOLD_RATE=50
#        HOLD_DURATION=20s HOLD_CONCURRENCY=64 HOLD_GC_PERCENT BUILD_DIR
#        BUILD=0 KEEP=1
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
HOLD_N=${HOLD_N:-9000}
HOLD_RATE=${HOLD_RATE:-50}
HOLD_DURATION=${HOLD_DURATION:-20s}
HOLD_CONCURRENCY=${HOLD_CONCURRENCY:-64}
ulimit -n "$(ulimit -Hn)" 2>/dev/null
# The node's login: no shell is started, any existing account does.
export BASELINE_USER=${BASELINE_USER:-root}
MEM_N=0
# shellcheck source=postern-vs-openssh.sh
source "$HERE/postern-vs-openssh.sh"

POSTERN_CONFIG=$W/postern-hold.yaml
cat >"$POSTERN_CONFIG" <<'YAML'
# One user holds every session: lift the per-user and per-address caps.
limits:
  max_connections_per_ip: -1
  max_connections_per_user: -1
  max_sessions_per_user: -1
  max_connections: -1
YAML
# HOLD_GC_PERCENT: the daemons' gc_percent (default: theirs, 400), to see
# the memory the GC setting costs per held session.
[ -n "${HOLD_GC_PERCENT:-}" ] && echo "gc_percent: $HOLD_GC_PERCENT" >>"$POSTERN_CONFIG"
build
start_postern
echo "  limits: RLIMIT_NOFILE soft/hard $(ulimit -n)/$(ulimit -Hn) (this shell, inherited); fs.nr_open $(cat /proc/sys/fs/nr_open);" \
	"ephemeral ports $(tr '\t' - </proc/sys/net/ipv4/ip_local_port_range)"
echo "  proxy $(grep 'open files' "/proc/$PROXY_PID/limits"), node $(grep 'open files' "/proc/$NODE_PID/limits")"
export POSTERN_HOME=$W/psh-home
printf 'correct horse battery staple\n' | "$BIN/psh" login --proxy "127.0.0.1:$PW" --user alice --insecure --add-keys-to-agent no >/dev/null 2>&1 ||
	die "psh login"
src=""
for i in $(seq 2 251); do src="$src --source 127.0.0.$i"; done
log "psh bench ssh --jump --hold $HOLD_N, then $HOLD_RATE/s for $HOLD_DURATION"
"$BIN/psh" bench ssh --jump --hold "$HOLD_N" --rate "$HOLD_RATE" --duration "$HOLD_DURATION" \
	--concurrency "$HOLD_CONCURRENCY" --phases --format json --metrics-url "http://127.0.0.1:$PD/metrics" \
	$src "$LOGIN@$NODENAME" >"$W/hold.json" 2>"$W/hold.err"
rc=$?
echo "  psh bench exit $rc; proxy fds at the end: $(ls "/proc/$PROXY_PID/fd" 2>/dev/null | wc -l), threads $(awk '/Threads/{print $2}' "/proc/$PROXY_PID/status"); node threads $(awk '/Threads/{print $2}' "/proc/$NODE_PID/status")"
tail -c 600 "$W/hold.err" | tr '\r' '\n' | tail -3
python3 - "$W/hold.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"  no result: {e}")
h = d.get("hold") or {}
print(f"  held: {h.get('sessions')} up, {h.get('failed')} failed; setup p50 {h.get('setup', {}).get('p50_ms')} p99 {h.get('setup', {}).get('p99_ms')} ms")
print(f"  proxy per held session: RSS {h.get('rss_bytes_per_session', 0)/1024:.1f} KiB, goroutines {h.get('goroutines_per_session', 0):.2f}; sample error: {h.get('sample_error', '')}")
l = d.get("latency", {})
print(f"  new sessions at {d.get('rate')}/s while held: {d.get('completed')}/{d.get('scheduled')} completed, {d.get('failed')} failed; "
      f"p50 {l.get('p50_ms')} p99 {l.get('p99_ms')} max {l.get('max_ms')} ms")
for e, n in list((d.get("errors") or {}).items())[:5]:
    print(f"    {n} x {e}")
PY
