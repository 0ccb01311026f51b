#!/bin/bash
# Load benchmark (issue 7): LOAD_N concurrent idle `ssh -J` sessions through
# one jump host, Postern's proxy vs an OpenSSH sshd bastion, one arm at a
# time, same OpenSSH client, certificate, target (a Postern node process)
# and non-root login. The setup is postern-vs-openssh.sh's (sourced, so both
# benchmarks build the two arms the same way); only the limits differ:
#
# - Postern: both processes start with a postern.yaml (POSTERN_CONFIG) that
#   lifts every connection cap (negative = no cap). All the load comes from
#   127.0.0.1 and one user, so the defaults (250 connections per address and
#   per user, 500 sessions per user) would refuse half of a 500-session run,
#   and we would measure the limiter instead of the proxy.
# - The new-connection rate per address (20/s, burst 250) is not
#   configurable, so session starts are paced at LOAD_RATE per second
#   (at most 15, below the sustained 20/s: the token bucket never runs dry,
#   whatever the burst). The default is 5: on a 2-core machine 15/s is
#   more than the sshd arm can set up (its key exchange alone, sntrup761,
#   costs the client ~0.1 s of CPU per hop), the starts queue behind each
#   other and p50/p99 then measure the length of that queue, not a session's
#   setup; the per-fifth medians printed per arm show whether that happened. Each `ssh -J` opens one TCP connection to the jump
#   host (the main ssh reaches the node through a direct-tcpip channel of
#   its ProxyJump child), so sessions/s = connections/s. The sshd arm is
#   paced the same way so both arms see the same arrival pattern.
# - sshd: the bastion from openssh-baseline.sh has MaxStartups 200 and
#   MaxSessions 50 (right for that script's users). For this run it is
#   restarted from its own copy of that config with both raised; the pid
#   file stays where openssh-baseline.sh's teardown looks for it.
#
# Per arm (driver in Python, one process, so timing is not skewed by a
# shell per session):
#   - setup latency of each session: from just before the ssh process is
#     started until the remote command's marker line arrives on its stdout
#     (`echo MARK; exec sleep ...`: auth on both hops, routing, the session
#     channel and the exec all included); p50/p99 by nearest rank;
#   - memory per idle forwarded connection: PSS (smaps_rollup) of the jump
#     host's processes (sshd: listener + every child and grandchild; Postern:
#     the auth+proxy process, the node is a separate process) before the
#     first session and LOAD_SETTLE seconds after the last came up, divided
#     by the number of sessions actually up;
#   - then every client is killed (its process group: ssh and its ProxyJump
#     child), the node's sleeps are killed, and the script waits until the
#     jump host has no established connection and (sshd) no per-connection
#     process left before the next arm starts.
#
# usage: bench/load.sh          (root: it creates a user, raises ulimits)
# env:   LOAD_N=500 LOAD_RATE=5 (session starts per second) LOAD_WAIT=120
#          (seconds to wait after the last start for stragglers)
#        LOAD_SETTLE=3 (seconds between the last session up and the PSS
#          reading) LOAD_ORDER="sshd postern" LOAD_KEX=default|x25519
#        BUILD_DIR, BUILD=0, BASELINE_USER, KEEP=1: as postern-vs-openssh.sh
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
LOAD_N=${LOAD_N:-500}
LOAD_RATE=${LOAD_RATE:-5}
LOAD_WAIT=${LOAD_WAIT:-120}
LOAD_SETTLE=${LOAD_SETTLE:-3}
LOAD_ORDER=${LOAD_ORDER:-sshd postern}

awk -v r="$LOAD_RATE" 'BEGIN{exit !(r > 0 && r <= 15)}' ||
	{ echo "FATAL: LOAD_RATE=$LOAD_RATE: use 0 < rate <= 15 (Postern refuses more than 20 new connections/s per address)" >&2; exit 1; }

# Descriptors and processes: the client side alone is 2 ssh processes and a
# few descriptors per session, sshd adds 2 processes per connection and the
# proxy 2 sockets per session. Raise the soft limits to the hard ones (they
# are inherited by everything started below) and refuse to run when even
# those are too low rather than measure refusals.
ulimit -n "$(ulimit -Hn)" 2>/dev/null
ulimit -u "$(ulimit -Hu)" 2>/dev/null
need_fd=$((LOAD_N * 6 + 1024))
need_proc=$((LOAD_N * 8 + 1024))
[ "$(ulimit -n)" = unlimited ] || [ "$(ulimit -n)" -ge "$need_fd" ] ||
	{ echo "FATAL: ulimit -n $(ulimit -n) < $need_fd needed for LOAD_N=$LOAD_N" >&2; exit 1; }
