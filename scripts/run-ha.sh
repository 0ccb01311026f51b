#!/usr/bin/env bash
# make run-ha: several auth and proxy processes on one machine.
#
# Starts a three-member etcd (fixtures/etcd-member: etcd's own server
# module, built here, never downloaded), two auth processes on it, two
# proxies and two nodes that know both auth servers (--auth-server a,b),
# and, when network namespaces work (root, iproute2), a second node inside
# a namespace that can reach the proxies' web and tunnel ports and nothing
# else: it joins through a proxy and lives on its reverse tunnel. Then it
# creates a user named after the current OS user and prints how to reach
# everything. Ctrl-C stops it all (and removes the namespace).
#
# HA_DIR (default ./.postern-ha) holds every data dir; it is wiped on
# start: this is a demo, not a deployment. HA_NETNS=0 skips the namespace.
#
# PORT_BASE (default 3000) places every port at PORT_BASE + slot*100 +
# offset (scripts/ports.sh): proxy1 slot 1 (3123 SSH, 3180 web, 3124
# tunnel, 3121 peer, 3100 diagnostics), proxy2 slot 2, auth1 and auth2
# slots 3 and 4 (3325, 3425), node1 and node2 slots 5 and 6, etcd slot 7
# (clients 3790-3792, peers 3780-3782). Slot 0 is `make run`'s, so both
# run side by side. A busy port stops it before anything is built or
# wiped, with a message naming the port: `make run-ha PORT_BASE=5000`.
set -euo pipefail

HA_DIR=${HA_DIR:-$PWD/.postern-ha}
BUILD_DIR=${BUILD_DIR:-build}
GO=${GO:-go}
CLUSTER=${CLUSTER:-ha}
OS_USER=$(id -un)
POSTERN="$BUILD_DIR/postern"
PCTL="$BUILD_DIR/pctl"
PSH="$BUILD_DIR/psh"
ETCD="$BUILD_DIR/etcd-member"
NS=postern-ha
VETH_HOST=pha0 VETH_NS=pha1 HOST_IP=10.77.0.1 NS_IP=10.77.0.2

# shellcheck source=scripts/ports.sh
. "$(dirname "$0")/ports.sh"
PORT_BASE=${PORT_BASE:-3000}
check_base "$PORT_BASE" 792
# port SLOT OFFSET
port() { echo $((PORT_BASE + $1 * 100 + $2)); }
for i in 1 2; do
  eval "P${i}_SSH=$(port $i $OFF_SSH) P${i}_WEB=$(port $i $OFF_WEB) P${i}_TUN=$(port $i $OFF_TUNNEL)"
  eval "P${i}_PEER=$(port $i $OFF_PEER) P${i}_DIAG=$(port $i $OFF_DIAG)"
  eval "A${i}_AUTH=$(port $((i + 2)) $OFF_AUTH) A${i}_DIAG=$(port $((i + 2)) $OFF_DIAG)"
  eval "N${i}_NODE=$(port $((i + 4)) $OFF_NODE) N${i}_DIAG=$(port $((i + 4)) $OFF_DIAG)"
done
for i in 0 1 2; do eval "E${i}_CLIENT=$(port 7 $((90 + i))) E${i}_PEER=$(port 7 $((80 + i)))"; done
# Every port, as NAME=OFFSET from PORT_BASE, checked before anything is
# built, wiped or started.
checks=()
for i in 1 2; do
  checks+=("proxy$i SSH=$((i * 100 + OFF_SSH))" "proxy$i web=$((i * 100 + OFF_WEB))"
    "proxy$i tunnel=$((i * 100 + OFF_TUNNEL))" "proxy$i peering=$((i * 100 + OFF_PEER))"
    "proxy$i diagnostics=$((i * 100 + OFF_DIAG))"
    "auth$i API=$(((i + 2) * 100 + OFF_AUTH))" "auth$i diagnostics=$(((i + 2) * 100 + OFF_DIAG))"
    "node$i diagnostics=$(((i + 4) * 100 + OFF_DIAG))")
done
checks+=("node1 SSH=$((5 * 100 + OFF_NODE))")
for i in 0 1 2; do checks+=("etcd m$i client=$((790 + i))" "etcd m$i peer=$((780 + i))"); done
check_ports 127.0.0.1 run-ha "${checks[@]}"

"$GO" build -o "$BUILD_DIR/" ./fixtures/etcd-member

rm -rf "$HA_DIR"
mkdir -p "$HA_DIR"
chmod 700 "$HA_DIR"
LOGS="$HA_DIR/logs"
mkdir -p "$LOGS"

PIDS=()
netns_up=
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "Stopping..."
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill -TERM "${PIDS[i]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$netns_up" ]; then
    ip netns del "$NS" 2>/dev/null || true
    ip link del "$VETH_HOST" 2>/dev/null || true
  fi
}
trap cleanup INT TERM EXIT

