#!/usr/bin/env bash
# Server-side benchmarks of redis-ratelimit: server CPU per operation of every limiter command
# against INCR (the floor), `SET k v EX` (the cheapest write that sets a TTL), redis-cell's
# CL.THROTTLE (a peer built from source) and the seeds' Lua scripts, with keys in place and with
# a replica attached (whose state is checked identical with DEBUG DIGEST); the sliding log at its
# limit for limits 10 .. 100,000; memory per key. Prints Markdown tables and writes them to
# target/bench-report.md.
#
#   bash scripts/bench.sh            (or: make bench; ~10 min on an idle 2-CPU machine)
#
# Servers (all `--save "" --appendonly no`, stopped at the end): the module's on BENCH_PORT, its
# replica on BENCH_PORT+1, redis-cell's on BENCH_PORT+2, its replica on BENCH_PORT+3, and (for
# the memory rows on other servers) one server at a time on BENCH_PORT+4. On a machine with two
# or more CPUs the measured server is pinned to one CPU and redis-benchmark (and the replicas) to
# another (taskset).
#
# Environment (defaults in brackets):
#   BENCH_PORT [6390]               first of the five ports (must be free)
#   RL_MODULE  [target/release/libredis_ratelimit.so]
#   BENCH_REDIS_CELL_SRC            redis-cell source tarball [../shared/peers/redis-cell-0.5.0.tar.gz,
#                                   relative to the repository root (or to the main worktree's)];
#                                   built once into target/peers/ (needs crates.io). Absent or
#                                   unbuildable: the redis-cell rows say so and the rest runs.
#   BENCH_REPORT [target/bench-report.md]
#   BENCH_ROUNDS [7]                rounds; each measures every row of a configuration once
#   BENCH_N_PIPELINED [1000000]     requests per pipelined run (-P 16), INCR, SET and limiter rows
#   BENCH_N_REPLICA [600000]        the same with a replica attached (each op costs the server
#                                   ~1.5x more; the replica shares the client's CPU)
#   BENCH_N_LUA [200000]            requests per pipelined run of the Lua rows (8-16 µs/op each)
#   BENCH_N_UNPIPELINED [50000]     requests of the one unpipelined run per row (0: skip)
#   BENCH_N_HAMMER [200000]         requests per sliding-log-at-its-limit row
#   BENCH_CLIENTS [50]              redis-benchmark -c
#   BENCH_KEYSPACE [100000]         redis-benchmark -r (random keys via __rand_int__)
#   BENCH_MEM_KEYS [200000]         keys for the O(1) memory rows
#   BENCH_LOG_KEYS ["20000 2000 200"]  keys for the 10 / 100 / 1,000-entry log rows
#   BENCH_SERVERS_DIR [target/servers, else the main worktree's]  other servers for the memory
#                                   rows, as scripts/compat.sh builds them (<dir>/<name>/bin/
#                                   {redis,valkey}-server); absent: skipped with a note; "none": skip
#   BENCH_SERVER_CPU [0] BENCH_CLIENT_CPU [1]
#
# Method (also printed in the report):
# - Rounds: the CPU rows are measured in BENCH_ROUNDS rounds; a round runs every row of the
#   configuration once (INCR, SET EX, every limiter, CL.THROTTLE, the Lua rows and redis-cell's
#   server's rows), starting one row later than the round before, so a slow period of the machine
#   touches every row alike instead of the rows measured during it. Each row reports the median
#   server CPU per op over the rounds and the least and the most; ratios come from medians (and
#   the targets table shows the range of the same ratio taken within each round).
# - Every run: FLUSHALL, one unmeasured call of the same command on every key of the keyspace
#   (so keys exist and the dict is grown, as in production where clients' keys live; with a
#   replica, its offset is then waited for), CONFIG RESETSTAT, one pipelined run. Server CPU per
#   op = CPU time of all the server's threads during the run (utime + stime, read from Linux
#   schedstat in ns rather than /proc/<pid>/stat's 10-ms ticks) ÷ requests: what one operation
#   costs the server, whatever the client does. usec_per_call comes from INFO commandstats of the
#   run (Lua rows: cmdstat_evalsha, the whole script).
# - Parameters keep every key alive for the whole run: 1000 per day (a bucket's key lives
#   86.4 s per admitted request, a window's key until its window ends; the Lua scripts get the
#   same rate). A limiter whose key expires between two hits measures key churn, not a decision.
# - With a replica: the same rows (Lua excepted) in their own rounds with a replica attached
#   (REPLICAOF, full sync done); after every run the replica is waited for (its offset reaches
#   the primary's) and DEBUG DIGEST compared; PEXPIRETIME of a sample of keys is compared too (DEBUG
#   DIGEST only records that a key has an expiry).
# - redis-cell registers CL.THROTTLE as this module does, so it runs on its own server, where
#   INCR and SET EX are measured again, in the same rounds as the module's rows: its ratios are
#   against its own server's rows.
# - Memory per key: used_memory before and after loading the keys (no replica attached); the
#   SET, RL.GCRA, RL.TOKENBUCKET and RL.SLIDING rows again on every other server found.
# - The module is loaded with DEBUG_CLOCK. That only enables RL.DEBUG (used to place sliding-log
#   entries at distinct microseconds for the memory rows and to step the clock for the "admit
#   one, evict one" rows); the clock follows the real clock otherwise and the hot path reads the
#   same atomic either way (src/clock.rs: now_us).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

BASE_PORT=${BENCH_PORT:-6390}
MODULE=${RL_MODULE:-target/release/libredis_ratelimit.so}
REPORT=${BENCH_REPORT:-target/bench-report.md}
ROUNDS=${BENCH_ROUNDS:-7}
N_PIPE=${BENCH_N_PIPELINED:-1000000}
N_REPLICA=${BENCH_N_REPLICA:-600000}
N_LUA=${BENCH_N_LUA:-200000}
N_HAMMER=${BENCH_N_HAMMER:-200000}
N_UNPIPE=${BENCH_N_UNPIPELINED:-50000}
CLIENTS=${BENCH_CLIENTS:-50}
KEYSPACE=${BENCH_KEYSPACE:-100000}
MEM_KEYS=${BENCH_MEM_KEYS:-200000}
read -r -a LOG_KEYS <<<"${BENCH_LOG_KEYS:-20000 2000 200}"
LOG_SIZES=(10 100 1000)
HAMMER_LIMITS=(10 1000 100000)
SERVER_CPU=${BENCH_SERVER_CPU:-0}
CLIENT_CPU=${BENCH_CLIENT_CPU:-1}
PIPELINE=16
EXPIRY_SAMPLE=200
COMMAND_LINE="$0${*:+ $*}"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
GIT_REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
GIT_DIRTY=$(git status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null | wc -l)

for tool in redis-server redis-cli redis-benchmark awk; do
  command -v "$tool" >/dev/null || { echo "bench: $tool not found" >&2; exit 1; }
done
[ -f "$MODULE" ] || { echo "bench: module not found at $MODULE: run cargo build --release (make build)" >&2; exit 1; }

SERVER_PIN=() CLIENT_PIN=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  SERVER_PIN=(taskset -c "$SERVER_CPU")
  CLIENT_PIN=(taskset -c "$CLIENT_CPU")
fi

log() { echo "bench: [${SECONDS}s] $*" >&2; }
# The server commands go to: set by use_server.
PORT=$BASE_PORT SERVER_PID=
cli() { redis-cli -p "$PORT" "$@"; }

