#!/bin/bash
# Postern vs OpenSSH sshd as an `ssh -J` bastion, side by side in one run
# (issue 4's "benchmark against the anchor"), with a direct connection and a
# bare x/crypto hop as the two floors (issue 17).
#
# Every arm uses the same OpenSSH client, the same certificate from
# `pctl auth sign`, the same non-root login and the same target: a Postern
# node process. Only the jump host differs:
#   direct arm:  ssh                                postern-node (no hop: the limit)
#   bare arm:    ssh -J <bench/barehop>             postern-node
#   postern arm: ssh -J <Postern proxy>             postern-node
#   sshd arm:    ssh -J <OpenSSH sshd bastion>      postern-node
# bench/barehop is an x/crypto SSH server that accepts any key and forwards
# direct-tcpip channels, nothing else (no auth, RBAC, routing, audit): what
# the library Postern is built on costs for a hop, measured in the same run.
# It listens on 127.0.0.1:0 and prints its address on stdout's first line.
# Unlike Postern's proxy it offers x/crypto's default ciphers (OpenSSH then
# picks chacha20-poly1305 for it, AES-GCM for Postern: the AES-GCM rows are
# the like-for-like ones) and does not re-arm TCP_QUICKACK (its setup keeps
# the delayed-ACK stalls): a floor for CPU and memory, not for latency.
# The sshd bastion comes from openssh-baseline.sh (its setup/teardown, its
# throwaway user); it is told to trust Postern's user CA (a cert-authority
# line in its authorized_keys), so one certificate logs in on both hops.
# The Postern cluster is three processes on free loopback ports: auth,
# proxy (SPLIT_AUTH=1, the default) and a node joined with a token. The node
# is a separate process so that the proxy's memory is measured alone (in an
# all-in-one process the node's sessions would be counted as proxy memory).
#
# Measured, with the arms interleaved where the measurement allows it:
#   a. session setup: hyperfine of `ssh -J ... true` (ROUNDS rounds of RUNS
#      runs per arm, order reversed each round), median of all samples; also
#      with curve25519 forced on every hop (sshd's sntrup761 taken out); and
#      the jump host's CPU per setup (bare, postern, sshd; each process's
#      idle CPU rate, measured first, taken out; Postern's auth process is
#      a row of its own);
#  a2. the jump host's CPU per setup at a sustained rate (SUSTAINED_LOOPS
#      concurrent setup loops per hop, one after the other; see sustained());
#   b. throughput: TP_SIZE of zeros up (`cat >/dev/null`) and down
#      (`head -c`), TP_RUNS runs per arm, arms alternating (order reversed
#      every other run), median MB/s; also with AES-GCM forced on every hop
#      (cipher effect in isolation); and the jump host's CPU seconds per GB
#      (utime+stime from /proc of the bastion and its per-connection
#      processes, sampled during the run), which the machine's load does not
#      skew the way it skews MB/s;
#   c. memory per idle forwarded connection (measured first, on fresh
#      processes; MEM_N_SSHD for the sshd arm, MEM_SETTLE=15 s of idle
#      before the reading): MEM_N concurrent idle
#      `ssh -J ... sleep` sessions per arm; PSS (smaps_rollup) of the jump
#      host's processes (sshd: listener + every child and grandchild;
#      Postern: the proxy process; bare: the barehop process) before and
#      after, divided by MEM_N;
#   d. per-phase setup latency through Postern (psh bench ssh --phases).
# Then a table with every arm, postern/sshd ratios against issue 4's
# targets (setup <= 0.8x, throughput >= 1.0x, memory <= 1/20 = 0.05x), and
# the postern/direct and postern/bare ratios.
#
# usage: bench/postern-vs-openssh.sh          (root: it creates a user)
# env:   RUNS=20 ROUNDS=2 TP_RUNS=3 TP_SIZE=1G MEM_N=50 BASELINE_USER=sshbase
#        BUILD_DIR=build (postern, pctl, psh and barehop are built there
#          first, BUILD=0 reuses them; GOFLAGS_BENCH adds go build flags, e.g.
#          -overlay=FILE to try a change without touching the tree)
#        POSTERN_CONFIG=FILE: a postern.yaml the Postern processes start with
#          (flags still win; bench/load.sh uses it to lift the connection caps)
#        SPLIT_AUTH=0: one auth+proxy process instead of two
#        IDLE_CPU_S=5: seconds of idle CPU measured before the setup rounds
#        PROFILE=1: perf-record the proxy during one Postern upload
#        LATENCY=0: skip the setup measurement (a. and a2.)
#        SUSTAINED_S=15 SUSTAINED_LOOPS=3: a2., hop CPU per setup with that
#          many concurrent ssh -J loops per hop (SUSTAINED_S=0 skips it)
#        PHASES=0: skip psh bench's per-phase setup latency (d.; PHASE_RATE=20,
#          PHASE_DURATION=10s)
#        KEEP=1: keep the work dir (logs, JSON) instead of removing it
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
RUNS=${RUNS:-20}
ROUNDS=${ROUNDS:-2}
TP_RUNS=${TP_RUNS:-3}
TP_SIZE=${TP_SIZE:-1G}
MEM_N=${MEM_N:-50}
PROFILE=${PROFILE:-0}
KEEP=${KEEP:-0}
BUILD_DIR=${BUILD_DIR:-$REPO/build}
export BASELINE_USER=${BASELINE_USER:-sshbase}
BASELINE=${BASELINE:-$HERE/openssh-baseline.sh}