# start NAME CMD... runs CMD in the background, logging to logs/NAME.log.
start() {
  local name=$1
  shift
  "$@" >"$LOGS/$name.log" 2>&1 &
  PIDS+=($!)
  eval "PID_${name//-/_}=$!"
}

# wait_for NAME CMD... retries CMD for 30 s while process NAME runs (its
# log is logs/NAME.log).
wait_for() {
  local name=$1 pid
  shift
  pid=$(eval "echo \$PID_${name//-/_}")
  for _ in $(seq 150); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$name exited during start-up; its log, $LOGS/$name.log, ends:" >&2
      tail -5 "$LOGS/$name.log" >&2
      explain_bind_failure "$LOGS/$name.log" run-ha
      exit 1
    fi
    sleep 0.2
  done
  echo "$name did not come up in 30s; logs in $LOGS" >&2
  exit 1
}

# --- etcd: three members -------------------------------------------------
ETCD_ENDPOINTS=http://127.0.0.1:$E0_CLIENT,http://127.0.0.1:$E1_CLIENT,http://127.0.0.1:$E2_CLIENT
INITIAL=m0=http://127.0.0.1:$E0_PEER,m1=http://127.0.0.1:$E1_PEER,m2=http://127.0.0.1:$E2_PEER
for i in 0 1 2; do
  start "etcd-m$i" "$ETCD" --name "m$i" --data-dir "$HA_DIR/etcd-m$i" \
    --client-url "http://127.0.0.1:$(port 7 $((90 + i)))" --peer-url "http://127.0.0.1:$(port 7 $((80 + i)))" --initial-cluster "$INITIAL"
done
for i in 0 1 2; do wait_for "etcd-m$i" grep -q ready "$LOGS/etcd-m$i.log"; done

# --- two auth processes, started together on the empty etcd --------------
for i in 1 2; do
  start "auth$i" "$POSTERN" start --data-dir "$HA_DIR/auth$i" --cluster-name "$CLUSTER" --roles auth \
    --backend etcd --etcd-endpoints "$ETCD_ENDPOINTS" \
    --auth-addr "127.0.0.1:$(port $((i + 2)) $OFF_AUTH)" --diag-addr "127.0.0.1:$(port $((i + 2)) $OFF_DIAG)"
done
for i in 1 2; do wait_for "auth$i" "$PCTL" --data-dir "$HA_DIR/auth$i" users ls; done
AUTH_SERVERS=127.0.0.1:$A1_AUTH,127.0.0.1:$A2_AUTH
ADMIN="$PCTL --data-dir $HA_DIR/auth1 --auth-server $AUTH_SERVERS"

token() { $ADMIN tokens add --type "$1" | grep -o -- '--token [^ ]* --ca-pin [^ ]*' | head -1; }

# --- the network namespace of the tunnel-only node -----------------------
NS_NODE=
PROXY_BIND=127.0.0.1
if [ "${HA_NETNS:-1}" = 1 ] && [ "$(id -u)" = 0 ] && command -v ip >/dev/null &&
  ip netns add "$NS" 2>/dev/null; then
  netns_up=1
  ip link add "$VETH_HOST" type veth peer name "$VETH_NS"
  ip link set "$VETH_NS" netns "$NS"
  ip addr add "$HOST_IP/24" dev "$VETH_HOST"
  ip link set "$VETH_HOST" up
  ip netns exec "$NS" ip addr add "$NS_IP/24" dev "$VETH_NS"
  ip netns exec "$NS" ip link set "$VETH_NS" up
  ip netns exec "$NS" ip link set lo up
  # A default route through the host, so the tunnel address the proxy
  # advertises (its first non-loopback IP) is reachable; loopback-bound
  # services (auth, etcd, proxy SSH, node1) still are not.
  ip netns exec "$NS" ip route add default via "$HOST_IP"
  NS_NODE=1
  # The proxies' web and tunnel ports must answer on the namespace's side
  # of the veth too; auth, etcd and the first node stay on loopback, out
  # of the namespace's reach. The proxy SSH port binds all addresses as
  # well: the proxy's host certificate names the IPs of its SSH listener,
  # and the tunnel agent checks the tunnel address against it.
  PROXY_BIND=0.0.0.0
else
  echo "(no network namespace: root and iproute2 needed, or HA_NETNS=0; the second node runs on loopback)"
fi

