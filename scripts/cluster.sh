#!/usr/bin/env bash
# Local 6-node Redis Cluster (3 primaries, 3 replicas) with the module loaded.
#
# usage: scripts/cluster.sh start|stop|status [base_port] [module_path]
#   base_port   first port (default 7001); nodes use base_port..base_port+5
#               and cluster bus ports base_port+10000..
#   module_path default: <repo>/target/release/libredis_ratelimit.so
#   MODULE_ARGS env: extra module arguments (e.g. MODULE_ARGS=DEBUG_CLOCK)
# Node files live in /tmp/rl-cluster-<base_port>/<port>/ (redis.log, nodes.conf, redis.pid).
set -euo pipefail

cmd=${1:-}
base=${2:-7001}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
module=${3:-$root/target/release/libredis_ratelimit.so}
dir=/tmp/rl-cluster-$base
nodes=6
replicas=1
ports=()
for ((i = 0; i < nodes; i++)); do ports+=($((base + i))); done

usage() { echo "usage: $0 start|stop|status [base_port] [module_path]" >&2; exit 2; }

ping() { redis-cli -h 127.0.0.1 -p "$1" PING 2>/dev/null | grep -q PONG; }

stop_all() {
  local pids=() p pidfile
  for p in "${ports[@]}"; do
    pidfile=$dir/$p/redis.pid
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      pids+=("$(cat "$pidfile")")
      kill -TERM "$(cat "$pidfile")" 2>/dev/null || true
    fi
  done
  local deadline=$((SECONDS + 5)) pid
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$dir"
}

fail() {
  echo "cluster: $*" >&2
  local p
  for p in "${ports[@]}"; do
    if [ -f "$dir/$p/redis.log" ]; then
      echo "--- $dir/$p/redis.log (tail) ---" >&2
      tail -n 15 "$dir/$p/redis.log" >&2
    fi
  done
  stop_all
  exit 1
}

case "$cmd" in
start)
  [ -f "$module" ] || { echo "cluster: module not found at $module (run \`make build\`)" >&2; exit 1; }
  module=$(cd "$(dirname "$module")" && pwd)/$(basename "$module")
  for p in "${ports[@]}"; do
    if ping "$p" || (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null; then
      echo "cluster: port $p is already in use (running cluster? try: $0 stop $base)" >&2
      exit 1
    fi
  done
  rm -rf "$dir"
  t0=$(date +%s.%N)
  for p in "${ports[@]}"; do
    mkdir -p "$dir/$p"
    # shellcheck disable=SC2086
    redis-server --port "$p" --bind 127.0.0.1 --dir "$dir/$p" \
      --daemonize yes --pidfile "$dir/$p/redis.pid" --logfile "$dir/$p/redis.log" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      --save "" --appendonly no --protected-mode no \
      --enable-debug-command yes --enable-module-command yes --repl-diskless-sync-delay 0 \
      --loadmodule "$module" ${MODULE_ARGS:-} >/dev/null \
      || fail "redis-server on port $p failed to start"
  done
  for p in "${ports[@]}"; do
    deadline=$((SECONDS + 10))
    until ping "$p"; do
      [ $SECONDS -lt $deadline ] || fail "node $p did not answer PING within 10 s"
      sleep 0.05
    done
  done
  addrs=()
  for p in "${ports[@]}"; do addrs+=("127.0.0.1:$p"); done
  out=$(redis-cli --cluster create "${addrs[@]}" --cluster-replicas "$replicas" --cluster-yes </dev/null 2>&1) \
    || { echo "$out" >&2; fail "redis-cli --cluster create failed"; }
  grep -q "All 16384 slots covered" <<<"$out" || { echo "$out" >&2; fail "cluster create did not cover all slots"; }
  deadline=$((SECONDS + 20))
  for p in "${ports[@]}"; do
    until redis-cli -p "$p" CLUSTER INFO 2>/dev/null | grep -q "cluster_state:ok"; do
      [ $SECONDS -lt $deadline ] || fail "node $p: cluster_state not ok within 20 s"
      sleep 0.1
    done
  done
  # Replicas linked and caught up.
  for p in "${ports[@]}"; do
    if redis-cli -p "$p" INFO replication | grep -q "role:slave"; then
      until redis-cli -p "$p" INFO replication | grep -q "master_link_status:up"; do
        [ $SECONDS -lt $deadline ] || fail "replica $p: master link not up within 20 s"
        sleep 0.1
      done
    fi
  done
  t1=$(date +%s.%N)
  printf 'cluster: up in %.1fs: %s (dir %s)\n' "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "${addrs[*]}" "$dir"
  echo "cluster: connect with: redis-cli -c -p $base    stop with: $0 stop $base"
  ;;
stop)
  stop_all
  echo "cluster: stopped (ports ${ports[0]}..${ports[-1]}), removed $dir"
  ;;
status)
  for p in "${ports[@]}"; do
    if ping "$p"; then
      echo "$p: $(redis-cli -p "$p" INFO replication | grep -o 'role:[a-z]*') $(redis-cli -p "$p" CLUSTER INFO | grep -o 'cluster_state:[a-z]*')"
    else
      echo "$p: down"
    fi
  done
  ;;
*) usage ;;
esac