W=$(mktemp -d /tmp/postern-vs-openssh.XXXXXX)
chmod 755 "$W" # the login's home lives under it
export P=$W/ssh RUNS TP_RUNS TP_SIZE MEM_N
CFG=$W/ssh_config
CFG_AES=$W/ssh_config_aes
CFG_X25519=$W/ssh_config_x25519
RES=$W/results.tsv
LOGIN=$BASELINE_USER
NODENAME=bench-node
PIDS_POSTERN=()
BARE_PID=
CLIENT_PIDS=()
SLEEP_ARG="4321.$$" # unique, so the node's idle commands are ours to find

log() { printf '\n=== %s\n' "$*"; }
die() { echo "FATAL: $*" >&2; exit 1; }

cleanup() {
	local rc=$?
	log "cleanup"
	for p in "${CLIENT_PIDS[@]}"; do kill "$p" 2>/dev/null; done
	kill_sleeps
	for p in "${PIDS_POSTERN[@]}"; do
		kill "$p" 2>/dev/null && echo "  stopped postern $p"
	done
	for p in "${PIDS_POSTERN[@]}"; do wait "$p" 2>/dev/null; done
	if [ -n "$BARE_PID" ]; then
		kill "$BARE_PID" 2>/dev/null && echo "  stopped barehop $BARE_PID"
		wait "$BARE_PID" 2>/dev/null
	fi
	[ -d "$P" ] && bash "$BASELINE" teardown
	if [ "$KEEP" = 1 ]; then echo "  kept $W"; else rm -rf "$W" && echo "  removed $W"; fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

kill_sleeps() { # the node's `sleep $SLEEP_ARG` processes, by pid
	local s
	s=$(pgrep -u "$LOGIN" -f "^sleep $SLEEP_ARG\$" 2>/dev/null | tr '\n' ' ')
	[ -n "$s" ] && kill $s 2>/dev/null
	return 0
}

install_tools() {
	local missing=()
	command -v hyperfine >/dev/null || missing+=(hyperfine)
	[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
	command -v ssh >/dev/null || missing+=(openssh-client)
	if [ ${#missing[@]} -gt 0 ]; then
		log "installing ${missing[*]}"
		apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]}"
	fi
}

build() {
	# The binaries run from the work dir: a rebuild of $BUILD_DIR during
	# the run (make build) must not pull them away from under perf.
	mkdir -p "$W/bin"
	local b
	for b in postern pctl psh barehop; do [ -x "$BUILD_DIR/$b" ] || BUILD=1; done
	if [ "${BUILD:-1}" = 1 ]; then
		log "building postern, pctl, psh and barehop into $BUILD_DIR"
		mkdir -p "$BUILD_DIR"
		(cd "$REPO" && go build ${GOFLAGS_BENCH:-} -o "$BUILD_DIR/" ./tool/postern ./tool/pctl ./tool/psh ./bench/barehop) || die "go build"
	fi
	cp "$BUILD_DIR/postern" "$BUILD_DIR/pctl" "$BUILD_DIR/psh" "$BUILD_DIR/barehop" "$W/bin/" || die "copying the binaries"
	BIN=$W/bin
}

free_ports() { # n -> n distinct free loopback ports
	python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

pctl() { "$BIN/pctl" --data-dir "$W/auth" "$@"; }

wait_for() { # tries cmd...
	local n=$1 i
	shift
	for i in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
	return 1
}

start_postern() {
	# SPLIT_AUTH=1 (the default): auth in a process of its own, so that
	# the proxy's CPU and memory are the jump host's alone, as a bare
	# x/crypto hop's or sshd's are (auth's work per session, writing the
	# proxy's and the node's audit events and recordings, is measured on
	# its own: AUTH_PID). SPLIT_AUTH=0: one auth+proxy process, as before.
	local split=${SPLIT_AUTH:-1}
	log "Postern cluster ($([ "$split" = 1 ] && echo "auth process, proxy process" || echo "auth+proxy process"), node process) in $W"
	# PP: the proxy's peering port, on loopback like the rest (its default,
	# 0.0.0.0:3021, would collide with any other suite running meanwhile).
	read -r PA PS PW PD PN PD2 PT PD3 PP <<<"$(free_ports 9)"
	local out token pin
	if [ "$split" = 1 ]; then
		"$BIN/postern" start --data-dir "$W/auth" --roles auth --cluster-name bench \
			--auth-addr "127.0.0.1:$PA" --diag-addr "127.0.0.1:$PD3" --nodename bench-auth \
			${POSTERN_CONFIG:+--config "$POSTERN_CONFIG"} >"$W/auth.log" 2>&1 &
		AUTH_PID=$!
		PIDS_POSTERN+=("$AUTH_PID")
		wait_for 150 pctl users ls || { tail -20 "$W/auth.log"; die "auth did not start"; }
		out=$(pctl tokens add --type proxy) || die "pctl tokens add --type proxy"
		token=$(grep -oE -- '--token [^ ]+' <<<"$out" | head -1 | cut -d' ' -f2)
		pin=$(grep -oE -- '--ca-pin sha256:[0-9a-f]+' <<<"$out" | head -1 | cut -d' ' -f2)
		"$BIN/postern" start --data-dir "$W/proxy" --roles proxy --nodename bench-proxy \
			--auth-server "127.0.0.1:$PA" --token "$token" --ca-pin "$pin" \
			--ssh-addr "127.0.0.1:$PS" --web-addr "127.0.0.1:$PW" --tunnel-addr "127.0.0.1:$PT" --peer-addr "127.0.0.1:$PP" \
			--diag-addr "127.0.0.1:$PD" ${POSTERN_CONFIG:+--config "$POSTERN_CONFIG"} >"$W/proxy.log" 2>&1 &
		PROXY_PID=$!
		PIDS_POSTERN+=("$PROXY_PID")
		wait_for 150 curl -sf "http://127.0.0.1:$PD/readyz" || { tail -20 "$W/proxy.log"; die "proxy did not start"; }
	else
		"$BIN/postern" start --data-dir "$W/auth" --roles auth,proxy --cluster-name bench \
			--auth-addr "127.0.0.1:$PA" --ssh-addr "127.0.0.1:$PS" --web-addr "127.0.0.1:$PW" --tunnel-addr "127.0.0.1:$PT" \
			--peer-addr "127.0.0.1:$PP" --diag-addr "127.0.0.1:$PD" --nodename bench-proxy ${POSTERN_CONFIG:+--config "$POSTERN_CONFIG"} >"$W/proxy.log" 2>&1 &
		PROXY_PID=$!
		AUTH_PID=$PROXY_PID
		PIDS_POSTERN+=("$PROXY_PID")
		wait_for 150 pctl users ls || { tail -20 "$W/proxy.log"; die "auth+proxy did not start"; }
	fi
	out=$(pctl tokens add --type node) || die "pctl tokens add"
	# head -1: pctl prints the join command twice (direct and through the
	# proxy), with the same token and pin.
	token=$(grep -oE -- '--token [^ ]+' <<<"$out" | head -1 | cut -d' ' -f2)
	pin=$(grep -oE -- '--ca-pin sha256:[0-9a-f]+' <<<"$out" | head -1 | cut -d' ' -f2)
	"$BIN/postern" start --data-dir "$W/node" --roles node --nodename "$NODENAME" \
		--auth-server "127.0.0.1:$PA" --token "$token" --ca-pin "$pin" \
		--node-addr "127.0.0.1:$PN" --diag-addr "127.0.0.1:$PD2" ${POSTERN_CONFIG:+--config "$POSTERN_CONFIG"} >"$W/node.log" 2>&1 &
	NODE_PID=$!
	PIDS_POSTERN+=("$NODE_PID")
	printf 'correct horse battery staple\n' | pctl users add alice --logins "$LOGIN" >/dev/null || die "pctl users add"
	pctl auth sign --user alice --ttl 3h --out "$W/alice" >/dev/null || die "pctl auth sign"
	wait_for 150 sh -c "'$BIN/pctl' --data-dir '$W/auth' nodes ls | grep -q $NODENAME" ||
		{ tail -20 "$W/node.log"; die "node did not register"; }
	echo "  proxy pid $PROXY_PID ssh 127.0.0.1:$PS; auth pid $AUTH_PID; node pid $NODE_PID ssh 127.0.0.1:$PN"
}

start_bare() {
	# The bare arm's jump host: bench/barehop on a port of its own choosing
	# (127.0.0.1:0), read back from the first line it prints.
	log "bare x/crypto hop (bench/barehop)"
	"$BIN/barehop" --addr 127.0.0.1:0 >"$W/barehop.out" 2>"$W/barehop.log" &
	BARE_PID=$!
	wait_for 50 test -s "$W/barehop.out" || { cat "$W/barehop.log"; die "barehop printed no address"; }
	BARE_ADDR=$(head -1 "$W/barehop.out")
	BARE_PORT=${BARE_ADDR##*:}
	case "$BARE_ADDR" in 127.0.0.1:[0-9]*) ;; *) die "barehop printed '$BARE_ADDR', not a loopback address" ;; esac
	kill -0 "$BARE_PID" 2>/dev/null || { cat "$W/barehop.log"; die "barehop exited"; }
	echo "  barehop pid $BARE_PID ssh $BARE_ADDR"
}

user_ca_line() { # the CA that signed the certificate, as an authorized_keys cert-authority line
	python3 - "$W/alice-cert.pub" <<'PY'
import base64, struct, sys
blob = base64.b64decode(open(sys.argv[1]).read().split()[1])
def s(b, o):
    n = struct.unpack(">I", b[o:o+4])[0]; return b[o+4:o+4+n], o+4+n
t, o = s(blob, 0)
if t != b"ssh-ed25519-cert-v01@openssh.com":
    sys.exit("unexpected certificate type %r" % t)
_, o = s(blob, o)  # nonce
_, o = s(blob, o)  # ed25519 public key
o += 8 + 4          # serial, type
_, o = s(blob, o)  # key id
_, o = s(blob, o)  # principals
o += 16             # valid after, valid before
_, o = s(blob, o)  # critical options
_, o = s(blob, o)  # extensions
_, o = s(blob, o)  # reserved
ca, o = s(blob, o) # signature key
kt, _ = s(ca, 0)
print("cert-authority %s %s postern-user-ca" % (kt.decode(), base64.b64encode(ca).decode()))
PY
}

write_ssh_config() {
	# Host-specific lines first: ssh_config takes the first value it sees.
	cat >"$CFG" <<EOF
Host sshd-bastion
  HostName 127.0.0.1
  Port 2201
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
Host postern-proxy
  HostName 127.0.0.1
  Port $PS
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
Host bare-hop
  HostName 127.0.0.1
  Port $BARE_PORT
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
Host via-sshd
  ProxyJump sshd-bastion
Host via-postern
  ProxyJump postern-proxy
Host via-bare
  ProxyJump bare-hop
Host via-sshd via-postern via-bare direct
  HostName 127.0.0.1
  Port $PN
  HostKeyAlias $NODENAME
Host *
  User $LOGIN
  IdentityFile $W/alice
  CertificateFile $W/alice-cert.pub
  IdentitiesOnly yes
  UserKnownHostsFile $W/alice.known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
  ControlMaster no
  ControlPath none
EOF
	sed 's/^Host \*$/Host *\n  Ciphers aes128-gcm@openssh.com/' "$CFG" >"$CFG_AES"
	# OpenSSH 9.2 prefers sntrup761x25519, which only sshd offers and which
	# costs the client ~60-120 ms of CPU here: this config takes the key
	# exchange out of the comparison (an extra, informational row).
	sed 's/^Host \*$/Host *\n  KexAlgorithms curve25519-sha256/' "$CFG" >"$CFG_X25519"
}

setup() {
	install_tools
	build
	for port in 2201 2202; do
		ss -Htln "sport = :$port" | grep -q . && die "port $port is busy (openssh-baseline.sh uses it)"
	done
	log "OpenSSH sshd bastion (openssh-baseline.sh setup, user $LOGIN)"
	MEM_N=0 bash "$BASELINE" setup || die "baseline setup"
	start_postern
	start_bare
	user_ca_line >>"$P/authorized_keys" || die "reading the user CA from the certificate"
	write_ssh_config
	local h
	for h in direct via-sshd via-postern via-bare; do
		out=$(ssh -F "$CFG" "$h" 'echo ok $(id -un)' 2>&1)
		[ "$out" = "ok $LOGIN" ] || die "ssh $h: $out"
	done
	echo "  direct, via-sshd, via-postern and via-bare logins OK as $LOGIN"
	echo "  negotiated (ssh -v; first block = jump hop, second = node):"
	for h in via-sshd via-postern via-bare; do
		echo "  $h:"
		ssh -F "$CFG" -v "$h" true 2>&1 | grep -E 'kex: algorithm|kex: (client->server)' |
			sed -E 's/^debug1: /    /; s/ MAC: <implicit> compression: none//'
	done
}

record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$RES"; } # metric arm value

proc_cpu_ticks() { # pid -> utime+stime+cutime+cstime (children reaped by pid included)
	awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat"
}

wait_quiet() { # pid: until it spends at most 2 ticks in a second (30 s at most)
	local i c0
	for i in $(seq 30); do
		c0=$(proc_cpu_ticks "$1")
		sleep 1
		[ $(($(proc_cpu_ticks "$1") - c0)) -le 2 ] && return 0
	done
	echo "  WARNING: pid $1 still busy after 30 s"
}

# Hop CPU per setup at a sustained rate: SUSTAINED_LOOPS concurrent
# `ssh -J ... true` loops per hop for SUSTAINED_S seconds, each loop from
# its own 127.0.0.x (a BindAddress on the jump hop: Postern admits 20 new
# connections per second per address), the hop's CPU over the window
# divided by the setups that completed in it. hyperfine's rounds (a.) run
# one setup at a time, so each pays for waking an idle process (the Go
# scheduler's spinning and parking, the kernel's wake-ups) as well; a proxy
# under a steady stream of logins (issue 17: "a 2-core proxy sustains >=
# 300 new sessions/s") pays that once per burst, not per setup. An idle
# hop spends nothing (a.'s idle reading: 0 ticks in 5 s), so nothing is
# subtracted.
sustained() {
	[ "${SUSTAINED_S:-15}" -gt 0 ] || return 0
	local loops=${SUSTAINED_LOOPS:-3} dur=${SUSTAINED_S:-15} arm i hop cfgs pid c0 c1 n0 n1 lp
	log "a2. hop CPU per setup at a sustained rate: $loops concurrent ssh -J loops per hop for $dur s"
	for arm in bare postern sshd; do
		case $arm in sshd) hop=sshd-bastion ;; bare) hop=bare-hop ;; *) hop=postern-proxy ;; esac
		pid=$(bastion_pid "$arm")
		: >"$W/sustained.$arm"
		rm -f "$W/sustained.stop"
		lp=()
		for i in $(seq "$loops"); do
			printf 'Host %s\n  BindAddress 127.0.0.%d\n' "$hop" $((i + 1)) | cat - "$CFG" >"$W/cfg.sustained.$i"
			(while [ ! -f "$W/sustained.stop" ]; do
				ssh -F "$W/cfg.sustained.$i" "via-$arm" true </dev/null && echo >>"$W/sustained.$arm"
			done) &
			lp+=($!)
		done
		sleep 1
		c0=$(proc_cpu_ticks "$pid"); n0=$(wc -l <"$W/sustained.$arm")
		sleep "$dur"
		c1=$(proc_cpu_ticks "$pid"); n1=$(wc -l <"$W/sustained.$arm")
		touch "$W/sustained.stop"
		wait "${lp[@]}" 2>/dev/null
		if [ $((n1 - n0)) -gt 0 ]; then
			v=$(awk -v t=$((c1 - c0)) -v n=$((n1 - n0)) -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.2f", t*1000/hz/n}')
			echo "  $arm: $((n1 - n0)) setups in $dur s ($(awk -v n=$((n1 - n0)) -v d="$dur" 'BEGIN{printf "%.1f", n/d}')/s), hop CPU $v ms per setup"
			record cpu_setup_ms_sustained "$arm" "$v"
		else
			echo "  WARNING: $arm: no setup completed"
		fi
	done
}

