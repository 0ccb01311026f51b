#!/bin/bash
# bench/report.sh: `make bench-report`. Runs the side-by-side suite
# (bench/postern-vs-openssh.sh: direct, a bare x/crypto hop (bench/barehop),
# Postern, an sshd bastion; same OpenSSH client, certificate, node and
# login) REPORT_RUNS times and writes docs/performance.md: each figure's
# median with min-max over the runs, the ratios Postern/sshd, Postern/direct
# and Postern/bare with min-max over the runs, the date, the machine and the
# commit. Throughput on a shared machine varies
# +-25% run to run, which is why every ratio is taken within one run (both
# arms measured interleaved) and reported as a range, never a point.
#
# usage: bench/report.sh            (root: the suite creates a user)
# env:   REPORT_RUNS=2 REPORT_OUT=docs/performance.md, and the suite's own
#        knobs (RUNS, TP_RUNS, TP_SIZE, MEM_N, ...; see postern-vs-openssh.sh),
#        here defaulting to a short suite (RUNS=10 TP_RUNS=2 TP_SIZE=512M;
#        MEM_N=1000 MEM_N_SSHD=100: about 6 minutes a run)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
REPORT_RUNS=${REPORT_RUNS:-2}
# Memory at issue 17's N: 1,000 idle sessions through each Go hop, 100
# through sshd (two processes of ~1.8 MiB per session: 1,000 would be
# ~4 GiB and minutes of sntrup761 key exchanges, for the same per-session
# figure).
export RUNS=${RUNS:-10} TP_RUNS=${TP_RUNS:-2} TP_SIZE=${TP_SIZE:-512M} MEM_N=${MEM_N:-1000} MEM_N_SSHD=${MEM_N_SSHD:-100}
OUT=${REPORT_OUT:-$REPO/docs/performance.md}
COLLECT=$(mktemp -d /tmp/postern-report.XXXXXX)
trap 'rm -rf "$COLLECT"' EXIT
# One user from one address holds every memory-arm session: the default
# caps (250 connections per address and per user, 500 sessions per user)
# would refuse most of 1,000, so the report's Postern processes lift them
# (the suite's other measurements stay far below them either way).
if [ -z "${POSTERN_CONFIG:-}" ]; then
	export POSTERN_CONFIG=$COLLECT/postern-report.yaml
	printf 'limits:\n  max_connections_per_ip: -1\n  max_connections_per_user: -1\n  max_sessions_per_user: -1\n' >"$POSTERN_CONFIG"
fi

for r in $(seq "$REPORT_RUNS"); do
	echo "=== report run $r of $REPORT_RUNS"
	log=$COLLECT/run_$r.log
	KEEP=1 BUILD=$([ "$r" = 1 ] && echo "${BUILD:-1}" || echo 0) "$HERE/postern-vs-openssh.sh" 2>&1 | tee "$log"
	w=$(sed -n 's/^  kept \(.*\)$/\1/p' "$log" | tail -1)
	[ -n "$w" ] && [ -f "$w/results.tsv" ] || { echo "FATAL: run $r left no results" >&2; exit 1; }
	cp "$w/results.tsv" "$COLLECT/results_$r.tsv"
	[ -f "$w/phases.json" ] && cp "$w/phases.json" "$COLLECT/phases_$r.json"
	rm -rf "$w"
done

# Scale: bench/hold.sh (one proxy holding REPORT_HOLD_N idle ssh -J
# sessions of psh bench's own clients, new ones at 50/s meanwhile); 0 skips.
REPORT_HOLD_N=${REPORT_HOLD_N:-2000}
if [ "$REPORT_HOLD_N" -gt 0 ]; then
	echo "=== scale: bench/hold.sh HOLD_N=$REPORT_HOLD_N"
	KEEP=1 BUILD=0 HOLD_N=$REPORT_HOLD_N "$HERE/hold.sh" 2>&1 | tee "$COLLECT/hold.log"
	w=$(sed -n 's/^  kept \(.*\)$/\1/p' "$COLLECT/hold.log" | tail -1)
	if [ -n "$w" ] && [ -f "$w/hold.json" ]; then
		cp "$w/hold.json" "$COLLECT/hold.json"
		grep -E '^  (limits|proxy Max|psh bench exit)' "$COLLECT/hold.log" >"$COLLECT/hold_limits.txt" || true
	fi
	[ -n "$w" ] && rm -rf "$w"
fi

mkdir -p "$(dirname "$OUT")"
# REPORT_EXTRA: sections measured by other means (Go benchmarks), kept
# across regenerations.
REPORT_EXTRA=${REPORT_EXTRA:-$HERE/tracing-overhead.md} \
python3 - "$COLLECT" "$REPORT_RUNS" "$OUT" \
	"$(date -u '+%F %T UTC')" \
	"$(nproc) cores, $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo), $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr)" \
	"$(cd "$REPO" && git rev-parse --short HEAD)$(cd "$REPO" && git diff --quiet || echo '-dirty')" \
	"$(ssh -V 2>&1)" <<'PY'
