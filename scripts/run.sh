#!/usr/bin/env bash
# make run: start an all-in-one Postern cluster (auth + proxy + node) on the
# embedded SQLite backend in $DATA_DIR, create a first user named after the
# current OS user, and print how to get in. Safe to run again: an existing
# cluster and user are reused, a running one is left alone.
set -euo pipefail

DATA_DIR=${DATA_DIR:-$PWD/.postern-data}
BUILD_DIR=${BUILD_DIR:-build}
CLUSTER=${CLUSTER:-local}
BIND=${POSTERN_BIND:-127.0.0.1}
POSTERN="$BUILD_DIR/postern"
PCTL="$BUILD_DIR/pctl"
PSH="$BUILD_DIR/psh"
OS_USER=$(id -un)
PIDFILE="$DATA_DIR/postern.pid"

mkdir -p "$DATA_DIR"
chmod 700 "$DATA_DIR"

instructions() {
  local password=${1:-}
  cat <<MSG

Postern is running: cluster "$CLUSTER", data in $DATA_DIR
  proxy SSH  $BIND:3023     node SSH  $BIND:3022
  web        https://$BIND:3080/ (self-signed certificate)
  auth API   $BIND:3025     diagnostics http://127.0.0.1:3000/healthz

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
  $PSH login --proxy $BIND:3080 --user $OS_USER --insecure
  $PSH ls
  $PSH ssh $OS_USER@$(hostname)

  # stock OpenSSH with a certificate from pctl (the ProxyCommand carries the
  # same key to the proxy hop):
  $PCTL --data-dir $DATA_DIR auth sign --user $OS_USER --ttl 1h --out /tmp/postern-id
  ssh -i /tmp/postern-id -o UserKnownHostsFile=/tmp/postern-id.known_hosts \\
      -o "ProxyCommand=ssh -i /tmp/postern-id -o UserKnownHostsFile=/tmp/postern-id.known_hosts -p 3023 -W %h:%p $OS_USER@$BIND" \\
      -p 3022 $OS_USER@$(hostname)

  # the admin CLI:
  $PCTL --data-dir $DATA_DIR nodes ls

Stop with Ctrl-C (or kill $(cat "$PIDFILE" 2>/dev/null || echo PID)).
MSG
}

if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  echo "Postern already runs from $DATA_DIR (pid $(cat "$PIDFILE"))."
  instructions
  exit 0
fi

"$POSTERN" start --data-dir "$DATA_DIR" --cluster-name "$CLUSTER" --roles auth,proxy,node \
  --labels env=dev \
  --node-addr "$BIND:3022" --ssh-addr "$BIND:3023" --web-addr "$BIND:3080" \
  --auth-addr "$BIND:3025" --tunnel-addr "$BIND:3024" --peer-addr "$BIND:3021" --diag-addr 127.0.0.1:3000 &
pid=$!
echo "$pid" >"$PIDFILE"
trap 'kill -TERM $pid 2>/dev/null; wait $pid; rm -f "$PIDFILE"' INT TERM

# Wait until the auth API answers the admin identity (bounded: 30 s).
ready=
for _ in $(seq 150); do
  if "$PCTL" --data-dir "$DATA_DIR" users ls >/dev/null 2>&1; then ready=1; break; fi
  kill -0 "$pid" 2>/dev/null || { echo "postern exited during start-up" >&2; exit 1; }
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