[ "$(ulimit -u)" = unlimited ] || [ "$(ulimit -u)" -ge "$need_proc" ] ||
	{ echo "FATAL: ulimit -u $(ulimit -u) < $need_proc needed for LOAD_N=$LOAD_N" >&2; exit 1; }

# Defines W (work dir), the cleanup trap, setup, and the helpers; runs
# nothing. MEM_N is that script's own memory step, not used here.
MEM_N=0
# shellcheck source=postern-vs-openssh.sh
source "$HERE/postern-vs-openssh.sh"

POSTERN_CONFIG=$W/postern-load.yaml
cat >"$POSTERN_CONFIG" <<'EOF'
# bench/load.sh: every load-test connection comes from 127.0.0.1 as one
# user; lift the caps so that the proxy, not the limiter, is measured.
limits:
  max_connections_per_ip: -1
  max_connections_per_user: -1
  max_sessions_per_user: -1
  max_connections: -1
EOF
LOAD_RES=$W/load.jsonl
# LOAD_KEX=x25519: every hop with curve25519-sha256 (takes OpenSSH's
# sntrup761, which only the sshd arm negotiates and which costs the client
# ~60-120 ms of CPU here, out of the comparison). Default: the client's
# defaults, as a user would run it.
LOAD_KEX=${LOAD_KEX:-default}

load_sshd() { # restart the bastion from a copy of its config with the startup caps raised
	local conf=$P/sshd_bastion_load.conf pid i extra=()
	sed -e 's/^MaxStartups .*/MaxStartups 4096/' -e 's/^MaxSessions .*/MaxSessions 4096/' \
		"$P/sshd_bastion.conf" >"$conf" || die "writing $conf"
	# OpenSSH >= 9.8 also penalises addresses with many failed/closed
	# connections; 9.2 does not know the option, so add it only if accepted.
	/usr/sbin/sshd -t -f "$conf" -o PerSourcePenalties=no 2>/dev/null && extra=(-o PerSourcePenalties=no)
	/usr/sbin/sshd -t -f "$conf" "${extra[@]}" || die "sshd -t $conf"
	pid=$(cat "$P/sshd_bastion.pid")
	kill "$pid" || die "stopping the baseline bastion $pid"
	for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	rm -f "$P/sshd_bastion.pid"
	/usr/sbin/sshd -f "$conf" -E "$P/sshd_bastion_load.log" "${extra[@]}" || die "starting sshd with $conf"
	wait_for 50 test -s "$P/sshd_bastion.pid" || die "sshd bastion did not write its pid file"
	out=$(ssh -F "$CFG" via-sshd 'echo ok $(id -un)' 2>&1)
	[ "$out" = "ok $LOGIN" ] || die "ssh via-sshd after the restart: $out"
	echo "  sshd bastion restarted with $conf (MaxStartups/MaxSessions 4096 ${extra[*]}), pid $(cat "$P/sshd_bastion.pid")"
}

arm_port() { if [ "$1" = sshd ]; then echo 2201; else echo "$PS"; fi; }

established() { # port -> established TCP connections to it
	ss -Htn state established "( sport = :$1 )" | wc -l
}

drive() { # arm root-pid -> one JSON line on stdout; progress on stderr
	python3 - "$1" "$2" "$LOAD_N" "$LOAD_RATE" "$LOAD_WAIT" "$LOAD_SETTLE" "$LOAD_CFG" "$SLEEP_ARG" "$W/load_$1.stderr" <<'PY'
import json, os, selectors, signal, subprocess, sys, time

arm, root, n, rate, wait_s, settle, cfg, sleep_arg, errpath = sys.argv[1:]
root, n, rate, wait_s, settle = int(root), int(n), float(rate), float(wait_s), float(settle)
MARK = b"LOAD-UP"

def descendants(pid):
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out

def mem(pids):
    pss = rss = k = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1])
                    elif line.startswith("Rss:"):
                        rss += int(line.split()[1])
            k += 1
        except OSError:
            pass
    return pss, rss, k

procs, started, lat, dead = [], [], {}, set()
sel = selectors.DefaultSelector()
bufs = {}

def stop_all():
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)  # ssh and its ProxyJump child
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()

def on_term(*_):
    raise SystemExit(143)
signal.signal(signal.SIGTERM, on_term)