latency() {
	log "a. session setup: hyperfine -N, $ROUNDS rounds x $RUNS runs per arm, hop order reversed each round"
	local r pc0 sc0 pc1 sc1 hz setups
	hz=$(getconf CLK_TCK)
	# Hop CPU per setup: the jump host's CPU over the rounds divided by
	# the setups through it (each arm runs twice per round: default and
	# curve25519, each with 2 warm-ups). sshd's per-connection processes
	# are reaped by the listener, so its cutime/cstime hold them; Postern's
	# auth (the audit events of proxy and node) is its own process and row
	# (SPLIT_AUTH=0: counted in the proxy's). What each process spends idle
	# (heartbeats, watchers, GC), measured over IDLE_CPU_S seconds first, is
	# taken out for the time the rounds took.
	local t0 t1 pi0 si0 ai0 bi0 pidle sidle aidle bidle ac0 ac1 bc0 bc1 spid
	spid=$(cat "$P/sshd_bastion.pid")
	# The memory arm ran just before: auth may still be writing the
	# thousand sessions' end events. Measure idle once it is idle.
	wait_quiet "$AUTH_PID"
	pi0=$(proc_cpu_ticks "$PROXY_PID"); si0=$(proc_cpu_ticks "$spid"); ai0=$(proc_cpu_ticks "$AUTH_PID"); bi0=$(proc_cpu_ticks "$BARE_PID")
	sleep "${IDLE_CPU_S:-5}"
	pidle=$(( $(proc_cpu_ticks "$PROXY_PID") - pi0 )); sidle=$(( $(proc_cpu_ticks "$spid") - si0 ))
	aidle=$(( $(proc_cpu_ticks "$AUTH_PID") - ai0 )); bidle=$(( $(proc_cpu_ticks "$BARE_PID") - bi0 ))
	echo "  idle CPU over ${IDLE_CPU_S:-5} s: postern $pidle ticks, sshd $sidle ticks, bare $bidle ticks, postern auth $aidle ticks (hz $hz)"
	t0=$(date +%s%N)
	pc0=$(proc_cpu_ticks "$PROXY_PID"); sc0=$(proc_cpu_ticks "$spid"); ac0=$(proc_cpu_ticks "$AUTH_PID"); bc0=$(proc_cpu_ticks "$BARE_PID")
	for r in $(seq "$ROUNDS"); do
		# The three hops in one order on odd rounds, reversed on even ones
		# (postern stays in the middle), default and curve25519 alike.
		local a=(-n sshd "ssh -F $CFG via-sshd true" -n postern "ssh -F $CFG via-postern true" -n bare "ssh -F $CFG via-bare true")
		local x=(-n sshd-x25519 "ssh -F $CFG_X25519 via-sshd true" -n postern-x25519 "ssh -F $CFG_X25519 via-postern true"
			-n bare-x25519 "ssh -F $CFG_X25519 via-bare true")
		if [ $((r % 2)) = 0 ]; then
			a=(-n bare "ssh -F $CFG via-bare true" -n postern "ssh -F $CFG via-postern true" -n sshd "ssh -F $CFG via-sshd true")
			x=(-n bare-x25519 "ssh -F $CFG_X25519 via-bare true" -n postern-x25519 "ssh -F $CFG_X25519 via-postern true"
				-n sshd-x25519 "ssh -F $CFG_X25519 via-sshd true")
		fi
		hyperfine -N --style basic --warmup 2 --runs "$RUNS" --export-json "$W/latency_$r.json" \
			"${a[@]}" -n direct "ssh -F $CFG direct true" "${x[@]}" \
			2>&1 | grep -E '^(Benchmark|  Time)'
	done
	pc1=$(proc_cpu_ticks "$PROXY_PID"); sc1=$(proc_cpu_ticks "$spid"); ac1=$(proc_cpu_ticks "$AUTH_PID"); bc1=$(proc_cpu_ticks "$BARE_PID")
	t1=$(date +%s%N)
	setups=$((ROUNDS * 2 * (RUNS + 2)))
	per_setup() { # before after idle-ticks -> ms per setup, idle rate taken out
		awk -v a="$1" -v b="$2" -v idle="$3" -v n="$setups" -v hz="$hz" -v el="$(( (t1 - t0) / 1000000 ))" -v is="${IDLE_CPU_S:-5}" \
			'BEGIN{v = ((b-a) - idle*(el/1000)/is)*1000/hz/n; if (v < 0) v = 0; printf "%.2f", v}'
	}
	record cpu_setup_ms postern "$(per_setup "$pc0" "$pc1" "$pidle")"
	record cpu_setup_ms sshd "$(per_setup "$sc0" "$sc1" "$sidle")"
	record cpu_setup_ms bare "$(per_setup "$bc0" "$bc1" "$bidle")"
	# The direct arm's sessions also cost auth (the node's audit events
	# and recordings), so this is an upper bound of a -J setup's.
	[ "$AUTH_PID" != "$PROXY_PID" ] && record cpu_setup_ms_auth postern "$(per_setup "$ac0" "$ac1" "$aidle")"
	echo "  hop CPU per setup ($setups setups per arm over $(( (t1 - t0) / 1000000 )) ms): postern $(per_setup "$pc0" "$pc1" "$pidle") ms, sshd $(per_setup "$sc0" "$sc1" "$sidle") ms, bare $(per_setup "$bc0" "$bc1" "$bidle") ms; postern auth $(per_setup "$ac0" "$ac1" "$aidle") ms"
	python3 - "$W" "$ROUNDS" >>"$RES" <<'PY'
import json, statistics, sys
w, rounds = sys.argv[1], int(sys.argv[2])
times = {}
for r in range(1, rounds + 1):
    for res in json.load(open(f"{w}/latency_{r}.json"))["results"]:
        times.setdefault(res["command"], []).extend(res["times"])
for name, t in times.items():
    metric, arm = "setup_ms", name
    if name.endswith("-x25519"):
        metric, arm = "setup_ms_x25519", name[: -len("-x25519")]
    print(f"{metric}\t{arm}\t{statistics.median(t)*1000:.1f}")
PY
}