import statistics, sys
collect, runs, out, date, machine, commit, client = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
per_run = []  # [{metric: {arm: median}}]
for r in range(1, runs + 1):
    vals = {}
    for line in open(f"{collect}/results_{r}.tsv"):
        m, arm, v = line.rstrip("\n").split("\t")
        vals.setdefault(m, {}).setdefault(arm, []).append(float(v))
    per_run.append({m: {a: statistics.median(v) for a, v in d.items()} for m, d in vals.items()})
rows = [
    ("ssh -J setup, ms (median)", "setup_ms"),
    ("hop CPU per setup, ms", "cpu_setup_ms"),
    ("hop CPU per setup at a sustained rate (3 concurrent loops), ms", "cpu_setup_ms_sustained"),
    ("Postern auth CPU per setup, ms (own process)", "cpu_setup_ms_auth"),
    ("setup, ms, curve25519 forced", "setup_ms_x25519"),
    ("upload MB/s", "tp_upload_default"),
    ("download MB/s", "tp_download_default"),
    ("upload MB/s, AES-GCM", "tp_upload_aesgcm"),
    ("download MB/s, AES-GCM", "tp_download_aesgcm"),
    ("hop CPU s/GB, upload", "cpu_upload_default"),
    ("hop CPU s/GB, download", "cpu_download_default"),
    ("hop CPU s/GB, upload, AES-GCM", "cpu_upload_aesgcm"),
    ("hop CPU s/GB, download, AES-GCM", "cpu_download_aesgcm"),
    ("PSS per idle -J session, KiB", "mem_kib_per_conn"),
]
def rng(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"
def ratio(run, m, a, b):
    d = run.get(m, {})
    return d[a] / d[b] if d.get(a) and d.get(b) else None
with open(out, "w") as f:
    f.write("# Performance\n\n")
    f.write("Written by `make bench-report` (bench/report.sh); do not edit by hand.\n\n")
    f.write(f"- date: {date}\n- machine: {machine}\n- commit: {commit}\n- client: {client}\n")
    f.write(f"- runs: {runs} of bench/postern-vs-openssh.sh; each figure is the median over runs (min-max)\n\n")
    f.write("Arms: **direct** (the OpenSSH client straight to a Postern node: the limit), **bare** "
            "(`ssh -J` through bench/barehop, an x/crypto hop that does nothing but forward: no auth, "
            "RBAC, routing or audit; the library's own floor for a hop), **postern** "
            "(`ssh -J` through a Postern proxy), **sshd** (`ssh -J` through an OpenSSH sshd bastion). "
            "Ratios are taken within each run, where the arms were measured interleaved.\n\n")
    f.write("| figure | direct | bare | postern | sshd | postern/sshd | postern/direct | postern/bare |\n"
            "|---|---|---|---|---|---|---|---|\n")
    for title, m in rows:
        if not any(m in r for r in per_run):
            continue
        col = lambda a: rng([r.get(m, {}).get(a) for r in per_run])
        f.write(f"| {title} | {col('direct')} | {col('bare')} | {col('postern')} | {col('sshd')} | "
                f"{rng([ratio(r, m, 'postern', 'sshd') for r in per_run])} | "
                f"{rng([ratio(r, m, 'postern', 'direct') for r in per_run])} | "
                f"{rng([ratio(r, m, 'postern', 'bare') for r in per_run])} |\n")
    f.write("\nThe bare arm is the floor Postern's hop is held to: what x/crypto itself costs to forward a "
            "session, with no authorization, routing, audit or limits. Issue 17's absolute targets (hop CPU "
            "<= 3.5 ms per setup, which was this bare hop's own figure then, and <= 1.3 s per GB each way) "
            "were measured against this floor on an earlier day, on a shared machine under another load: "
            "absolute figures do not carry over between days, so the postern/bare ratio, measured in the "
            "same run with the arms interleaved, is the figure to read. Two things the bare hop does not do, "
            "which these ratios carry: it offers x/crypto's default ciphers, so with the client's defaults "
            "it negotiates chacha20-poly1305 (no amd64 assembly in x/crypto) where Postern's proxy, offering "
            "AES-GCM only, negotiates AES-GCM: the AES-GCM rows compare the two hops on one cipher; and it "
            "does not re-arm TCP_QUICKACK, so its setup keeps the delayed-ACK/Nagle stalls Postern removed "
            "(issue 17, item 2): on setup latency it is no floor, on CPU and memory it is.\n")
    import json, os
    phases = [json.load(open(f"{collect}/phases_{r}.json")) for r in range(1, runs + 1)
              if os.path.exists(f"{collect}/phases_{r}.json")]
    if phases:
        f.write("\n## Setup phases through Postern\n\n")
        f.write(f"`psh bench ssh --phases` (x/crypto client, open loop at {phases[0]['rate']:g}/s for "
                f"{phases[0]['duration_s']:g} s per run, from 127.0.0.2-11), ms: median over runs (min-max). "
                "Phases: tcp connect, proxy kex, proxy auth, route + dial to the node, node kex, node auth, "
                "channel open (queue: the open-loop scheduler's own lag).\n\n")
        f.write(f"sessions: {sum(p['completed'] for p in phases)} completed, {sum(p['failed'] for p in phases)} failed\n\n")
        f.write("| phase | p50 | p90 | p99 | max |\n|---|---|---|---|---|\n")
        names = ["total"] + [p["name"] for p in phases[0].get("phases", [])]
        for name in names:
            rowv = []
            for q in ("p50_ms", "p90_ms", "p99_ms", "max_ms"):
                xs = []
                for p in phases:
                    st = p["latency"] if name == "total" else next((x for x in p.get("phases", []) if x["name"] == name), None)
                    if st:
                        xs.append(st[q])
                rowv.append(rng(xs))
            f.write(f"| {name} | " + " | ".join(rowv) + " |\n")
    if os.path.exists(f"{collect}/hold.json"):
        d = json.load(open(f"{collect}/hold.json"))
        h = d.get("hold") or {}
        su, l = h.get("setup", {}), d.get("latency", {})
        f.write("\n## Scale: one proxy holding idle ssh -J sessions\n\n")
        f.write("`bench/hold.sh`: `psh bench ssh --jump --hold N` (its own x/crypto clients in one process, "
                "each session a direct-tcpip channel as OpenSSH's ProxyJump opens), then new sessions open "
                f"loop at {d.get('rate', 0):g}/s for {d.get('duration_s', 0):g} s while they stay open. "
                "The node is a separate process.\n\n")
        f.write("| figure | value |\n|---|---|\n")
        f.write(f"| held sessions up / failed | {h.get('sessions')} / {h.get('failed')} |\n")
        f.write(f"| held sessions' setup (concurrency {d.get('concurrency')}), p50 / p99 ms | {su.get('p50_ms', 0):.1f} / {su.get('p99_ms', 0):.1f} |\n")
        f.write(f"| new sessions while held: completed / failed | {d.get('completed')} / {d.get('failed')} |\n")
        f.write(f"| new sessions' setup p50 / p99 / max, ms | {l.get('p50_ms', 0):.1f} / {l.get('p99_ms', 0):.1f} / {l.get('max_ms', 0):.1f} |\n")
        f.write(f"| proxy RSS per held session, KiB (gc_percent 400) | {h.get('rss_bytes_per_session', 0)/1024:.1f} |\n")
        f.write(f"| proxy goroutines per held session | {h.get('goroutines_per_session', 0):.2f} |\n")
        if os.path.exists(f"{collect}/hold_limits.txt"):
            f.write("\nLimits in force:\n\n```\n" + open(f"{collect}/hold_limits.txt").read() + "```\n")
        f.write("\nThe proxy holds two sockets per held session (client and node), so its descriptor limit "
                "caps a proxy at about half of it: with a hard RLIMIT_NOFILE of 20,000 (which only "
                "CAP_SYS_RESOURCE can raise) the proxy caps its SSH port at (20,000 - 256) / 2 = 9,872 "
                "connections, says so once at start, and refuses the next one with that reason.\n")
    extra = os.environ.get("REPORT_EXTRA", "")
    if extra and os.path.exists(extra):
        f.write("\n" + open(extra).read())
    f.write("\n## Notes\n\n")
    f.write("- The machine is shared (other engineers' builds and tests ran at the same time): absolute "
            "figures move by +-25% between runs; the ratios, taken within a run with the arms "
            "interleaved, are what to compare.\n")
    f.write("- Hop CPU per setup is the jump host's utime+stime over the setup rounds divided by the setups "
            "through it, each process's idle CPU rate (measured just before) taken out; sshd's includes its "
            "per-connection processes. Postern's auth runs in a process of "
            "its own (SPLIT_AUTH=1, the default since issue 17's second step; before, the proxy process ran "
            "auth and the figure included auth's work): its CPU over the same rounds, divided by the -J "
            "setups, is the auth row, an upper bound since the direct arm's sessions (their audit events "
            "and recordings) cost auth too.\n")
    f.write("- Memory is PSS (smaps_rollup) of the jump host's processes (sshd: the listener and its "
            "per-connection processes; postern: the proxy process; bare: the barehop process) before and "
            f"with {os.environ.get('MEM_N')} idle `ssh -J ... sleep` sessions ({os.environ.get('MEM_N_SSHD')} through sshd), "
            "divided by their number, read after MEM_SETTLE (15 s) of idle. It is measured first, on processes "
            "that have served only the set-up's logins, so that memory an earlier measurement left mapped is not "
            "reused by the sessions and hidden.\n")
print(f"wrote {out}")
PY