# ---------------------------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------------------------
for p in $(seq "$BASE_PORT" $((BASE_PORT + 4))); do
  if redis-cli -p "$p" ping >/dev/null 2>&1; then
    echo "bench: something already answers on port $p; set BENCH_PORT to a free range of 5 ports" >&2
    exit 1
  fi
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rl-bench.XXXXXX")
# A private copy of the module: a rebuild during the run cannot change the loaded library.
cp "$MODULE" "$WORK/module.so"
declare -A PIDS
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_server <name> <port> <cpu> <module args...>: a redis-server (SERVER_BIN, if set)
# pinned to <cpu>.
start_server() {
  local name=$1 port=$2 cpu=$3; shift 3
  local pin=()
  [ ${#SERVER_PIN[@]} -gt 0 ] && pin=(taskset -c "$cpu")
  mkdir -p "$WORK/$name"
  "${pin[@]}" "${SERVER_BIN:-redis-server}" --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --enable-debug-command local --dir "$WORK/$name" --logfile "$WORK/$name/redis.log" --daemonize no \
    --loadmodule "$@" &
  PIDS[$name]=$!
  for _ in $(seq 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    kill -0 "${PIDS[$name]}" 2>/dev/null || { cat "$WORK/$name/redis.log" >&2; exit 1; }
    sleep 0.1
  done
  redis-cli -p "$port" ping >/dev/null || { echo "bench: $name did not start" >&2; cat "$WORK/$name/redis.log" >&2; exit 1; }
  log "$name: ${SERVER_BIN:-redis-server} pid ${PIDS[$name]} on port $port${pin:+ (CPU $cpu)}"
}
stop_server() { # name
  kill "${PIDS[$1]}" 2>/dev/null || true
  wait "${PIDS[$1]}" 2>/dev/null || true
  unset "PIDS[$1]"
}
use_server() { PORT=$1 SERVER_PID=$2; }

start_server rl "$BASE_PORT" "$SERVER_CPU" "$WORK/module.so" DEBUG_CLOCK
use_server "$BASE_PORT" "${PIDS[rl]}"

# redis-cell, the peer: built from source once into target/peers/ (cached).
CELL_SO= CELL_STATUS=
find_cell_source() {
  local c main_root
  if [ -n "${BENCH_REDIS_CELL_SRC:-}" ]; then echo "$BENCH_REDIS_CELL_SRC"; return; fi
  main_root=$(cd "$(git rev-parse --git-common-dir 2>/dev/null || echo .git)/.." 2>/dev/null && pwd || echo "$ROOT")
  for c in "$ROOT/../shared/peers/redis-cell-0.5.0.tar.gz" "$main_root/../shared/peers/redis-cell-0.5.0.tar.gz"; do
    [ -f "$c" ] && { echo "$c"; return; }
  done
  echo "$ROOT/../shared/peers/redis-cell-0.5.0.tar.gz"
}
CELL_SRC=$(find_cell_source)
if [ ! -f "$CELL_SRC" ]; then
  CELL_STATUS="not measured: no redis-cell source at $CELL_SRC (set BENCH_REDIS_CELL_SRC)"
else
  CELL_DIR=$ROOT/target/peers/redis-cell
  CELL_SO=$CELL_DIR/target/release/libredis_cell.so
  if [ ! -f "$CELL_SO" ] || [ "$CELL_SRC" -nt "$CELL_SO" ]; then
    log "building redis-cell from $CELL_SRC"
    rm -rf "$CELL_DIR" && mkdir -p "$CELL_DIR"
    # An empty [workspace] table: under target/ it would otherwise count as a stray member of
    # this repository's workspace, and cargo refuses to build it.
    if ! { tar xzf "$CELL_SRC" -C "$CELL_DIR" --strip-components=1 &&
           { grep -q '^\[workspace\]' "$CELL_DIR/Cargo.toml" || printf '\n[workspace]\n' >>"$CELL_DIR/Cargo.toml"; } &&
           (cd "$CELL_DIR" && cargo build --release --lib) >"$WORK/cell-build.log" 2>&1; }; then
      tail -5 "$WORK/cell-build.log" >&2 || true
      CELL_SO= CELL_STATUS="not measured: building redis-cell from $CELL_SRC failed (see cargo build --release in target/peers/redis-cell)"
    fi
  fi
  if [ -n "$CELL_SO" ]; then
    CELL_VERSION=$(awk -F'"' '/^version/ { print $2; exit }' "$CELL_DIR/Cargo.toml")
    cp "$CELL_SO" "$WORK/cell.so"
    start_server cell $((BASE_PORT + 2)) "$SERVER_CPU" "$WORK/cell.so"
  fi
fi
[ -z "$CELL_STATUS" ] || log "redis-cell $CELL_STATUS"

# ---------------------------------------------------------------------------------------------
# The seeds' Lua scripts (scripts/lua/), adapted minimally: the time comes from the server's
# TIME inside the script instead of from the caller; each file says exactly what changed.
#   token_bucket.lua     seed 000's token_bucket.lua
#   sliding_counter.lua  seed 003's sliding window counter (the one seed 001 sketches)
#   zset_log.lua         seed 002's sorted-set sliding log
#   log_step.lua         a helper for the sliding-log rows (steps the debug clock, then calls)
# ---------------------------------------------------------------------------------------------
LUA_DIR=scripts/lua
SHA_TB=$(cli SCRIPT LOAD "$(cat "$LUA_DIR/token_bucket.lua")")
SHA_SW=$(cli SCRIPT LOAD "$(cat "$LUA_DIR/sliding_counter.lua")")
SHA_ZL=$(cli SCRIPT LOAD "$(cat "$LUA_DIR/zset_log.lua")")
SHA_STEP=$(cli SCRIPT LOAD "$(cat "$LUA_DIR/log_step.lua")")
for sha in "$SHA_TB" "$SHA_SW" "$SHA_ZL" "$SHA_STEP"; do
  [[ "$sha" =~ ^[0-9a-f]{40}$ ]] || { echo "bench: SCRIPT LOAD failed: $sha" >&2; exit 1; }
done

# Sanity: every command answers as expected before anything is measured.
check_reply() {
  local got
  got=$(cli "$@" 2>&1 | head -1)
  case "$got" in
    ""|ERR*|WRONGTYPE*|NOSCRIPT*|*"Error"*) echo "bench: '$*' failed: $got" >&2; exit 1 ;;
  esac
}
check_reply RL.GCRA sanity:1 1000 1d
check_reply RL.SLIDINGLOG sanity:2 1000 1d
check_reply CL.THROTTLE sanity:3 999 1000 86400 1
check_reply EVALSHA "$SHA_TB" 1 sanity:4 1000 0.011574074074074073 - 1
check_reply EVALSHA "$SHA_SW" 1 sanity:5 1000 86400000
check_reply EVALSHA "$SHA_ZL" 1 sanity:6 - 86400000 1000
cli FLUSHALL >/dev/null

# ---------------------------------------------------------------------------------------------
# Measurement helpers
# ---------------------------------------------------------------------------------------------
info_field() { # section field
  cli INFO "$1" | tr -d '\r' | awk -F: -v f="$2" '$1 == f { print $2 }'
}
# server_cpu_ns: CPU time (utime + stime) of all the server's threads, in ns (schedstat); where
# schedstat is unavailable, /proc/<pid>/stat's ticks.
server_cpu_ns() {
  local t s=0 v
  for t in /proc/"$SERVER_PID"/task/*; do
    if [ -r "$t/schedstat" ]; then
      read -r v _ <"$t/schedstat" && s=$((s + v))
    else
      s=$(awk -v hz="$(getconf CLK_TCK)" '{ printf "%.0f", ($14 + $15) * 1e9 / hz }' "/proc/$SERVER_PID/stat")
      break
    fi
  done
  echo "$s"
}
cmdstat() { # cmdstat name -> "calls usec_per_call"
  cli INFO commandstats | tr -d '\r' | awk -v n="cmdstat_$1:" '
    index($0, n) == 1 {
      sub(n, ""); split($0, kv, ",");
      for (i in kv) { split(kv[i], p, "="); v[p[1]] = p[2] }
      print v["calls"], v["usec_per_call"]; found = 1 }
    END { if (!found) print 0, 0 }'
}
rl_counters() { # algorithm -> "checks admitted_units limited" (module counters, from load)
  local s
  s=$(cli INFO ratelimit | tr -d '\r')
  awk -F: -v a="$1" '
    $1 ~ "_" a "_checks$" { c = $2 } $1 ~ "_" a "_admitted_units$" { u = $2 } $1 ~ "_" a "_limited$" { l = $2 }
    END { print c + 0, u + 0, l + 0 }' <<<"$s"
}
now_s() { date +%s.%N; }
calc() { awk "BEGIN { printf \"$1\", $2 }"; }
# Floating-point division that prints "n/a" for a zero or missing denominator.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || a == "n/a" || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'; }

# run_benchmark <requests> <pipeline> <command...>: one redis-benchmark run; sets R_RPS and
# R_CPU (server CPU µs per request).
run_benchmark() {
  local n=$1 p=$2; shift 2
  local c0 c1 out
  c0=$(server_cpu_ns)
  out=$("${CLIENT_PIN[@]}" redis-benchmark -p "$PORT" -c "$CLIENTS" -n "$n" -P "$p" -r "$KEYSPACE" --csv "$@" 2>/dev/null)
  c1=$(server_cpu_ns)
  R_RPS=$(awk -F'","' 'NR == 2 { print $2 }' <<<"$out")
  [ -n "$R_RPS" ] || { echo "bench: redis-benchmark failed for: $*" >&2; echo "$out" >&2; exit 1; }
  R_CPU=$(calc "%.3f" "($c1 - $c0) / 1000 / $n")
}

# measure <requests> <pipeline> <runs> <cmdstat name> <algorithm|-> <command...>: <runs> runs,
# each after CONFIG RESETSTAT; keeps the run with the least server CPU per op (other processes
# on the machine only ever add to it). Sets M_CPU M_RPS M_USEC and, for a module algorithm,
# M_CHECKS M_ADMITTED M_LIMITED (its INFO ratelimit counters over the kept run).
measure() {
  local n=$1 p=$2 runs=$3 stat=$4 algo=$5; shift 5
  local run c0=0 u0=0 l0=0 c1=0 u1=0 l1=0 calls usec
  M_CPU= M_CHECKS=0 M_ADMITTED=0 M_LIMITED=0
  for run in $(seq "$runs"); do
    [ "$algo" = - ] || read -r c0 u0 l0 < <(rl_counters "$algo")
    cli CONFIG RESETSTAT >/dev/null
    run_benchmark "$n" "$p" "$@"
    read -r calls usec < <(cmdstat "$stat")
    if [ "$calls" -lt "$n" ]; then
      echo "bench: '$*': commandstats saw $calls calls of $stat, expected $n" >&2; exit 1
    fi
    if [ -z "$M_CPU" ] || awk -v a="$R_CPU" -v b="$M_CPU" 'BEGIN { exit !(a < b) }'; then
      M_RPS=$R_RPS M_USEC=$usec M_CPU=$R_CPU
      if [ "$algo" != - ]; then
        read -r c1 u1 l1 < <(rl_counters "$algo")
        M_CHECKS=$((c1 - c0)) M_ADMITTED=$((u1 - u0)) M_LIMITED=$((l1 - l0))
      fi
    fi
  done
  return 0
}

# gen_resp <keys> <rounds> <command template>: RESP for <rounds> × <keys> commands; @ in the
# template is replaced by a 12-digit key number (the names redis-benchmark's __rand_int__
# makes); with rounds > 1, `RL.DEBUG CLOCK ADVANCE 1` separates the rounds (distinct µs for
# every sliding-log entry).
gen_resp() {
  awk -v keys="$1" -v rounds="$2" -v tpl="$3" '
    function emit(s,    n, a, i, r) {
      n = split(s, a, " "); r = "*" n "\r\n"
      for (i = 1; i <= n; i++) r = r "$" length(a[i]) "\r\n" a[i] "\r\n"
      printf "%s", r
    }
    BEGIN {
      subst = split(tpl, parts, "@") > 1
      for (j = 0; j < rounds; j++) {
        for (i = 0; i < keys; i++) emit(subst ? parts[1] sprintf("%012d", i) parts[2] : tpl)
        if (rounds > 1) emit("RL.DEBUG CLOCK ADVANCE 1")
      }
    }'
}
# pipe_in <what> <keys> <rounds> <template>: sends gen_resp's commands through redis-cli --pipe;
# fails loudly if any reply is an error. pipe_file <what> <file>: the same for a file of RESP.
pipe_in() {
  local what=$1; shift
  pipe_check "$what" "$(gen_resp "$@" | cli --pipe 2>&1)"
}
pipe_file() {
  pipe_check "$1" "$(cli --pipe <"$2" 2>&1)"
}
pipe_check() {
  case "$(tail -1 <<<"$2")" in
    *"errors: 0,"*) ;;
    *) echo "bench: $1 failed:" >&2; tail -5 <<<"$2" >&2; exit 1 ;;
  esac
}

# Replicas: attach_replica <name> <port> <module args...>; check_replica <replica port>: waits
# until the replica has processed everything, then compares DEBUG DIGEST and the absolute
# expiry (PEXPIRETIME) of EXPIRY_SAMPLE keys of the keyspace; prints "identical" or what differs.
attach_replica() {
  local name=$1 port=$2; shift 2
  start_server "$name" "$port" "$CLIENT_CPU" "$@"
  redis-cli -p "$port" REPLICAOF 127.0.0.1 "$PORT" >/dev/null
  for _ in $(seq 300); do
    [ "$(redis-cli -p "$port" INFO replication | tr -d '\r' | awk -F: '$1 == "master_link_status" { print $2 }')" = up ] && break
    sleep 0.1
  done
  [ "$(cli INFO replication | tr -d '\r' | awk -F: '$1 == "connected_slaves" { print $2 }')" = 1 ] ||
    { echo "bench: replica $name did not attach" >&2; exit 1; }
}
# wait_replica <replica port>: until the replica has processed everything; prints its offset
# and the primary's when it falls short after 30 s.
wait_replica() {
  local rport=$1 want got
  want=$(info_field replication master_repl_offset)
  for _ in $(seq 600); do
    got=$(redis-cli -p "$rport" INFO replication | tr -d '\r' | awk -F: '$1 == "slave_repl_offset" { print $2 }')
    # (at least: the primary's own PINGs to its replicas move the offset on)
    [ -n "$got" ] && [ "$got" -ge "$want" ] && return 0
    sleep 0.05
  done
  echo "$got of $want"
}
check_replica() {
  local rport=$1 behind sample
  behind=$(wait_replica "$rport")
  [ -z "$behind" ] || { echo "replica behind (offset $behind)"; return; }
  if [ "$(cli DEBUG DIGEST)" != "$(redis-cli -p "$rport" DEBUG DIGEST)" ]; then
    echo "**DEBUG DIGEST differs**"; return
  fi
  sample=$(awk -v n="$EXPIRY_SAMPLE" -v keys="$KEYSPACE" 'BEGIN { srand(7); for (i = 0; i < n; i++) printf "PEXPIRETIME key:%012d\n", int(rand() * keys) }')
  if [ "$(cli <<<"$sample")" != "$(redis-cli -p "$rport" <<<"$sample")" ]; then
    echo "**expiry differs**"; return
  fi
  echo "identical"
}

REPORT_BODY="$WORK/report.md"
: >"$REPORT_BODY"
out() { printf '%s\n' "$*" | tee -a "$REPORT_BODY"; }

# ---------------------------------------------------------------------------------------------
# 1. Server CPU per operation, keys in place; then with a replica attached
# ---------------------------------------------------------------------------------------------
# label | cmdstat name | module algorithm (for its counters; - for none) | with a replica? | command
SET_LABEL="SET k v EX 86400"
CASES=(
  "INCR|incr|-|yes|INCR key:__rand_int__"
  "$SET_LABEL|set|-|yes|SET key:__rand_int__ 1 EX 86400"
  "RL.GCRA|rl.gcra|gcra|yes|RL.GCRA key:__rand_int__ 1000 1d"
  "RL.TOKENBUCKET|rl.tokenbucket|tokenbucket|yes|RL.TOKENBUCKET key:__rand_int__ 1000 1d"
  "RL.LEAKY|rl.leaky|leaky|yes|RL.LEAKY key:__rand_int__ 1000 1d"
  "RL.SLIDING|rl.sliding|sliding|yes|RL.SLIDING key:__rand_int__ 1000 1d"
  "RL.FIXED|rl.fixed|fixed|yes|RL.FIXED key:__rand_int__ 1000 1d"
  "RL.SLIDINGLOG|rl.slidinglog|slidinglog|yes|RL.SLIDINGLOG key:__rand_int__ 1000 1d"
  "CL.THROTTLE|cl.throttle|gcra|yes|CL.THROTTLE key:__rand_int__ 999 1000 86400 1"
  "Lua token bucket (seed 000)|evalsha|-|no|EVALSHA $SHA_TB 1 key:__rand_int__ 1000 0.011574074074074073 - 1"
  "Lua sliding counter (seed 003)|evalsha|-|no|EVALSHA $SHA_SW 1 key:__rand_int__ 1000 86400000"
  "Lua sorted-set log (seed 002)|evalsha|-|no|EVALSHA $SHA_ZL 1 key:__rand_int__ - 86400000 1000"
)
CELL_LABEL="CL.THROTTLE (redis-cell${CELL_VERSION:+ $CELL_VERSION})"
CELL_CASES=(
  "INCR|incr|-|yes|INCR key:__rand_int__"
  "$SET_LABEL|set|-|yes|SET key:__rand_int__ 1 EX 86400"
  "$CELL_LABEL|cl.throttle|-|yes|CL.THROTTLE key:__rand_int__ 999 1000 86400 1"
)

declare -A CPU CPU_MIN CPU_MAX SAMPLES RPS USEC LIMITED UCPU URPS UUSEC REPL ROUND_LOADS
# Where each server tag's commands go: its port, pid and replica's port.
declare -A TAG_PORT=([rl]=$BASE_PORT [cell]=$((BASE_PORT + 2))) TAG_PID=([rl]=${PIDS[rl]} [cell]=${PIDS[cell]:-})
declare -A TAG_REPLICA_PORT=([rl]=$((BASE_PORT + 1)) [cell]=$((BASE_PORT + 3)))
use_tag() { use_server "${TAG_PORT[$1]}" "${TAG_PID[$1]}"; }
# rows <config>: the rows of a configuration, both servers', as "tag|label|stat|algo|command".
rows() {
  local config=$1 c label stat algo with_replica command tag
  for tag in rl cell; do
    [ "$tag" = rl ] || [ -n "$CELL_SO" ] || continue
    if [ "$tag" = rl ]; then set -- "${CASES[@]}"; else set -- "${CELL_CASES[@]}"; fi
    for c in "$@"; do
      IFS='|' read -r label stat algo with_replica command <<<"$c"
      [ "$config" = alone ] || [ "$with_replica" = yes ] || continue
      echo "$tag|$label|$stat|$algo|$command"
    done
  done
}
# row_requests <cmdstat name> <config>: requests per run, about a second of server CPU or more
# (the Lua rows cost 8-16 µs/op; with a replica every op costs more).
row_requests() {
  if [ "$1" = evalsha ]; then echo "$N_LUA"; elif [ "$2" = replica ]; then echo "$N_REPLICA"; else echo "$N_PIPE"; fi
}
# warm_file <command>: sets W_FILE to the warm-up of a command as RESP (one call on each key
# __rand_int__ names), generated once.
declare -A WARM_FILE=()
WARM_FILES=0
warm_file() {
  local command=$1
  if [ -z "${WARM_FILE[$command]:-}" ]; then
    WARM_FILES=$((WARM_FILES + 1))
    WARM_FILE[$command]="$WORK/warm.$WARM_FILES.resp"
    gen_resp "$KEYSPACE" 1 "${command//__rand_int__/@}" >"${WARM_FILE[$command]}"
  fi
  W_FILE=${WARM_FILE[$command]}
}
# median_min_max <values...>: "median min max" (3 decimals).
median_min_max() {
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 }
    END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.3f %.3f %.3f\n", m, v[1], v[NR] }'
}

# run_rounds <config: alone|replica>: ROUNDS rounds; each round prepares and measures every row
# of the configuration once (one pipelined run), starting one row later than the round before.
# Per row: CPU (median), CPU_MIN, CPU_MAX, SAMPLES (server CPU µs/op of each round, in round
# order), USEC and RPS (medians), LIMITED (over all rounds); with a replica, REPL ("identical",
# or the first round whose check failed); alone, the module's rows also get one unpipelined run
# in the first round (UCPU, UUSEC, URPS).
run_rounds() {
  local config=$1 round j i nrows row tag label stat algo command key n calls usec
  local c0 u0 l0 c1 u1 l1 check
  local -a all argv
  local -A usecs rpss checks limited
  mapfile -t all < <(rows "$config")
  nrows=${#all[@]}
  for round in $(seq "$ROUNDS"); do
    ROUND_LOADS[$config]="${ROUND_LOADS[$config]:-}${ROUND_LOADS[$config]:+, }$(cut -d' ' -f1 /proc/loadavg)"
    log "$config: round $round of $ROUNDS ($nrows rows; load ${ROUND_LOADS[$config]##* })"
    for ((j = 0; j < nrows; j++)); do
      row=${all[$(((j + round - 1) % nrows))]}
      IFS='|' read -r tag label stat algo command <<<"$row"
      key="$tag,$label,$config"
      read -r -a argv <<<"$command"
      n=$(row_requests "$stat" "$config")
      use_tag "$tag"
      cli FLUSHALL >/dev/null
      warm_file "$command"
      pipe_file "warming up $label" "$W_FILE"
      # The replica receives the warm-up as well: let it finish before the measured run.
      if [ "$config" = replica ]; then
        check=$(wait_replica "${TAG_REPLICA_PORT[$tag]}")
        [ -z "$check" ] || { echo "bench: replica of $tag behind after warming up $label ($check)" >&2; exit 1; }
      fi
      [ "$algo" = - ] || read -r c0 u0 l0 < <(rl_counters "$algo")
      cli CONFIG RESETSTAT >/dev/null
      run_benchmark "$n" "$PIPELINE" "${argv[@]}"
      read -r calls usec < <(cmdstat "$stat")
      if [ "$calls" -lt "$n" ]; then
        echo "bench: '$command': commandstats saw $calls calls of $stat, expected $n" >&2; exit 1
      fi
      SAMPLES[$key]="${SAMPLES[$key]:-}${SAMPLES[$key]:+ }$R_CPU"
      usecs[$key]="${usecs[$key]:-} $usec" rpss[$key]="${rpss[$key]:-} $R_RPS"
      if [ "$algo" != - ]; then
        read -r c1 u1 l1 < <(rl_counters "$algo")
        checks[$key]=$(( ${checks[$key]:-0} + c1 - c0 )) limited[$key]=$(( ${limited[$key]:-0} + l1 - l0 ))
      fi
      if [ "$config" = replica ]; then
        check=$(check_replica "${TAG_REPLICA_PORT[$tag]}")
        [ "$check" = identical ] || log "  $label, round $round: replica $check"
        if [ "$round" = 1 ] || [ "${REPL[$tag,$label]}" = identical ]; then
          REPL[$tag,$label]=$check
          [ "$check" = identical ] || REPL[$tag,$label]="$check (round $round)"
        fi
      elif [ "$round" = 1 ] && [ "$tag" = rl ] && [ "$N_UNPIPE" -gt 0 ]; then
        measure "$N_UNPIPE" 1 1 "$stat" "$algo" "${argv[@]}"
        UCPU[$tag,$label]=$M_CPU URPS[$tag,$label]=$M_RPS UUSEC[$tag,$label]=$M_USEC
      fi
    done
  done
  local med lo hi
  for row in "${all[@]}"; do
    IFS='|' read -r tag label stat algo command <<<"$row"
    key="$tag,$label,$config"
    # shellcheck disable=SC2086
    read -r med lo hi < <(median_min_max ${SAMPLES[$key]})
    CPU[$key]=$med CPU_MIN[$key]=$lo CPU_MAX[$key]=$hi
    # shellcheck disable=SC2086
    read -r med _ < <(median_min_max ${usecs[$key]})
    USEC[$key]=$(calc "%.2f" "$med")
    # shellcheck disable=SC2086
    read -r med _ < <(median_min_max ${rpss[$key]})
    RPS[$key]=$med
    if [ "$algo" = - ]; then
      LIMITED[$key]="–"
    else
      LIMITED[$key]=$(calc "%.1f%%" "100 * ${limited[$key]} / (${checks[$key]} > 0 ? ${checks[$key]} : 1)")
    fi
  done
  use_tag rl
}

run_rounds alone

# ---------------------------------------------------------------------------------------------
# 2. The sliding log at its limit, one key hammered
# ---------------------------------------------------------------------------------------------
# a) admit one, evict one: the log is filled to `limit` entries one second apart on the debug
#    clock (window = limit seconds; the helper script steps the clock before each call), then
#    every measured call steps the clock one second, evicts the oldest entry and admits one.
#    usec_per_call is RL.SLIDINGLOG's own (commands called from a script are counted in
#    commandstats). The step is a second, not a µs, so that the key's TTL (= reset_after, on the
#    server's real clock) is seconds long and the key cannot expire during the run.
# b) refused: the same fill with a 1-minute window, then the clock follows the real clock and
#    RL.SLIDINGLOG is sent directly: every call finds the log full and computes the exact
#    retry_after (nothing is written).
declare -A H_ADMIT_USEC H_ADMIT_PCT H_ADMIT_ENTRIES H_REF_USEC H_REF_CPU H_REF_PCT H_REF_ENTRIES
fill_log() { # key limit window step_us: `limit` entries, `step_us` apart
  local key=$1 limit=$2 window=$3 step=$4
  cli DEL "$key" >/dev/null
  cli RL.DEBUG CLOCK SET "$(( $(date +%s) * 1000000 ))" >/dev/null
  pipe_in "filling $key" "$limit" 1 "EVALSHA $SHA_STEP 1 $key $limit $window $step"
  [ "$(log_entries "$key")" = "$limit" ] || { echo "bench: filling $key left $(log_entries "$key") entries, not $limit" >&2; exit 1; }
}
log_entries() { # key -> entries in the log
  cli RL.INFO "$1" | tr -d '\r' | awk 'prev == "entries" { print; exit } { prev = $0 }'
}
for limit in "${HAMMER_LIMITS[@]}"; do
  log "sliding log at its limit: $limit"
  key="hot:$limit"
  # a) admit one, evict one
  fill_log "$key" "$limit" "${limit}s" 1000000
  measure "$N_HAMMER" "$PIPELINE" 1 rl.slidinglog slidinglog EVALSHA "$SHA_STEP" 1 "$key" "$limit" "${limit}s" 1000000
  H_ADMIT_USEC[$limit]=$M_USEC
  H_ADMIT_PCT[$limit]=$(calc "%.1f%%" "100 * $M_ADMITTED / $M_CHECKS")
  H_ADMIT_ENTRIES[$limit]=$(log_entries "$key")
  # b) refused
  fill_log "$key" "$limit" 1m 1
  cli RL.DEBUG CLOCK REAL >/dev/null
  measure "$N_HAMMER" "$PIPELINE" 1 rl.slidinglog slidinglog RL.SLIDINGLOG "$key" "$limit" 1m
  H_REF_USEC[$limit]=$M_USEC H_REF_CPU[$limit]=$M_CPU
  H_REF_PCT[$limit]=$(calc "%.1f%%" "100 * $M_LIMITED / $M_CHECKS")
  H_REF_ENTRIES[$limit]=$(log_entries "$key")
  cli DEL "$key" >/dev/null
done
cli RL.DEBUG CLOCK REAL >/dev/null

# ---------------------------------------------------------------------------------------------
# 3. Memory per key: used_memory before and after loading N keys (FLUSHALL between)
# ---------------------------------------------------------------------------------------------
# measure_memory <keys> <rounds> <template>: sets M_BYTES (used_memory delta per key). On the
# servers with this module (all but redis-cell's) the debug clock is pinned while loading.
measure_memory() {
  local keys=$1 rounds=$2 tpl=$3 before after debug_clock=yes
  [ "$PORT" != "${TAG_PORT[cell]}" ] || debug_clock=no
  cli FLUSHALL >/dev/null
  [ $debug_clock = no ] || cli RL.DEBUG CLOCK SET "$(( $(date +%s) * 1000000 ))" >/dev/null
  sleep 0.2
  before=$(info_field memory used_memory)
  pipe_in "loading '$tpl'" "$keys" "$rounds" "$tpl"
  after=$(info_field memory used_memory)
  M_BYTES=$(calc "%.1f" "($after - $before) / $keys")
  M_DBSIZE=$(cli DBSIZE)
  [ $debug_clock = no ] || cli RL.DEBUG CLOCK REAL >/dev/null
}

MEM_SET_LABEL="SET k 1 EX 60 (baseline)"
MEM_CASES=(
  "$MEM_SET_LABEL|SET mem:@ 1 EX 60"
  "RL.GCRA|RL.GCRA mem:@ 1000 1d"
  "RL.TOKENBUCKET|RL.TOKENBUCKET mem:@ 1000 1d"
  "RL.LEAKY|RL.LEAKY mem:@ 1000 1d"
  "RL.SLIDING|RL.SLIDING mem:@ 1000 1d"
  "RL.FIXED|RL.FIXED mem:@ 1000 1d"
  "RL.SLIDINGLOG (1 entry)|RL.SLIDINGLOG mem:@ 1000 1d"
  "CL.THROTTLE|CL.THROTTLE mem:@ 999 1000 86400 1"
  "Lua token bucket hash (seed 000)|EVALSHA $SHA_TB 1 mem:@ 1000 0.011574074074074073 - 1"
)
declare -A MEM MEM_DB
for c in "${MEM_CASES[@]}"; do
  IFS='|' read -r label tpl <<<"$c"
  log "memory: $label"
  measure_memory "$MEM_KEYS" 1 "$tpl"
  MEM[$label]=$M_BYTES MEM_DB[$label]=$M_DBSIZE
done
declare -A LOGMEM
for i in 0 1 2; do
  size=${LOG_SIZES[$i]} keys=${LOG_KEYS[$i]}
  log "memory: logs of $size entries × $keys keys"
  measure_memory "$keys" "$size" "RL.SLIDINGLOG log:@ 100000 1d"
  LOGMEM[rl,$size]=$M_BYTES
  # The sorted-set script stamps its own time (TIME); members stay distinct through its :seq key.
  measure_memory "$keys" "$size" "EVALSHA $SHA_ZL 1 log:@ - 86400000 100000"
  LOGMEM[zset,$size]=$M_BYTES
done
cli FLUSHALL >/dev/null
if [ -n "$CELL_SO" ]; then
  use_tag cell
  log "memory: $CELL_LABEL"
  measure_memory "$MEM_KEYS" 1 "CL.THROTTLE mem:@ 999 1000 86400 1"
  MEM[$CELL_LABEL]=$M_BYTES MEM_DB[$CELL_LABEL]=$M_DBSIZE
  measure_memory "$MEM_KEYS" 1 "SET mem:@ 1 EX 60"
  MEM[cell-set]=$M_BYTES
  cli FLUSHALL >/dev/null
  use_tag rl
fi

# The same rows on the other servers scripts/compat.sh builds (Redis 7.2, 7.4, 8.0, Valkey 8;
# newer servers lay keys out differently, e.g. Valkey 8 embeds the key in its entry), one server
# at a time on BASE_PORT+4, with the module loaded as above.
OTHER_MEM_CASES=("$MEM_SET_LABEL" RL.GCRA RL.TOKENBUCKET RL.SLIDING)
declare -A OTHER_MEM
OTHER_SERVERS=() OTHER_STATUS=
find_servers_dir() {
  local c main_root
  if [ -n "${BENCH_SERVERS_DIR:-}" ]; then echo "$BENCH_SERVERS_DIR"; return; fi
  main_root=$(cd "$(git rev-parse --git-common-dir 2>/dev/null || echo .git)/.." 2>/dev/null && pwd || echo "$ROOT")
  for c in "$ROOT/target/servers" "$main_root/target/servers"; do
    [ -d "$c" ] && { echo "$c"; return; }
  done
  echo "$ROOT/target/servers"
}
SERVERS_DIR=$(find_servers_dir)
if [ "$SERVERS_DIR" = none ]; then
  OTHER_STATUS="skipped (BENCH_SERVERS_DIR=none)"
else
  for bin in "$SERVERS_DIR"/*/bin/redis-server "$SERVERS_DIR"/*/bin/valkey-server; do
    [ -x "$bin" ] && OTHER_SERVERS+=("$bin")
  done
  [ ${#OTHER_SERVERS[@]} -gt 0 ] ||
    OTHER_STATUS="skipped: no server built in $SERVERS_DIR (\`bash scripts/compat.sh build\` builds them; BENCH_SERVERS_DIR names another folder)"
fi
for bin in "${OTHER_SERVERS[@]}"; do
  name=$(basename "$(dirname "$(dirname "$bin")")")
  version=$("$bin" --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
  OTHER_MEM[$name,version]=$version
  SERVER_BIN=$bin start_server "other-$name" $((BASE_PORT + 4)) "$SERVER_CPU" "$WORK/module.so" DEBUG_CLOCK
  use_server $((BASE_PORT + 4)) "${PIDS[other-$name]}"
  for c in "${MEM_CASES[@]}"; do
    IFS='|' read -r label tpl <<<"$c"
    case "$label" in "$MEM_SET_LABEL"|RL.GCRA|RL.TOKENBUCKET|RL.SLIDING) ;; *) continue ;; esac
    log "memory on $name: $label"
    measure_memory "$MEM_KEYS" 1 "$tpl"
    OTHER_MEM[$name,$label]=$M_BYTES
  done
  stop_server "other-$name"
  use_tag rl
done

# ---------------------------------------------------------------------------------------------
# 4. With a replica attached: the same rounds, the module's server and redis-cell's each with
#    its own replica (on the client's CPU)
# ---------------------------------------------------------------------------------------------
use_tag rl
attach_replica rl-replica "${TAG_REPLICA_PORT[rl]}" "$WORK/module.so" DEBUG_CLOCK
if [ -n "$CELL_SO" ]; then
  use_tag cell
  attach_replica cell-replica "${TAG_REPLICA_PORT[cell]}" "$WORK/cell.so"
  use_tag rl
fi
run_rounds replica
for tag in rl cell; do
  [ "$tag" = rl ] || [ -n "$CELL_SO" ] || continue
  use_tag "$tag"
  cli FLUSHALL >/dev/null
done
use_tag rl

# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
MACHINE_NPROC=$(nproc)
MACHINE_LSCPU=$(lscpu | head)
REDIS_VERSION=$(redis-server --version)
LOADAVG=$(cut -d' ' -f1-3 /proc/loadavg)
DATE=$(date -u '+%Y-%m-%d %H:%M:%S UTC')

{
  echo "## redis-ratelimit benchmark report"
  echo ""
  echo "- Command: \`bash $COMMAND_LINE\` (what \`make bench\` runs, before \`cargo bench --bench core\`), in $ROOT"
  echo "- Settings: BENCH_PORT=$BASE_PORT BENCH_ROUNDS=$ROUNDS BENCH_N_PIPELINED=$N_PIPE BENCH_N_REPLICA=$N_REPLICA BENCH_N_LUA=$N_LUA BENCH_N_HAMMER=$N_HAMMER BENCH_N_UNPIPELINED=$N_UNPIPE BENCH_CLIENTS=$CLIENTS BENCH_KEYSPACE=$KEYSPACE BENCH_MEM_KEYS=$MEM_KEYS BENCH_LOG_KEYS=\"${LOG_KEYS[*]}\" BENCH_SERVERS_DIR=$SERVERS_DIR"
  echo "- Servers: \`redis-server --save \"\" --appendonly no --loadmodule libredis_ratelimit.so DEBUG_CLOCK\`, and one with redis-cell${CELL_VERSION:+ $CELL_VERSION} (${CELL_STATUS:-built from $CELL_SRC}); measured servers pinned with \`taskset -c $SERVER_CPU\`, redis-benchmark and the replicas with \`taskset -c $CLIENT_CPU\`${SERVER_PIN:+}"
  echo "- Date: $DATE; load average (1/5/15 min) at the start: $LOAD_START, at the end: $LOADAVG; 1-minute load average at the start of each round: keys in place ${ROUND_LOADS[alone]}; with a replica ${ROUND_LOADS[replica]}; run time $((SECONDS / 60)) min $((SECONDS % 60)) s"
  if awk -v l="${LOAD_START%% *}" 'BEGIN { exit !(l > 0.5) }'; then
    echo "- **Note:** the machine was not idle when the run started (1-minute load average ${LOAD_START%% *}): other processes competed for the CPUs; every row was measured in each of the $ROUNDS rounds, so disturbances spread over all rows; see each row's min–max."
  fi
  echo "- Source: git $GIT_REV$([ "$GIT_DIRTY" -gt 0 ] && echo " with $GIT_DIRTY uncommitted change(s) in src/, Cargo.*")"
  echo "- \`redis-server --version\`: $REDIS_VERSION"
  echo "- \`nproc\`: $MACHINE_NPROC"
  echo ""
  echo '```'
  echo "$ lscpu | head"
  echo "$MACHINE_LSCPU"
  echo '```'
} >"$WORK/header.md"
cat "$WORK/header.md" >&1
cat "$WORK/header.md" >>"$REPORT_BODY"

# The redis-cell rows' ratios are against its own server's INCR and SET EX.
print_cpu_table() { # config
  local config=$1 c label tag base_incr base_set key n
  out ""
  if [ "$config" = alone ]; then
    out "### Server CPU per operation, keys in place (-P $PIPELINE, -c $CLIENTS, -r $KEYSPACE; median of $ROUNDS rounds)"
  else
    out "### Server CPU per operation with a replica attached (-P $PIPELINE, -c $CLIENTS, -r $KEYSPACE; median of $ROUNDS rounds)"
  fi
  out ""
  local head="| command | requests/run | server CPU µs/op (median) | min–max | spread | × INCR | × SET EX | usec_per_call | × INCR | ops/s | limited |"
  local rule="|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  if [ "$config" = alone ]; then
    out "$head"; out "$rule"
  else
    out "$head replica (DEBUG DIGEST, PEXPIRETIME of $EXPIRY_SAMPLE keys; every round) |"; out "$rule---|"
  fi
  for tag in rl cell; do
    if [ "$tag" = cell ] && [ -z "$CELL_SO" ]; then
      out "| $CELL_LABEL | $CELL_STATUS | | | | | | | | | |$([ "$config" = replica ] && echo " |")"
      continue
    fi
    base_incr=${CPU[$tag,INCR,$config]} base_set=${CPU[$tag,$SET_LABEL,$config]} base_usec=${USEC[$tag,INCR,$config]}
    if [ "$tag" = rl ]; then set -- "${CASES[@]}"; else set -- "${CELL_CASES[@]}"; fi
    for c in "$@"; do
      IFS='|' read -r label stat _ with_replica _ <<<"$c"
      [ "$config" = alone ] || [ "$with_replica" = yes ] || continue
      key="$tag,$label,$config"
      local shown=$label
      [ "$tag" = rl ] || [ "$label" = "$CELL_LABEL" ] || shown="$label (redis-cell's server)"
      local row="| $shown | $(row_requests "$stat" "$config") | ${CPU[$key]} | ${CPU_MIN[$key]}–${CPU_MAX[$key]} | $(calc "±%.0f%%" "50 * (${CPU_MAX[$key]} - ${CPU_MIN[$key]}) / ${CPU[$key]}") | $(ratio "${CPU[$key]}" "$base_incr") | $(ratio "${CPU[$key]}" "$base_set") | ${USEC[$key]} | $(ratio "${USEC[$key]}" "$base_usec") | $(calc "%.0f" "${RPS[$key]}") | ${LIMITED[$key]} |"
      [ "$config" = alone ] || row="$row ${REPL[$tag,$label]} |"
      out "$row"
    done
  done
}
print_cpu_table alone
print_cpu_table replica
# The samples behind the medians: server CPU µs/op of every row in every round.
print_round_samples() {
  local config tag label key c i shown
  out ""
  out "#### Server CPU µs/op in each round (the samples behind the medians; each round starts one row later than the one before)"
  out ""
  out "| configuration | command | $(seq -s ' | ' 1 "$ROUNDS") |"
  out "|---|---|$(printf -- '---:|%.0s' $(seq "$ROUNDS"))"
  for config in alone replica; do
    while IFS='|' read -r tag label _; do
      key="$tag,$label,$config" shown=$label
      [ "$tag" = rl ] || [ "$label" = "$CELL_LABEL" ] || shown="$label (redis-cell's server)"
      out "| $([ "$config" = alone ] && echo "keys in place" || echo "with a replica") | $shown | ${SAMPLES[$key]// / | } |"
    done < <(rows "$config")
  done
}
print_round_samples
out ""
out "Rounds: each configuration (keys in place; with a replica) was measured in $ROUNDS rounds; a round runs every row of the table once, the module's server's and redis-cell's, starting one row later than the round before, so that a slow period of the machine touches all rows alike. Every run: FLUSHALL, one unmeasured call of the same command on every key of the keyspace (with a replica: its offset waited for), CONFIG RESETSTAT, one pipelined run of the requests shown. Server CPU µs/op: CPU time (utime + stime, from schedstat) of all the measured server's threads during the run ÷ requests; the median over the rounds, with the least and the most; spread: ±half of (max − min) ÷ median. Ratios are between medians. usec_per_call: INFO commandstats of each run, median (Lua rows: cmdstat_evalsha, the whole script). ops/s: redis-benchmark's, median (on this machine one client cannot saturate the server with the cheap commands, so ops/s partly measure the client). Limited: share of calls refused over all rounds (module counters). redis-cell runs on its own server (both modules register CL.THROTTLE); its ratios are against INCR and SET EX measured again on that server, in the same rounds. With a replica: the replica runs on the client's CPU; after every run the replica's offset is waited for, then DEBUG DIGEST of the two servers is compared, and PEXPIRETIME of $EXPIRY_SAMPLE keys. (redis-cell replicates the command itself, so its replica recomputes every call with its own clock: its state differs from the primary's.)"

if [ "$N_UNPIPE" -gt 0 ]; then
  out ""
  out "### Unpipelined (-P 1, -c $CLIENTS, -n $N_UNPIPE, -r $KEYSPACE; one run)"
  out ""
  out "| command | server CPU µs/op | × INCR | usec_per_call | ops/s | × INCR |"
  out "|---|---:|---:|---:|---:|---:|"
  for c in "${CASES[@]}"; do
    IFS='|' read -r label _ _ _ _ <<<"$c"
    out "| $label | ${UCPU[rl,$label]} | $(ratio "${UCPU[rl,$label]}" "${UCPU[rl,INCR]}") | ${UUSEC[rl,$label]} | $(calc "%.0f" "${URPS[rl,$label]}") | $(ratio "${URPS[rl,$label]}" "${URPS[rl,INCR]}") |"
  done
  out ""
  out "One request per round trip: system calls dominate the server's CPU per op."
fi

out ""
out "### RL.SLIDINGLOG at its limit, one key hammered (-P $PIPELINE, -c $CLIENTS, -n $N_HAMMER)"
out ""
out "| limit | admit one, evict one: usec_per_call | × INCR | admitted | log entries | refused (log full): usec_per_call | × INCR | server CPU µs/op | refused | log entries |"
out "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
base_usec=${USEC[rl,INCR,alone]}
for limit in "${HAMMER_LIMITS[@]}"; do
  out "| $limit | ${H_ADMIT_USEC[$limit]} | $(ratio "${H_ADMIT_USEC[$limit]}" "$base_usec") | ${H_ADMIT_PCT[$limit]} | ${H_ADMIT_ENTRIES[$limit]} | ${H_REF_USEC[$limit]} | $(ratio "${H_REF_USEC[$limit]}" "$base_usec") | ${H_REF_CPU[$limit]} | ${H_REF_PCT[$limit]} | ${H_REF_ENTRIES[$limit]} |"
done
out ""
out "Admit one, evict one: window = limit seconds, filled with limit entries one second apart (debug clock); each measured call is \`EVALSHA\` of a two-line helper that steps the debug clock by one second and calls \`RL.SLIDINGLOG key <limit> <limit>s\`, so every call evicts the oldest entry and admits one; the usec_per_call shown is RL.SLIDINGLOG's own line in commandstats (not the script's, whose CPU the server CPU figure would include). Refused: limit entries 1 µs apart with a 1-minute window, then the clock back on the real clock and RL.SLIDINGLOG sent directly: every call finds the log full and computes retry_after. × INCR: against pipelined INCR's usec_per_call (median). One run each."

out ""
out "### Memory per key (used_memory delta / keys; FLUSHALL between rows)"
out ""
base_mem=${MEM[$MEM_SET_LABEL]}
out "| value | keys | bytes/key | over the SET baseline |"
out "|---|---:|---:|---:|"
for c in "${MEM_CASES[@]}"; do
  IFS='|' read -r label _ <<<"$c"
  out "| $label | ${MEM_DB[$label]} | ${MEM[$label]} | $(calc "%+.1f" "${MEM[$label]} - $base_mem") |"
done
if [ -n "$CELL_SO" ]; then
  out "| $CELL_LABEL, on its own server (where the SET baseline is ${MEM[cell-set]}) | ${MEM_DB[$CELL_LABEL]} | ${MEM[$CELL_LABEL]} | $(calc "%+.1f" "${MEM[$CELL_LABEL]} - ${MEM[cell-set]}") |"
else
  out "| $CELL_LABEL | – | $CELL_STATUS | |"
fi
out ""
out "### Memory per key on other servers (used_memory delta / $MEM_KEYS keys, same keys and commands)"
out ""
if [ ${#OTHER_SERVERS[@]} -eq 0 ]; then
  out "Other servers: $OTHER_STATUS."
else
  out "| server | ${OTHER_MEM_CASES[*]/%/ |}"
  out "|---|$(printf -- '---:|%.0s' "${OTHER_MEM_CASES[@]}")"
  row="| redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') (Debian; the table above) |"
  for label in "${OTHER_MEM_CASES[@]}"; do row="$row ${MEM[$label]} |"; done
  out "$row"
  for bin in "${OTHER_SERVERS[@]}"; do
    name=$(basename "$(dirname "$(dirname "$bin")")")
    row="| $name (${bin##*/} ${OTHER_MEM[$name,version]}) |"
    for label in "${OTHER_MEM_CASES[@]}"; do row="$row ${OTHER_MEM[$name,$label]} |"; done
    out "$row"
  done
  out ""
  out "Bytes per key; servers built by \`scripts/compat.sh\` from $SERVERS_DIR, the module loaded as on the main server, one server at a time on the measured CPU. Each server lays keys out its own way (Valkey 8 embeds the key and its expiry in the entry) with its own bundled jemalloc: these rows show what a newer server does to the same keys."
fi
out ""
out "### Memory of the logs (10 / 100 / 1,000 stored requests per key)"
out ""
out "| log | entries/key | keys | bytes/key | bytes/entry (total) | bytes/entry (marginal, from 10) |"
out "|---|---:|---:|---:|---:|---:|"
for kind in rl zset; do
  if [ $kind = rl ]; then name="RL.SLIDINGLOG (distinct µs)"; else name="Lua sorted set (seed 002)"; fi
  for i in 0 1 2; do
    size=${LOG_SIZES[$i]}
    if [ "$i" -eq 0 ]; then marg="–"; else
      marg=$(calc "%.2f" "(${LOGMEM[$kind,$size]} - ${LOGMEM[$kind,10]}) / ($size - 10)")
    fi
    out "| $name | $size | ${LOG_KEYS[$i]} | ${LOGMEM[$kind,$size]} | $(calc "%.2f" "${LOGMEM[$kind,$size]} / $size") | $marg |"
  done
done
out ""
out "The sorted-set rows include the script's \`:seq\` key (one per log). RL.SLIDINGLOG entries at distinct microseconds (\`RL.DEBUG CLOCK ADVANCE 1\` between rounds of calls: one entry per request). Keys per row: BENCH_LOG_KEYS. Marginal bytes/entry: (bytes/key − bytes/key at 10 entries) / (entries − 10)."

# Targets from issue 12.
pass() { if [ "${2:-}" = "n/a" ] || [ -z "${2-x}" ]; then echo "n/a"; elif awk "BEGIN { exit !($1) }"; then echo "yes"; else echo "**no**"; fi; }
# round_ratios <samples a> <samples b> [<samples c> <samples d>]: a ÷ b (÷ (c ÷ d)) within each
# round (the samples are in round order), space separated.
round_ratios() {
  awk -v a="$1" -v b="$2" -v c="${3:-}" -v d="${4:-}" 'BEGIN {
    n = split(a, A, " "); split(b, B, " "); split(c, C, " "); split(d, D, " ")
    for (i = 1; i <= n; i++) {
      if (B[i] == 0 || (c != "" && (D[i] == 0 || C[i] == 0))) { print ""; exit }
      r = A[i] / B[i]; if (c != "") r = r / (C[i] / D[i])
      printf "%s%.4f", (i > 1 ? " " : ""), r
    }
    print "" }'
}
# ratio_cell <median ratio> <threshold> <op: <= or >=> <round ratios>: "measured | met" cells;
# measured shows the range of the ratio within rounds, met says in how many rounds it held when
# not in all of them (met itself is decided by the ratio of medians).
ratio_cells() {
  local r=$1 limit=$2 op=$3 rounds=$4 range held
  range=$(awk -v s="$rounds" 'BEGIN { n = split(s, v, " "); if (n == 0) exit
    lo = hi = v[1]; for (i = 2; i <= n; i++) { if (v[i] < lo) lo = v[i]; if (v[i] > hi) hi = v[i] }
    printf "%.2f–%.2f", lo, hi }')
  held=$(awk -v s="$rounds" -v t="$limit" -v op="$op" 'BEGIN { n = split(s, v, " ");
    for (i = 1; i <= n; i++) k += (op == "<=" ? v[i] <= t : v[i] >= t); printf "%d of %d", k, n }')
  local met
  met=$(pass "$r $op $limit" "$r")
  case "$held" in "0 of "*|"$ROUNDS of "*) ;; *) met="$met ($held rounds)" ;; esac
  echo "${r}× (rounds: ${range:-n/a}) | $met"
}
out ""
out "### Targets"
out ""
out "CPU ratios are ratios of medians; \"rounds:\" gives the least and the most of the same ratio taken within each round (the rows of one round are measured at most a few minutes apart). Met is decided by the ratio of medians; when not every round agrees, the number of rounds in which the target held is shown."
out ""
out "| target | measured | met |"
out "|---|---|---|"
O1=(RL.GCRA RL.TOKENBUCKET RL.LEAKY RL.FIXED RL.SLIDING CL.THROTTLE)
for config in alone replica; do
  if [ "$config" = alone ]; then where="keys in place"; else where="with a replica"; fi
  for label in "${O1[@]}"; do
    r=$(ratio "${CPU[rl,$label,$config]}" "${CPU[rl,$SET_LABEL,$config]}")
    out "| $label server CPU/op ≤ 1.25× SET EX's, $where | $(ratio_cells "$r" 1.25 "<=" "$(round_ratios "${SAMPLES[rl,$label,$config]}" "${SAMPLES[rl,$SET_LABEL,$config]}")") |"
  done
  if [ -n "$CELL_SO" ]; then
    cell_x=$(ratio "${CPU[cell,$CELL_LABEL,$config]}" "${CPU[cell,$SET_LABEL,$config]}")
    for label in "${O1[@]}"; do
      ours_x=$(ratio "${CPU[rl,$label,$config]}" "${CPU[rl,$SET_LABEL,$config]}")
      r=$(ratio "$ours_x" "$cell_x")
      raw=$(ratio "${CPU[rl,$label,$config]}" "${CPU[cell,$CELL_LABEL,$config]}")
      rounds=$(round_ratios "${SAMPLES[rl,$label,$config]}" "${SAMPLES[rl,$SET_LABEL,$config]}" \
        "${SAMPLES[cell,$CELL_LABEL,$config]}" "${SAMPLES[cell,$SET_LABEL,$config]}")
      cells=$(ratio_cells "$r" 0.67 "<=" "$rounds")
      out "| $label server CPU/op ≤ 0.67× redis-cell's CL.THROTTLE, $where (each × its own server's SET EX; raw µs ratio of medians after the range) | ${cells%% | *}, raw ${raw}× | ${cells#* | } |"
    done
  else
    out "| O(1) limiters ≤ 0.67× redis-cell's CL.THROTTLE, $where | redis-cell $CELL_STATUS | n/a |"
  fi