tp_once() { # cmd -> MB/s
	local bytes s e
	bytes=$(numfmt --from=iec "$TP_SIZE")
	s=$(date +%s%N)
	bash -c "$1" || { echo "FAILED: $1" >&2; echo 0; return; }
	e=$(date +%s%N)
	awk -v b="$bytes" -v s="$s" -v e="$e" 'BEGIN{printf "%.1f\n", b/1e6/((e-s)/1e9)}'
}

bastion_pid() { # arm -> the root pid of that arm's jump host
	case "$1" in
	sshd) cat "$P/sshd_bastion.pid" ;;
	bare) echo "$BARE_PID" ;;
	*) echo "$PROXY_PID" ;;
	esac
}

cpu_sampler() { # root-pid outfile: until killed, every 0.1 s, writes
	# "pid utime+stime" of root and every descendant, keeping each pid's
	# last value: sshd's per-connection processes exit with the transfer, so
	# their CPU time is read while they are alive (the last 0.1 s is lost)
	local root=$1 out=$2 p
	while :; do
		for p in $(descendants "$root"); do
			awk -v p="$p" '{print p, $14 + $15}' "/proc/$p/stat" 2>/dev/null
		done >>"$out"
		sleep 0.1
	done
}

cpu_seconds() { # before-file during-file -> CPU seconds used in between
	awk -v hz="$(getconf CLK_TCK)" 'FNR == NR {before[$1] = $2; next} {last[$1] = $2}
		END {for (p in last) t += last[p] - before[p]; printf "%.2f\n", t / hz}' "$1" "$2"
}

