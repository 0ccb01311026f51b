#!/usr/bin/env bash
# make run: start an all-in-one Postern cluster (auth + proxy + node) on the
# embedded SQLite backend in $DATA_DIR, create a first user named after the
# current OS user, and print how to get in. Safe to run again: an existing
# cluster and user are reused, a running one is left alone.
#
# PORT_BASE (default 3000) moves every port: diagnostics PORT_BASE,
# peer +21, node SSH +22, proxy SSH +23, tunnel +24, auth +25, web +80
# (scripts/ports.sh). A busy port stops it with a message naming the port
# and the knob: `make run PORT_BASE=4000`.
set -euo pipefail

DATA_DIR=${DATA_DIR:-$PWD/.postern-data}
BUILD_DIR=${BUILD_DIR:-build}
# The demo cluster is named after this machine: nodes are reached as
# HOST.CLUSTER, and `psh config` writes `Host *.CLUSTER` for OpenSSH, which
# for a name like "local" would capture every mDNS host. The short host
# name, made a valid cluster name; a special-use one (localhost) or none
# falls back to postern-demo.
default_cluster() {
  local h
  h=$(hostname -s 2>/dev/null || uname -n)
  h=${h%%.*}
  h=$(printf '%s' "$h" | tr '[:upper:]' '[:lower:]' | tr -c 'a-z0-9-' '-' | sed -e 's/^-*//' -e 's/-*$//' | cut -c1-63)
  case "$h" in
    "" | localhost | local | localdomain | test | invalid | example | internal | lan | home) h=postern-demo ;;
  esac
  printf '%s\n' "$h"
}
CLUSTER=${CLUSTER:-$(default_cluster)}
BIND=${POSTERN_BIND:-127.0.0.1}
POSTERN="$BUILD_DIR/postern"
PCTL="$BUILD_DIR/pctl"
PSH="$BUILD_DIR/psh"
OS_USER=$(id -un)
PIDFILE="$DATA_DIR/postern.pid"
# The base the running cluster was started with, for a second `make run`.
BASEFILE="$DATA_DIR/port_base"
LOG="$DATA_DIR/postern.log"

# shellcheck source=scripts/ports.sh
. "$(dirname "$0")/ports.sh"

mkdir -p "$DATA_DIR"
chmod 700 "$DATA_DIR"

set_ports() {
  PORT_BASE=$1
  check_base "$PORT_BASE" "$OFF_WEB"
  DIAG_PORT=$((PORT_BASE + OFF_DIAG)) PEER_PORT=$((PORT_BASE + OFF_PEER))
  NODE_PORT=$((PORT_BASE + OFF_NODE)) SSH_PORT=$((PORT_BASE + OFF_SSH))
  TUNNEL_PORT=$((PORT_BASE + OFF_TUNNEL)) AUTH_PORT=$((PORT_BASE + OFF_AUTH))
  WEB_PORT=$((PORT_BASE + OFF_WEB))
}