done
bad=0
for c in "${CASES[@]}"; do
  IFS='|' read -r label _ _ with_replica _ <<<"$c"
  [ "$with_replica" = yes ] && [ "${REPL[rl,$label]}" != identical ] && bad=$((bad + 1))
done
out "| the module's replica holds identical state and expiry after every row (DEBUG DIGEST, PEXPIRETIME sample) | $bad row(s) differ | $(pass "$bad == 0") |"
if [ -n "$CELL_SO" ]; then
  out "| (reference) redis-cell's replica after its CL.THROTTLE row | ${REPL[cell,$CELL_LABEL]} | – |"
fi
r=$(ratio "${CPU[rl,RL.SLIDINGLOG,alone]}" "${CPU[rl,RL.GCRA,alone]}")
out "| RL.SLIDINGLOG server CPU/op ≤ 1.5× RL.GCRA's (random keys) | $(ratio_cells "$r" 1.5 "<=" "$(round_ratios "${SAMPLES[rl,RL.SLIDINGLOG,alone]}" "${SAMPLES[rl,RL.GCRA,alone]}")") |"
lo=${H_ADMIT_USEC[10]} hi=${H_ADMIT_USEC[100000]}
out "| RL.SLIDINGLOG flat from limit 10 to 100,000 (admit+evict usec_per_call, ±25%) | ${lo} → ${H_ADMIT_USEC[1000]} → ${hi} usec | $(pass "$hi <= 1.25 * $lo && $hi >= 0.75 * $lo") |"
slope=$(calc "%.2f" "(${LOGMEM[rl,1000]} - ${LOGMEM[rl,10]}) / 990")
const=$(calc "%.0f" "${LOGMEM[rl,10]} - 10 * $slope")
out "| RL.SLIDINGLOG memory ≤ 8 B per stored request (+ a constant) | ${slope} B/entry + ${const} B/key (fit 10 → 1,000) | $(pass "$slope <= 8") |"
for label in RL.GCRA RL.TOKENBUCKET RL.LEAKY RL.FIXED RL.SLIDING; do
  out "| $label memory ≤ 128 B/key | ${MEM[$label]} B/key | $(pass "${MEM[$label]} <= 128") |"