throughput() {
	log "b. throughput: $TP_SIZE of zeros each way, $TP_RUNS runs per arm, arms alternating (MB = 1e6 bytes)"
	local cfgname cfg dir i arm order cmd v bp cpu sampler p host
	for cfgname in default aesgcm; do
		cfg=$CFG
		[ $cfgname = aesgcm ] && cfg=$CFG_AES
		for dir in upload download; do
			for i in $(seq "$TP_RUNS"); do
				order="sshd postern bare direct"
				[ $((i % 2)) = 0 ] && order="direct bare postern sshd"
				for arm in $order; do
					host=via-$arm
					[ $arm = direct ] && host=direct
					if [ $dir = upload ]; then
						cmd="head -c $TP_SIZE /dev/zero | ssh -F $cfg $host 'cat >/dev/null'"
					else
						cmd="ssh -F $cfg $host 'head -c $TP_SIZE /dev/zero' >/dev/null"
					fi
					if [ $arm = direct ]; then # no hop: the limit, no jump host CPU
						v=$(tp_once "$cmd")
						printf '  %-8s %-8s %-8s run %d: %7.1f MB/s\n' "$cfgname" "$dir" "$arm" "$i" "$v"
						record "tp_${dir}_${cfgname}" "$arm" "$v"
						continue
					fi
					bp=$(bastion_pid "$arm")
					: >"$W/cpu_during"
					for p in $(descendants "$bp"); do awk -v p="$p" '{print p, $14 + $15}' "/proc/$p/stat"; done >"$W/cpu_before"
					cpu_sampler "$bp" "$W/cpu_during" &
					sampler=$!
					v=$(tp_once "$cmd")
					kill "$sampler"; wait "$sampler" 2>/dev/null
					cpu=$(awk -v s="$(cpu_seconds "$W/cpu_before" "$W/cpu_during")" -v bytes="$(numfmt --from=iec "$TP_SIZE")" \
						'BEGIN{printf "%.2f", s/(bytes/1e9)}')
					printf '  %-8s %-8s %-8s run %d: %7.1f MB/s, jump host CPU %5.2f s/GB\n' "$cfgname" "$dir" "$arm" "$i" "$v" "$cpu"
					record "tp_${dir}_${cfgname}" "$arm" "$v"
					record "cpu_${dir}_${cfgname}" "$arm" "$cpu"
				done
			done
		done
	done
}