def poll(timeout):
    for key, _ in sel.select(timeout):
        i = key.data
        data = os.read(key.fd, 4096)
        now = time.monotonic()
        if not data:
            sel.unregister(key.fd)
            procs[i].stdout.close()
            dead.add(i)
            continue
        bufs[i] = bufs.get(i, b"") + data
        if i not in lat and MARK in bufs[i]:
            lat[i] = now - started[i]

try:
    pss0, rss0, k0 = mem(descendants(root))
    err = open(errpath, "ab")
    t0 = time.monotonic()
    cmd = f"echo {MARK.decode()}; exec sleep {sleep_arg}"
    for i in range(n):
        due = t0 + i / rate
        while True:
            left = due - time.monotonic()
            if left <= 0:
                break
            poll(left)
        started.append(time.monotonic())
        p = subprocess.Popen(["ssh", "-F", cfg, f"via-{arm}", cmd], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        procs.append(p)
        os.set_blocking(p.stdout.fileno(), False)
        sel.register(p.stdout.fileno(), selectors.EVENT_READ, i)
        # Read what is ready now too: when starting a process is slow (a
        # busy machine) the pacing loop above may not wait at all, and a
        # marker read late would be timed late.
        poll(0)
        if (i + 1) % 100 == 0:
            print(f"  {arm}: {i + 1} started, {len(lat)} up, {len(dead)} ended", file=sys.stderr, flush=True)
    last_start = time.monotonic()
    deadline = last_start + wait_s
    while len(set(lat) | dead) < n and time.monotonic() < deadline:
        poll(0.2)
    all_up = time.monotonic()
    end = all_up + settle
    while time.monotonic() < end:
        poll(end - time.monotonic())
    pids = descendants(root)
    pss1, rss1, k1 = mem(pids)
    err.flush()
    stderr_bytes = os.path.getsize(errpath)
    with open("/proc/loadavg") as f:
        loadavg = " ".join(f.read().split()[:3])
    alive = [i for i in lat if i not in dead and procs[i].poll() is None]
    up = len(alive)
    ls = sorted(lat[i] * 1000 for i in lat)
    # Median setup time of each fifth of the starts, in start order: a
    # rising series means the arrivals outran the machine (queueing), and
    # the percentiles then measure the queue, not one session's setup.
    fifths = []
    for b in range(5):
        xs = sorted(lat[i] * 1000 for i in range(b * n // 5, (b + 1) * n // 5) if i in lat)
        fifths.append(round(xs[len(xs) // 2]) if xs else None)
    failed_rc = {}
    for i in range(n):
        if i not in lat:
            rc = procs[i].poll()
            failed_rc[str(rc)] = failed_rc.get(str(rc), 0) + 1
    rank = lambda q: ls[max(0, -(-len(ls) * q // 100) - 1)] if ls else float("nan")
    res = {
        "arm": arm, "n": n, "rate": rate, "came_up": len(lat), "up": up,
        "failed": n - len(lat), "died_after_up": len([i for i in lat if i in dead]),
        "p50_ms": rank(50), "p99_ms": rank(99), "max_ms": ls[-1] if ls else float("nan"),
        "min_ms": ls[0] if ls else float("nan"),
        "start_span_s": last_start - t0, "all_up_after_s": all_up - t0,
        "procs0": k0, "procs1": k1, "pss0": pss0, "pss1": pss1, "rss0": rss0, "rss1": rss1,
        "pss_per_conn_kib": (pss1 - pss0) / up if up else float("nan"),
        "rss_per_conn_kib": (rss1 - rss0) / up if up else float("nan"),
        "stderr_bytes": stderr_bytes, "p50_by_fifth_ms": fifths, "failed_exit_codes": failed_rc, "loadavg": loadavg, "ssh_config": os.path.basename(cfg),
    }
    print(json.dumps(res), flush=True)
finally:
    stop_all()
PY
}

load_arm() { # arm
	local arm=$1 root port i line
	root=$(bastion_pid "$arm")
	port=$(arm_port "$arm")
	log "$arm: $LOAD_N idle 'ssh -J' sessions, $LOAD_RATE starts/s, jump host pid $root port $port"
	drive "$arm" "$root" >"$W/load_$arm.json" &
	CLIENT_PIDS=($!)
	wait "${CLIENT_PIDS[0]}" || echo "  WARNING: driver exited with $?"
	CLIENT_PIDS=()
	line=$(tail -1 "$W/load_$arm.json")
	[ -n "$line" ] || die "$arm: driver printed no result"
	echo "$line" >>"$LOAD_RES"
	python3 - "$line" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print(f"  {r['arm']}: {r['up']}/{r['n']} sessions up ({r['failed']} never came up, {r['died_after_up']} ended early); "
      f"all up {r['all_up_after_s']:.1f} s after the first start (starts spanned {r['start_span_s']:.1f} s)")
print(f"  setup ms: min {r['min_ms']:.0f} p50 {r['p50_ms']:.0f} p99 {r['p99_ms']:.0f} max {r['max_ms']:.0f}")
print(f"  jump host procs {r['procs0']} -> {r['procs1']}; PSS {r['pss0']} -> {r['pss1']} KiB (RSS {r['rss0']} -> {r['rss1']}): "
      f"{r['pss_per_conn_kib']:.1f} KiB PSS, {r['rss_per_conn_kib']:.1f} KiB RSS per connection")
print(f"  setup p50 per fifth of the starts, ms: {r['p50_by_fifth_ms']}; exit codes of sessions that never came up: {r['failed_exit_codes'] or '-'}")
print(f"  CPU load at the end of the starts: {r['loadavg']}")
PY
	# Client errors while the sessions were up (what the teardown's kills
	# print afterwards is not interesting).
	head -c "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["stderr_bytes"])' "$line")" "$W/load_$arm.stderr" >"$W/load_$arm.errors"
	[ -s "$W/load_$arm.errors" ] && echo "  client errors while up ($(wc -l <"$W/load_$arm.errors") lines), most frequent:" &&
		sort "$W/load_$arm.errors" | uniq -c | sort -rn | head -5 | sed 's/^/    /'
	if [ "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["failed"])' "$line")" != 0 ]; then
		echo "  last errors in the logs (bastion, proxy, node):"
		for f in "$P/sshd_bastion_load.log" "$W/proxy.log" "$W/node.log"; do
			grep -iE 'error|refus|timeout|timed out|limit|drop' "$f" 2>/dev/null | tail -3 | sed "s|^|    $(basename "$f"): |"
		done
	fi
	# Torn down before the next arm: node sleeps gone, no connection left
	# on the jump host, and (sshd) no per-connection process left.
	kill_sleeps
	for i in $(seq 300); do
		[ "$(established "$port")" = 0 ] && [ "$(pgrep -P "$root" | wc -l)" = 0 ] &&
			[ -z "$(pgrep -u "$LOGIN" -f "^sleep $SLEEP_ARG\$")" ] && break
		sleep 0.1
	done
	echo "  after teardown: $(established "$port") established on :$port, $(pgrep -P "$root" | wc -l) jump host children," \
		"$(pgrep -c -u "$LOGIN" -f "^sleep $SLEEP_ARG\$") node sleeps left"
}

load_table() {
	log "results: $LOAD_N concurrent idle ssh -J sessions per arm, $LOAD_RATE starts/s, kex $LOAD_KEX"
	python3 - "$LOAD_RES" <<'PY'
import json, sys
r = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    r[d["arm"]] = d
rows = [("sessions up", "up", "{:.0f}"), ("setup p50, ms", "p50_ms", "{:.0f}"),
        ("setup p99, ms", "p99_ms", "{:.0f}"), ("setup max, ms", "max_ms", "{:.0f}"),
        ("PSS per idle -J conn, KiB", "pss_per_conn_kib", "{:.1f}"),
        ("RSS per idle -J conn, KiB", "rss_per_conn_kib", "{:.1f}")]
print(f"{'metric':28} {'sshd':>9} {'postern':>9} {'postern/sshd':>13}")
for title, k, f in rows:
    s, p = r.get("sshd", {}).get(k), r.get("postern", {}).get(k)
    ratio = f"{p / s:13.3f}" if s and p is not None else f"{'-':>13}"
    fmt = lambda x: f"{f.format(x):>9}" if x is not None else f"{'-':>9}"
    print(f"{title:28} {fmt(s)} {fmt(p)} {ratio}")
PY
}

echo "load: $(ssh -V 2>&1); $(date -u '+%F %T UTC'); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg);" \
	"ulimit -n $(ulimit -n) -u $(ulimit -u); LOAD_N=$LOAD_N LOAD_RATE=$LOAD_RATE"
setup
LOAD_CFG=$CFG
[ "$LOAD_KEX" = x25519 ] && LOAD_CFG=$CFG_X25519
load_sshd
for arm in $LOAD_ORDER; do load_arm "$arm"; done
load_table