# --- two proxies ----------------------------------------------------------
for i in 1 2; do
  # shellcheck disable=SC2046
  start "proxy$i" "$POSTERN" start --data-dir "$HA_DIR/proxy$i" --roles proxy --nodename "proxy$i" \
    --auth-server "$AUTH_SERVERS" $(token proxy) \
    --ssh-addr "$PROXY_BIND:$(port $i $OFF_SSH)" --web-addr "$PROXY_BIND:$(port $i $OFF_WEB)" \
    --tunnel-addr "$PROXY_BIND:$(port $i $OFF_TUNNEL)" --peer-addr "127.0.0.1:$(port $i $OFF_PEER)" \
    --diag-addr "127.0.0.1:$(port $i $OFF_DIAG)"
done
for i in 1 2; do wait_for "proxy$i" curl -sf "http://127.0.0.1:$(port $i $OFF_DIAG)/readyz"; done

# --- two nodes ------------------------------------------------------------
# shellcheck disable=SC2046
start node1 "$POSTERN" start --data-dir "$HA_DIR/node1" --roles node --nodename node1 --labels env=ha \
  --auth-server "$AUTH_SERVERS" $(token node) --node-addr "127.0.0.1:$N1_NODE" --diag-addr "127.0.0.1:$N1_DIAG"
if [ -n "$NS_NODE" ]; then
  # Behind the namespace: no route to auth, only to the proxy's web and
  # tunnel ports. It joins through proxy1 and keeps a reverse tunnel.
  # shellcheck disable=SC2046
  start node2 ip netns exec "$NS" "$POSTERN" start --data-dir "$HA_DIR/node2" --roles node --nodename node2 \
    --labels env=ha,where=netns --proxy-server "$HOST_IP:$P1_WEB" $(token node) --diag-addr "127.0.0.1:$N2_DIAG"
else
  # shellcheck disable=SC2046
  start node2 "$POSTERN" start --data-dir "$HA_DIR/node2" --roles node --nodename node2 --labels env=ha \
    --proxy-server "127.0.0.1:$P1_WEB" $(token node) --diag-addr "127.0.0.1:$N2_DIAG"
fi
wait_for node2 sh -c "$ADMIN nodes ls | grep -q node1 && $ADMIN nodes ls | grep -q node2"

password=$(head -c 18 /dev/urandom | base64 | tr -d '/+=' | head -c 20)
printf '%s\n' "$password" | $ADMIN users add "$OS_USER" --logins "$OS_USER" >/dev/null

cat <<MSG

Postern HA demo is running: cluster "$CLUSTER", everything under $HA_DIR (logs in $LOGS)

  etcd      $ETCD_ENDPOINTS   (pids $PID_etcd_m0 $PID_etcd_m1 $PID_etcd_m2)
  auth      127.0.0.1:$A1_AUTH (pid $PID_auth1), 127.0.0.1:$A2_AUTH (pid $PID_auth2)   one etcd, one set of CAs
  proxy1    ssh 127.0.0.1:$P1_SSH  web https://127.0.0.1:$P1_WEB/  tunnel :$P1_TUN  peer :$P1_PEER  readyz http://127.0.0.1:$P1_DIAG/readyz
  proxy2    ssh 127.0.0.1:$P2_SSH  web https://127.0.0.1:$P2_WEB/  tunnel :$P2_TUN  peer :$P2_PEER  readyz http://127.0.0.1:$P2_DIAG/readyz
  node1     127.0.0.1:$N1_NODE, heartbeats through --auth-server $AUTH_SERVERS
  node2     $( [ -n "$NS_NODE" ] && echo "in network namespace $NS ($NS_IP): reverse tunnel to proxy1 only" || echo "reverse tunnel to proxy1" )
  (PORT_BASE=$PORT_BASE)

User "$OS_USER" (logins: $OS_USER), password: $password   (shown once)

Try:
  $PSH login --proxy 127.0.0.1:$P1_WEB --user $OS_USER --insecure
  $PSH ssh $OS_USER@node1
  $PSH ssh $OS_USER@node2          # its tunnel is on proxy1; logged in through proxy2
                                   # (--proxy 127.0.0.1:$P2_WEB) it goes over proxy peering
  $ADMIN nodes ls
  # web sessions live in etcd: behind one name (a load balancer over both web
  # ports) any proxy serves any browser, and a logout on one ends the
  # session's terminals on both.

Break things:
  kill $PID_auth1                    # pctl, nodes and proxies carry on through auth2
  kill $PID_etcd_m0                  # one etcd member down: everything keeps working
  kill $PID_etcd_m1                  # no quorum: readyz says 503 "etcd ... no answer", logins 503,
                                     # open sessions stay; restart the members to recover:
  $ETCD --name m0 --data-dir $HA_DIR/etcd-m0 --client-url http://127.0.0.1:$E0_CLIENT --peer-url http://127.0.0.1:$E0_PEER --initial-cluster $INITIAL &

Stop with Ctrl-C.
MSG
wait