profile() {
	[ "$PROFILE" = 1 ] || return 0
	command -v perf >/dev/null || { echo "  perf not installed: no profile"; return 0; }
	log "profile: perf record of the Postern proxy during one $TP_SIZE upload via postern"
	perf record -F 499 -g -o "$W/perf.data" -p "$PROXY_PID" -- sleep 1000 >/dev/null 2>&1 &
	local perfpid=$!
	sleep 0.5
	v=$(tp_once "head -c $TP_SIZE /dev/zero | ssh -F $CFG via-postern 'cat >/dev/null'")
	kill -INT "$perfpid"; wait "$perfpid" 2>/dev/null
	echo "  upload during profiling: $v MB/s; top symbols of the proxy (self):"
	perf report -i "$W/perf.data" --no-children --sort dso,symbol --stdio 2>/dev/null |
		grep -E '^\s+[0-9.]+%' | head -25 | sed 's/^/  /'
}

descendants() { # pid -> pid and all its descendants
	local p=$1 c
	echo "$p"
	for c in $(pgrep -P "$p"); do descendants "$c"; done
}

pss_of() { # pids... -> "PSS_KiB RSS_KiB nprocs"
	local p pss=0 rss=0 n=0 q r
	for p in "$@"; do
		q=$(awk '/^Pss:/{print $2}' "/proc/$p/smaps_rollup" 2>/dev/null) || continue
		r=$(awk '/^Rss:/{print $2}' "/proc/$p/smaps_rollup" 2>/dev/null)
		pss=$((pss + ${q:-0})); rss=$((rss + ${r:-0})); n=$((n + 1))
	done
	echo "$pss $rss $n"
}