done
out "| (reference) redis-cell memory per key | ${MEM[$CELL_LABEL]:-$CELL_STATUS} | – |"
for bin in "${OTHER_SERVERS[@]}"; do
  name=$(basename "$(dirname "$(dirname "$bin")")")
  out "| (reference) on $name: RL.GCRA / RL.TOKENBUCKET / RL.SLIDING memory per key | ${OTHER_MEM[$name,RL.GCRA]} / ${OTHER_MEM[$name,RL.TOKENBUCKET]} / ${OTHER_MEM[$name,RL.SLIDING]} B/key (SET k 1 EX: ${OTHER_MEM[$name,$MEM_SET_LABEL]}) | – |"
done
for pair in "RL.GCRA|Lua token bucket (seed 000)" "RL.TOKENBUCKET|Lua token bucket (seed 000)" \
            "RL.LEAKY|Lua token bucket (seed 000)" "CL.THROTTLE|Lua token bucket (seed 000)" \
            "RL.SLIDING|Lua sliding counter (seed 003)" "RL.FIXED|Lua sliding counter (seed 003)" \
            "RL.SLIDINGLOG|Lua sorted-set log (seed 002)"; do
  IFS='|' read -r a b <<<"$pair"
  r=$(ratio "${CPU[rl,$b,alone]}" "${CPU[rl,$a,alone]}")
  out "| $a ≥ 4× cheaper per op (server CPU) than $b | $(ratio_cells "$r" 4 ">=" "$(round_ratios "${SAMPLES[rl,$b,alone]}" "${SAMPLES[rl,$a,alone]}")") |"
done

mkdir -p "$(dirname "$REPORT")"
cp "$REPORT_BODY" "$REPORT"
log "report written to $REPORT"