instructions() {
  local password=${1:-}
  cat <<MSG

Postern is running: cluster "$CLUSTER", data in $DATA_DIR, logs in $LOG
  proxy SSH  $BIND:$SSH_PORT     node SSH  $BIND:$NODE_PORT
  web        https://$BIND:$WEB_PORT/ (self-signed certificate)
  auth API   $BIND:$AUTH_PORT     diagnostics http://127.0.0.1:$DIAG_PORT/healthz
  (PORT_BASE=$PORT_BASE)

User "$OS_USER" (logins: $OS_USER)
MSG
  if [ -n "$password" ]; then
    echo "  password: $password    (shown once; keep it)"
  else
    echo "  already existed; its password was printed when it was created."
    echo "  For a new one: $PCTL --data-dir $DATA_DIR users rm $OS_USER, then"
    echo "  $PCTL --data-dir $DATA_DIR unlock --user $OS_USER (deleting a user locks the name), then make run again."
  fi
  cat <<MSG

Ways in:
  $PSH login --proxy $BIND:$WEB_PORT --user $OS_USER --insecure
  $PSH ls
  $PSH ssh $OS_USER@$(hostname)

  # stock OpenSSH with a certificate from pctl (the ProxyCommand carries the
  # same key to the proxy hop):
  $PCTL --data-dir $DATA_DIR auth sign --user $OS_USER --ttl 1h --out /tmp/postern-id
  ssh -i /tmp/postern-id -o UserKnownHostsFile=/tmp/postern-id.known_hosts \\
      -o "ProxyCommand=ssh -i /tmp/postern-id -o UserKnownHostsFile=/tmp/postern-id.known_hosts -p $SSH_PORT -W %h:%p $OS_USER@$BIND" \\
      -p $NODE_PORT $OS_USER@$(hostname)

  # the admin CLI:
  $PCTL --data-dir $DATA_DIR nodes ls

  # single sign-on: register https://$BIND:$WEB_PORT/webapi/oidc/callback at your identity
  # provider, then $PCTL --data-dir $DATA_DIR create -f connector.yaml (README.md, "Single sign-on")

Stop with Ctrl-C (or kill $(cat "$PIDFILE" 2>/dev/null || echo PID)).
MSG
}

if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  set_ports "$(cat "$BASEFILE" 2>/dev/null || echo 3000)"
  echo "Postern already runs from $DATA_DIR (pid $(cat "$PIDFILE"))."
  instructions
  exit 0
fi

set_ports "${PORT_BASE:-3000}"
check_ports "$BIND" run "diagnostics=$OFF_DIAG" "proxy peering=$OFF_PEER" "node SSH=$OFF_NODE" \
  "proxy SSH=$OFF_SSH" "reverse tunnel=$OFF_TUNNEL" "auth API=$OFF_AUTH" "web=$OFF_WEB"

# postern logs to the terminal and to $LOG, where a failed start-up is
# read back to explain a busy port.
: >"$LOG"
"$POSTERN" start --data-dir "$DATA_DIR" --cluster-name "$CLUSTER" --roles auth,proxy,node \
  --labels env=dev \
  --node-addr "$BIND:$NODE_PORT" --ssh-addr "$BIND:$SSH_PORT" --web-addr "$BIND:$WEB_PORT" \
  --auth-addr "$BIND:$AUTH_PORT" --tunnel-addr "$BIND:$TUNNEL_PORT" --peer-addr "$BIND:$PEER_PORT" \
  --diag-addr "127.0.0.1:$DIAG_PORT" 2> >(tee -a "$LOG" >&2) &
pid=$!
echo "$pid" >"$PIDFILE"
echo "$PORT_BASE" >"$BASEFILE"
trap 'kill -TERM $pid 2>/dev/null; wait $pid; rm -f "$PIDFILE"' INT TERM

# Wait until the auth API answers the admin identity (bounded: 30 s).
ready=
for _ in $(seq 150); do
  if "$PCTL" --data-dir "$DATA_DIR" users ls >/dev/null 2>&1; then ready=1; break; fi
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" 2>/dev/null || true
    rm -f "$PIDFILE"
    echo "postern exited during start-up (log: $LOG)" >&2
    explain_bind_failure "$LOG" run
    exit 1
  fi
  sleep 0.2
done
[ -n "$ready" ] || { echo "postern did not become ready in 30s" >&2; kill -TERM "$pid"; exit 1; }

password=
if ! "$PCTL" --data-dir "$DATA_DIR" users ls | awk 'NR>1{print $1}' | grep -qx "$OS_USER"; then
  password=$(head -c 18 /dev/urandom | base64 | tr -d '/+=' | head -c 20)
  printf '%s\n' "$password" | "$PCTL" --data-dir "$DATA_DIR" users add "$OS_USER" --logins "$OS_USER" >/dev/null
fi
instructions "$password"
wait "$pid"