mem_arm() { # arm bastion-root-pid [n]
	local arm=$1 root=$2 i up pss0 rss0 n0 pss1 rss1 n1 t0
	local MEM_N=${3:-$MEM_N}
	read -r pss0 rss0 n0 <<<"$(pss_of $(descendants "$root"))"
	CLIENT_PIDS=()
	t0=$(date +%s%N)
	for i in $(seq "$MEM_N"); do
		ssh -F "$CFG" "via-$arm" "sleep $SLEEP_ARG" </dev/null >/dev/null 2>&1 &
		CLIENT_PIDS+=($!)
		sleep 0.05
	done
	for i in $(seq 600); do
		up=$(pgrep -c -u "$LOGIN" -f "^sleep $SLEEP_ARG\$")
		[ "${up:-0}" -ge "$MEM_N" ] && break
		sleep 0.1
	done
	# Idle means idle for a while: every jump host gets MEM_SETTLE
	# seconds with nothing to do before the reading, which is long enough
	# for Postern's idle-memory trim (lib/memtrim: one quiet 10 s
	# interval) to give back the setup's garbage, as a long-idle proxy
	# would have. Read 2 s after the last session instead, a gc_percent 400
	# heap still holds it.
	sleep "${MEM_SETTLE:-15}"
	read -r pss1 rss1 n1 <<<"$(pss_of $(descendants "$root"))"
	printf '  %-8s %d/%d sessions up in %d ms; bastion procs %d -> %d; PSS %d -> %d KiB (RSS %d -> %d): %.1f KiB PSS per connection\n' \
		"$arm" "$up" "$MEM_N" $((($(date +%s%N) - t0) / 1000000)) "$n0" "$n1" "$pss0" "$pss1" "$rss0" "$rss1" \
		"$(awk -v a="$pss0" -v b="$pss1" -v n="$MEM_N" 'BEGIN{print (b-a)/n}')"
	record mem_kib_per_conn "$arm" "$(awk -v a="$pss0" -v b="$pss1" -v n="$MEM_N" 'BEGIN{printf "%.1f", (b-a)/n}')"
	[ "${up:-0}" -ge "$MEM_N" ] || echo "  WARNING: only $up of $MEM_N sessions came up"
	for p in "${CLIENT_PIDS[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${CLIENT_PIDS[@]}"; do wait "$p" 2>/dev/null; done
	CLIENT_PIDS=()
	kill_sleeps
	# wait until the bastion has let go of them
	for i in $(seq 100); do
		[ "$(descendants "$root" | wc -l)" -le "$n0" ] && break
		sleep 0.1
	done
}

memory() {
	[ "$MEM_N" -gt 0 ] || { log "c. memory: skipped (MEM_N=0)"; return; }
	log "c. memory per idle forwarded connection: $MEM_N concurrent 'ssh -J ... sleep' sessions per Go hop, ${MEM_N_SSHD:-$MEM_N} through sshd"
	mem_arm sshd "$(bastion_pid sshd)" "${MEM_N_SSHD:-$MEM_N}"
	mem_arm postern "$(bastion_pid postern)"
	mem_arm bare "$(bastion_pid bare)"
}

