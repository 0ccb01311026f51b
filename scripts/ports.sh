# shellcheck shell=bash
# Port helpers for run.sh and run-ha.sh (sourced, not run).
#
# Both scripts lay their ports out from one PORT_BASE: a port is
# PORT_BASE + slot*100 + offset, with the offsets of a single process's
# default ports (3000 diagnostics, 3021 peer, 3022 node, 3023 proxy SSH,
# 3024 tunnel, 3025 auth, 3080 web). `make run` uses slot 0, so its default
# base 3000 gives exactly the daemon's default ports; `make run-ha` uses
# slots 1-7, so both demos fit side by side on one base.
#
# A busy port is an error that names the port and the knob, never an
# automatic move: the ports end up in psh profiles, ssh commands and
# browser tabs, and an operator who types `make run` twice must get the
# same ones. The message suggests a base that is free right now.

# Offsets within a slot.
OFF_DIAG=0 OFF_PEER=21 OFF_NODE=22 OFF_SSH=23 OFF_TUNNEL=24 OFF_AUTH=25 OFF_WEB=80

# check_base BASE HIGHEST_OFFSET: a number whose ports all fit.
check_base() {
  local base=$1 top=$2
  if ! [[ $base =~ ^[0-9]+$ ]] || ((base < 1024 || base + top > 65535)); then
    echo "PORT_BASE=$base: want a number from 1024 to $((65535 - top)) (ports PORT_BASE to PORT_BASE+$top are used)" >&2
    exit 2
  fi
}

# port_busy HOST PORT: something accepts connections there. HOST 0.0.0.0
# (all addresses) is checked on loopback. A listener on another specific
# address of this machine is not seen here; postern's own "address already
# in use" error catches that one (explain_bind_failure).
port_busy() {
  local host=$1 port=$2
  [ "$host" = 0.0.0.0 ] && host=127.0.0.1
  timeout 2 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null
}

# free_base HOST OFFSETS...: the first base from 4000 up, in steps of 1000,
# whose ports are all free now; empty when none is.
free_base() {
  local host=$1 base off busy
  shift
  for ((base = 4000; base <= 60000; base += 1000)); do
    busy=
    for off in "$@"; do
      if port_busy "$host" $((base + off)); then busy=1; break; fi
    done
    [ -z "$busy" ] && { echo "$base"; return; }
  done
}

# check_ports HOST MAKE_TARGET NAME=OFFSET...: exit with a message naming
# every busy port, what it is for and the PORT_BASE knob.
check_ports() {
  local host=$1 target=$2 arg name off busy=() offs=()
  shift 2
  for arg in "$@"; do
    name=${arg%=*} off=${arg##*=}
    offs+=("$off")
    if port_busy "$host" $((PORT_BASE + off)); then busy+=("$((PORT_BASE + off)) ($name)"); fi
  done
  [ ${#busy[@]} -eq 0 ] && return 0
  {
    echo "Port(s) already in use on $host: ${busy[*]}."
    echo "Stop what holds them, or move every port with PORT_BASE (now $PORT_BASE; ports are PORT_BASE+offset):"
    local suggest
    suggest=$(free_base "$host" "${offs[@]}")
    if [ -n "$suggest" ]; then
      echo "  make $target PORT_BASE=$suggest      (all of its ports are free now)"
    else
      echo "  make $target PORT_BASE=N"
    fi
  } >&2
  exit 1
}

# explain_bind_failure LOG MAKE_TARGET: after a process exited during
# start-up, turn its "cannot listen on ADDR: ... address already in use"
# into the same advice as check_ports (a port that the connect check could
# not see: held on another address, or taken in between).
explain_bind_failure() {
  local log=$1 target=$2 addr
  addr=$(grep -o 'cannot listen on [^ ]*: bind: address already in use' "$log" 2>/dev/null | head -1 | awk '{print $4}')
  addr=${addr%:}
  [ -n "$addr" ] || return 0
  echo "Port ${addr##*:} is already in use ($addr). Stop what holds it, or move every port: make $target PORT_BASE=N (now $PORT_BASE)." >&2
}