table() {
	log "results (postern/sshd ratios against issue 4's targets; postern/direct and postern/bare: the floors)"
	python3 - "$RES" <<'PY'
import statistics, sys
vals = {}
for line in open(sys.argv[1]):
    m, arm, v = line.rstrip("\n").split("\t")
    vals.setdefault(m, {}).setdefault(arm, []).append(float(v))
rows = [
    ("session setup, ms (median)", "setup_ms", "<= 0.80", lambda r: r <= 0.8),
    ("jump host CPU per setup, ms", "cpu_setup_ms", "(info)", None),
    ("  ... at a sustained rate, ms", "cpu_setup_ms_sustained", "(info)", None),
    ("setup, ms, kex curve25519 forced", "setup_ms_x25519", "(info)", None),
    ("upload MB/s (default ciphers)", "tp_upload_default", ">= 1.00", lambda r: r >= 1.0),
    ("download MB/s (default ciphers)", "tp_download_default", ">= 1.00", lambda r: r >= 1.0),
    ("upload MB/s (AES-GCM forced)", "tp_upload_aesgcm", "(info)", None),
    ("download MB/s (AES-GCM forced)", "tp_download_aesgcm", "(info)", None),
    ("jump host CPU s/GB, upload", "cpu_upload_default", "(info)", None),
    ("jump host CPU s/GB, download", "cpu_download_default", "(info)", None),
    ("jump host CPU s/GB, up, AES-GCM", "cpu_upload_aesgcm", "(info)", None),
    ("jump host CPU s/GB, down, AES-GCM", "cpu_download_aesgcm", "(info)", None),
    ("PSS per idle -J connection, KiB", "mem_kib_per_conn", "<= 0.05", lambda r: r <= 0.05),
]
print(f"{'metric':34} {'sshd':>9} {'postern':>9} {'bare':>9} {'direct':>9} {'p/sshd':>7}  target   ok  {'p/direct':>8} {'p/bare':>7}")
for title, key, target, ok in rows:
    if key not in vals:
        continue
    d = vals[key]
    med = {a: statistics.median(v) for a, v in d.items()}
    s, p = med.get("sshd"), med.get("postern")
    ratio = p / s if s and p is not None else float("nan")
    verdict = "" if ok is None else ("yes" if ok(ratio) else "NO")
    fmt = lambda x: f"{x:9.1f}" if x is not None else f"{'-':>9}"
    dr, b = med.get("direct"), med.get("bare")
    pd = f"{p / dr:8.3f}" if dr and p is not None else f"{'':8}"
    pb = f"{p / b:7.3f}" if b and p is not None else ""
    print(f"{title:34} {fmt(s)} {fmt(p)} {fmt(b)} {fmt(dr)} {ratio:7.3f}  {target:8} {verdict:3} {pd} {pb}")
PY
}

phases() {
	# d. Per-phase setup latency through Postern: psh bench ssh (its own
	# x/crypto client, open loop at PHASE_RATE/s for PHASE_DURATION, from
	# 127.0.0.2-11 so the per-address new-connection limit stays out of
	# it). Written to $W/phases.json for the report.
	[ "${PHASES:-1}" = 1 ] || return 0
	log "d. setup phases: psh bench ssh --phases at ${PHASE_RATE:-20}/s for ${PHASE_DURATION:-10s}"
	local src="" i
	for i in $(seq 2 11); do src="$src --source 127.0.0.$i"; done
	export POSTERN_HOME=$W/psh-home
	printf 'correct horse battery staple\n' | "$BIN/psh" login --proxy "127.0.0.1:$PW" --user alice --insecure --add-keys-to-agent no >/dev/null ||
		{ echo "  psh login failed: no phases"; return 0; }
	"$BIN/psh" bench ssh --rate "${PHASE_RATE:-20}" --duration "${PHASE_DURATION:-10s}" --phases --format json $src "$LOGIN@$NODENAME" >"$W/phases.json" ||
		{ echo "  psh bench failed"; rm -f "$W/phases.json"; return 0; }
	python3 - "$W/phases.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"  {d['completed']}/{d['scheduled']} completed, {d['failed']} failed")
for p in [dict(d["latency"], name="total")] + d.get("phases", []):
    print(f"  {p['name']:13} p50 {p['p50_ms']:7.2f}  p90 {p['p90_ms']:7.2f}  p99 {p['p99_ms']:7.2f}  max {p['max_ms']:7.2f} ms")
PY
}

# Sourced (bench/load.sh reuses the setup and helpers above): define only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

echo "postern-vs-openssh: $(ssh -V 2>&1); $(date -u '+%F %T UTC'); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
setup
# Memory first, on processes that have only served setup()'s logins: the
# setups of the latency rounds and a transfer grow a Go heap, and memory the
# runtime keeps mapped afterwards would be reused by the idle sessions and
# hide their cost.
memory
[ "${LATENCY:-1}" = 1 ] && latency
[ "${LATENCY:-1}" = 1 ] && sustained
phases
throughput
profile
table
