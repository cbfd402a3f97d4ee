#!/usr/bin/env bash
# Server-side benchmarks of redis-ratelimit: throughput and per-call cost of every limiter
# command against INCR (the floor) and against the seeds' Lua scripts, the sliding log's cost at
# its limit for limits 10 .. 100,000, and memory per key. Prints Markdown tables and writes them
# to target/bench-report.md.
#
#   bash scripts/bench.sh            (or: make bench)
#
# One redis-server is started (with the module, `--save "" --appendonly no`) and stopped again.
# On a machine with two or more CPUs the server is pinned to one CPU and redis-benchmark to
# another (taskset), so the client never steals the server's core.
#
# Environment (defaults in brackets):
#   BENCH_PORT [6390]               port of the benchmark server (must be free)
#   RL_MODULE  [target/release/libredis_ratelimit.so]
#   BENCH_REPORT [target/bench-report.md]
#   BENCH_N_PIPELINED [200000]      requests per pipelined run (-P 16)
#   BENCH_N_UNPIPELINED [50000]     requests per unpipelined run
#   BENCH_CLIENTS [50]              redis-benchmark -c
#   BENCH_KEYSPACE [100000]         redis-benchmark -r (random keys via __rand_int__)
#   BENCH_MEM_KEYS [200000]         keys for the O(1) memory rows
#   BENCH_LOG_KEYS ["20000 2000 200"]  keys for the 10 / 100 / 1,000-entry log rows
#   BENCH_SERVER_CPU [0] BENCH_CLIENT_CPU [1]
#   BENCH_ATTEMPTS [2] BENCH_MAX_STOLEN [10]  a measured run during which the server waited for
#                                   its CPU (taken by another process) more than BENCH_MAX_STOLEN %
#                                   of the time is repeated, up to BENCH_ATTEMPTS runs; the least
#                                   disturbed run is kept (see measure())
#
# Notes on method (also printed in the report):
# - Throughput runs: FLUSHALL, one unmeasured call of the same command on every key of the
#   keyspace (so keys exist and the dict is grown, as in production where clients' keys live),
#   CONFIG RESETSTAT, then the measured run; usec_per_call comes from INFO commandstats of that
#   run (for the Lua scripts: cmdstat_evalsha, which includes the commands the script calls).
#   "Ops per server CPU-second" divides the requests by the CPU time the server's main thread
#   used (/proc schedstat): what the server sustains when it, not the client, is the bottleneck.
# - Parameters keep every key alive for the whole run: 1000 per day (a bucket's key lives
#   86.4 s per admitted request, a window's key until its window ends; the Lua scripts get the
#   same rate). A limiter whose key expires between two hits (e.g. `RL.GCRA k 1000000 1s`: TTL
#   1 ms) measures key creation and expiry, not a decision.
# - The module is loaded with DEBUG_CLOCK. That only enables RL.DEBUG (used to place sliding-log
#   entries at distinct microseconds for the memory rows and to step the clock for the "admit
#   one, evict one" rows); the clock follows the real clock otherwise and the hot path reads the
#   same atomic either way (src/clock.rs: now_us).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

PORT=${BENCH_PORT:-6390}
MODULE=${RL_MODULE:-target/release/libredis_ratelimit.so}
REPORT=${BENCH_REPORT:-target/bench-report.md}
N_PIPE=${BENCH_N_PIPELINED:-200000}
N_UNPIPE=${BENCH_N_UNPIPELINED:-50000}
CLIENTS=${BENCH_CLIENTS:-50}
KEYSPACE=${BENCH_KEYSPACE:-100000}
MEM_KEYS=${BENCH_MEM_KEYS:-200000}
read -r -a LOG_KEYS <<<"${BENCH_LOG_KEYS:-20000 2000 200}"
LOG_SIZES=(10 100 1000)
HAMMER_LIMITS=(10 1000 100000)
ATTEMPTS=${BENCH_ATTEMPTS:-2}
MAX_STOLEN=${BENCH_MAX_STOLEN:-10}
SERVER_CPU=${BENCH_SERVER_CPU:-0}
CLIENT_CPU=${BENCH_CLIENT_CPU:-1}
PIPELINE=16
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
cli() { redis-cli -p "$PORT" "$@"; }

# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------
if redis-cli -p "$PORT" ping >/dev/null 2>&1; then
  echo "bench: something already answers on port $PORT; set BENCH_PORT to a free port" >&2
  exit 1
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rl-bench.XXXXXX")
# A private copy of the module: a rebuild during the run cannot change the loaded library.
cp "$MODULE" "$WORK/module.so"
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"${SERVER_PIN[@]}" redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$WORK" --logfile "$WORK/redis.log" --daemonize no \
  --loadmodule "$WORK/module.so" DEBUG_CLOCK &
SERVER_PID=$!
for _ in $(seq 100); do
  cli ping >/dev/null 2>&1 && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/redis.log" >&2; exit 1; }
  sleep 0.1
done
cli ping >/dev/null || { echo "bench: redis-server did not start" >&2; cat "$WORK/redis.log" >&2; exit 1; }
log "redis-server pid $SERVER_PID on port $PORT${SERVER_PIN:+ (CPU $SERVER_CPU; client on CPU $CLIENT_CPU)}"

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
# server_sched: "<ns on CPU> <ns waiting for a CPU>" of the server's main thread (Linux
# schedstat); where unavailable, CPU time from INFO cpu and no wait figure.
server_sched() {
  local f=/proc/$SERVER_PID/task/$SERVER_PID/schedstat
  if [ -r "$f" ]; then
    awk '{ print $1, $2 }' "$f"
  else
    cli INFO cpu | tr -d '\r' | awk -F: '$1 == "used_cpu_sys_main_thread" || $1 == "used_cpu_user_main_thread" { s += $2 } END { printf "%.0f 0\n", s * 1e9 }'
  fi
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
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'; }

# run_benchmark <requests> <pipeline> <command...>: runs redis-benchmark and sets R_RPS, R_WALL
# (s), R_BUSY (% of the wall time the server's main thread was on its CPU), R_STOLEN (% of the
# wall time it was ready to run but another process had the CPU) and R_CAP (requests per second
# of server CPU: what the server sustains when it is the bottleneck, whatever the client does).
run_benchmark() {
  local n=$1 p=$2; shift 2
  local s0 s1 t0 t1 out
  s0=$(server_sched); t0=$(now_s)
  out=$("${CLIENT_PIN[@]}" redis-benchmark -p "$PORT" -c "$CLIENTS" -n "$n" -P "$p" -r "$KEYSPACE" --csv "$@" 2>/dev/null)
  t1=$(now_s); s1=$(server_sched)
  R_RPS=$(awk -F'","' 'NR == 2 { print $2 }' <<<"$out")
  [ -n "$R_RPS" ] || { echo "bench: redis-benchmark failed for: $*" >&2; echo "$out" >&2; exit 1; }
  read -r R_WALL R_BUSY R_STOLEN R_CAP < <(awk -v a="$s0" -v b="$s1" -v t0="$t0" -v t1="$t1" -v n="$n" 'BEGIN {
    split(a, x, " "); split(b, y, " "); wall = t1 - t0; run = (y[1] - x[1]) / 1e9; wait = (y[2] - x[2]) / 1e9
    printf "%.3f %.0f %.0f %.0f\n", wall, 100 * run / wall, 100 * wait / wall, (run > 0 ? n / run : 0) }')
}

# measure <requests> <pipeline> <cmdstat name> <algorithm|-> <command...>: CONFIG RESETSTAT,
# one redis-benchmark run, then INFO commandstats. On a shared machine another process may take
# the server's CPU during a run, which lowers ops/s and inflates usec_per_call (a command
# preempted midway is timed with the wait); a run where the server waited for its CPU more than
# MAX_STOLEN % of the time is repeated (pipelined runs), up to ATTEMPTS runs, and the least
# disturbed is kept.
# (A low "busy" figure alone is not a disturbance: it means the single client, not the server,
# was the bottleneck.) Sets M_RPS M_USEC M_BUSY M_STOLEN M_CAP M_RUNS and, for a module
# algorithm, M_CHECKS M_ADMITTED M_LIMITED (its INFO ratelimit counters over the kept run).
measure() {
  local n=$1 p=$2 stat=$3 algo=$4; shift 4
  local attempt c0=0 u0=0 l0=0 c1=0 u1=0 l1=0 calls usec
  M_STOLEN=101 M_RUNS=0 M_CHECKS=0 M_ADMITTED=0 M_LIMITED=0
  # Unpipelined, the server sleeps between requests and each wake-up on a CPU shared with other
  # processes counts as waiting: the stolen figure is not a disturbance signal there, one run.
  local attempts=$ATTEMPTS
  [ "$p" -gt 1 ] || attempts=1
  for attempt in $(seq "$attempts"); do
    [ "$algo" = - ] || read -r c0 u0 l0 < <(rl_counters "$algo")
    cli CONFIG RESETSTAT >/dev/null
    run_benchmark "$n" "$p" "$@"
    read -r calls usec < <(cmdstat "$stat")
    if [ "$calls" -lt "$n" ]; then
      echo "bench: '$*': commandstats saw $calls calls of $stat, expected $n" >&2; exit 1
    fi
    M_RUNS=$attempt
    if [ "$R_STOLEN" -lt "$M_STOLEN" ]; then
      M_RPS=$R_RPS M_USEC=$usec M_BUSY=$R_BUSY M_STOLEN=$R_STOLEN M_CAP=$R_CAP
      if [ "$algo" != - ]; then
        read -r c1 u1 l1 < <(rl_counters "$algo")
        M_CHECKS=$((c1 - c0)) M_ADMITTED=$((u1 - u0)) M_LIMITED=$((l1 - l0))
      fi
    fi
    [ "$R_STOLEN" -le "$MAX_STOLEN" ] && break
    [ "$attempt" -lt "$attempts" ] && log "  server waited for its CPU ${R_STOLEN}% of the run: repeating"
  done
  return 0
}
sched_cell() { # busy stolen runs -> "97% / 2%" or "97% / 12% (2 runs)"
  if [ "$3" -gt 1 ]; then echo "$1% / $2% ($3 runs)"; else echo "$1% / $2%"; fi
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
# fails loudly if any reply is an error.
pipe_in() {
  local what=$1; shift
  local res
  res=$(gen_resp "$@" | cli --pipe 2>&1) || true
  case "$(tail -1 <<<"$res")" in
    *"errors: 0,"*) ;;
    *) echo "bench: $what failed:" >&2; tail -5 <<<"$res" >&2; exit 1 ;;
  esac
}

REPORT_BODY="$WORK/report.md"
: >"$REPORT_BODY"
out() { printf '%s\n' "$*" | tee -a "$REPORT_BODY"; }

# ---------------------------------------------------------------------------------------------
# 1. Throughput and per-call cost
# ---------------------------------------------------------------------------------------------
# label | cmdstat name | module algorithm (for its counters; - for none) | command
CASES=(
  "INCR|incr|-|INCR key:__rand_int__"
  "SET k 1 EX 86400 (reference: a write that sets a TTL)|set|-|SET key:__rand_int__ 1 EX 86400"
  "RL.GCRA|rl.gcra|gcra|RL.GCRA key:__rand_int__ 1000 1d"
  "RL.TOKENBUCKET|rl.tokenbucket|tokenbucket|RL.TOKENBUCKET key:__rand_int__ 1000 1d"
  "RL.LEAKY|rl.leaky|leaky|RL.LEAKY key:__rand_int__ 1000 1d"
  "RL.SLIDING|rl.sliding|sliding|RL.SLIDING key:__rand_int__ 1000 1d"
  "RL.FIXED|rl.fixed|fixed|RL.FIXED key:__rand_int__ 1000 1d"
  "RL.SLIDINGLOG|rl.slidinglog|slidinglog|RL.SLIDINGLOG key:__rand_int__ 1000 1d"
  "CL.THROTTLE|cl.throttle|gcra|CL.THROTTLE key:__rand_int__ 999 1000 86400 1"
  "Lua token bucket (seed 000)|evalsha|-|EVALSHA $SHA_TB 1 key:__rand_int__ 1000 0.011574074074074073 - 1"
  "Lua sliding counter (seed 003)|evalsha|-|EVALSHA $SHA_SW 1 key:__rand_int__ 1000 86400000"
  "Lua sorted-set log (seed 002)|evalsha|-|EVALSHA $SHA_ZL 1 key:__rand_int__ - 86400000 1000"
)

declare -A RPS USEC CPU CAP LIMITED
for c in "${CASES[@]}"; do
  IFS='|' read -r label stat algo command <<<"$c"
  read -r -a argv <<<"$command"
  log "throughput: $label"
  cli FLUSHALL >/dev/null
  # Warm-up: one call on every key of the keyspace (the names __rand_int__ makes), so the
  # measured runs find every key in place.
  pipe_in "warming up $label" "$KEYSPACE" 1 "${command//__rand_int__/@}"
  for mode in pipelined unpipelined; do
    if [ "$mode" = pipelined ]; then n=$N_PIPE p=$PIPELINE; else n=$N_UNPIPE p=1; fi
    measure "$n" "$p" "$stat" "$algo" "${argv[@]}"
    RPS[$label,$mode]=$M_RPS USEC[$label,$mode]=$M_USEC CAP[$label,$mode]=$M_CAP
    CPU[$label,$mode]=$(sched_cell "$M_BUSY" "$M_STOLEN" "$M_RUNS")
    if [ "$algo" = - ]; then
      LIMITED[$label,$mode]="–"
    else
      LIMITED[$label,$mode]=$(calc "%.1f%%" "100 * $M_LIMITED / ($M_CHECKS > 0 ? $M_CHECKS : 1)")
    fi
  done
done

print_throughput() { # mode
  local mode=$1 base_rps=${RPS[INCR,$1]} base_usec=${USEC[INCR,$1]} base_cap=${CAP[INCR,$1]} label
  out ""
  if [ "$mode" = pipelined ]; then
    out "### Throughput and server cost per call, pipelined (-P $PIPELINE, -c $CLIENTS, -n $N_PIPE, -r $KEYSPACE)"
  else
    out "### Throughput and server cost per call, unpipelined (-P 1, -c $CLIENTS, -n $N_UNPIPE, -r $KEYSPACE)"
  fi
  out ""
  out "| command | ops/s | × INCR | ops per server CPU-second | × INCR | usec_per_call | × INCR | server busy / stolen | limited |"
  out "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for c in "${CASES[@]}"; do
    IFS='|' read -r label _ _ _ <<<"$c"
    out "| $label | $(calc "%.0f" "${RPS[$label,$mode]}") | $(ratio "${RPS[$label,$mode]}" "$base_rps") | ${CAP[$label,$mode]} | $(ratio "${CAP[$label,$mode]}" "$base_cap") | ${USEC[$label,$mode]} | $(ratio "${USEC[$label,$mode]}" "$base_usec") | ${CPU[$label,$mode]} | ${LIMITED[$label,$mode]} |"
  done
}

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
declare -A H_ADMIT_USEC H_ADMIT_PCT H_ADMIT_ENTRIES H_ADMIT_CPU H_REF_USEC H_REF_RPS H_REF_PCT H_REF_ENTRIES H_REF_CPU
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
  measure "$N_PIPE" "$PIPELINE" rl.slidinglog slidinglog EVALSHA "$SHA_STEP" 1 "$key" "$limit" "${limit}s" 1000000
  H_ADMIT_USEC[$limit]=$M_USEC H_ADMIT_CPU[$limit]=$(sched_cell "$M_BUSY" "$M_STOLEN" "$M_RUNS")
  H_ADMIT_PCT[$limit]=$(calc "%.1f%%" "100 * $M_ADMITTED / $M_CHECKS")
  H_ADMIT_ENTRIES[$limit]=$(log_entries "$key")
  # b) refused
  fill_log "$key" "$limit" 1m 1
  cli RL.DEBUG CLOCK REAL >/dev/null
  measure "$N_PIPE" "$PIPELINE" rl.slidinglog slidinglog RL.SLIDINGLOG "$key" "$limit" 1m
  H_REF_USEC[$limit]=$M_USEC H_REF_RPS[$limit]=$M_RPS H_REF_CPU[$limit]=$(sched_cell "$M_BUSY" "$M_STOLEN" "$M_RUNS")
  H_REF_PCT[$limit]=$(calc "%.1f%%" "100 * $M_LIMITED / $M_CHECKS")
  H_REF_ENTRIES[$limit]=$(log_entries "$key")
  cli DEL "$key" >/dev/null
done
cli RL.DEBUG CLOCK REAL >/dev/null

# ---------------------------------------------------------------------------------------------
# 3. Memory per key: used_memory before and after loading N keys (FLUSHALL between)
# ---------------------------------------------------------------------------------------------
# measure_memory <keys> <rounds> <template>: sets M_BYTES (used_memory delta per key)
measure_memory() {
  local keys=$1 rounds=$2 tpl=$3 before after
  cli FLUSHALL >/dev/null
  cli RL.DEBUG CLOCK SET "$(( $(date +%s) * 1000000 ))" >/dev/null
  sleep 0.2
  before=$(info_field memory used_memory)
  pipe_in "loading '$tpl'" "$keys" "$rounds" "$tpl"
  after=$(info_field memory used_memory)
  local dbsize
  dbsize=$(cli DBSIZE)
  M_BYTES=$(calc "%.1f" "($after - $before) / $keys")
  M_DBSIZE=$dbsize
  cli RL.DEBUG CLOCK REAL >/dev/null
}

MEM_CASES=(
  "SET k 1 EX 60 (baseline)|SET mem:@ 1 EX 60"
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
  echo "- Settings: BENCH_PORT=$PORT BENCH_N_PIPELINED=$N_PIPE BENCH_N_UNPIPELINED=$N_UNPIPE BENCH_CLIENTS=$CLIENTS BENCH_KEYSPACE=$KEYSPACE BENCH_MEM_KEYS=$MEM_KEYS BENCH_LOG_KEYS=\"${LOG_KEYS[*]}\""
  echo "- Server: \`redis-server --save \"\" --appendonly no --loadmodule libredis_ratelimit.so DEBUG_CLOCK\`${SERVER_PIN:+, pinned with \`${SERVER_PIN[*]}\`; redis-benchmark pinned with \`${CLIENT_PIN[*]}\`}"
  echo "- Date: $DATE; load average (1/5/15 min) at the start: $LOAD_START, at the end: $LOADAVG"
  if awk -v l="${LOAD_START%% *}" 'BEGIN { exit !(l > 0.5) }'; then
    echo "- **Note:** the machine was not idle when the run started (1-minute load average ${LOAD_START%% *}): other processes competed for the CPUs, so absolute numbers are low and ratios noisier than on an idle machine."
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

print_throughput pipelined
print_throughput unpipelined
out ""
out "ops/s: redis-benchmark's. Ops per server CPU-second: requests ÷ CPU time of the server's main thread during the run (Linux schedstat): the rate the server sustains when it is the bottleneck; on this 2-CPU machine one redis-benchmark cannot saturate the server with the cheap commands (see \"busy\"), so raw ops/s partly measure the client. usec_per_call: INFO commandstats after CONFIG RESETSTAT (Lua rows: cmdstat_evalsha, the whole script). Server busy / stolen: share of the run's wall time the server's main thread was on its CPU / was ready but waiting for a CPU another process held (a pipelined run with more than $MAX_STOLEN% stolen was repeated, up to $ATTEMPTS runs, keeping the least disturbed: \"(n runs)\"; unpipelined, the server sleeps between requests and every wake-up on a shared CPU counts as waiting, so there \"stolen\" is not a disturbance signal). Limited: share of calls refused (module counters). Every key of the keyspace was created by one unmeasured call of the same command first."

out ""
out "### RL.SLIDINGLOG at its limit, one key hammered (-P $PIPELINE, -c $CLIENTS, -n $N_PIPE)"
out ""
out "| limit | admit one, evict one: usec_per_call | × INCR | admitted | log entries | server busy / stolen | refused (log full): usec_per_call | × INCR | ops/s | refused | log entries | server busy / stolen |"
out "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
base_usec=${USEC[INCR,pipelined]}
for limit in "${HAMMER_LIMITS[@]}"; do
  out "| $limit | ${H_ADMIT_USEC[$limit]} | $(ratio "${H_ADMIT_USEC[$limit]}" "$base_usec") | ${H_ADMIT_PCT[$limit]} | ${H_ADMIT_ENTRIES[$limit]} | ${H_ADMIT_CPU[$limit]} | ${H_REF_USEC[$limit]} | $(ratio "${H_REF_USEC[$limit]}" "$base_usec") | $(calc "%.0f" "${H_REF_RPS[$limit]}") | ${H_REF_PCT[$limit]} | ${H_REF_ENTRIES[$limit]} | ${H_REF_CPU[$limit]} |"
done
out ""
out "Admit one, evict one: window = limit seconds, filled with limit entries one second apart (debug clock); each measured call is \`EVALSHA\` of a two-line helper that steps the debug clock by one second and calls \`RL.SLIDINGLOG key <limit> <limit>s\`, so every call evicts the oldest entry and admits one; the usec_per_call shown is RL.SLIDINGLOG's own line in commandstats (not the script's). Refused: limit entries 1 µs apart with a 1-minute window, then the clock back on the real clock and RL.SLIDINGLOG sent directly: every call finds the log full and computes retry_after. × INCR: against pipelined INCR's usec_per_call."

out ""
out "### Memory per key (used_memory delta / keys; FLUSHALL between rows)"
out ""
base_mem=${MEM["SET k 1 EX 60 (baseline)"]}
out "| value | keys | bytes/key | over the SET baseline |"
out "|---|---:|---:|---:|"
for c in "${MEM_CASES[@]}"; do
  IFS='|' read -r label _ <<<"$c"
  out "| $label | ${MEM_DB[$label]} | ${MEM[$label]} | $(calc "%+.1f" "${MEM[$label]} - $base_mem") |"
done
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

# Targets from the issue.
pass() { if awk "BEGIN { exit !($1) }"; then echo "yes"; else echo "**no**"; fi; }
out ""
out "### Targets"
out ""
out "| target | measured | met |"
out "|---|---|---|"
for label in RL.GCRA RL.TOKENBUCKET RL.FIXED RL.SLIDING RL.LEAKY CL.THROTTLE; do
  r=$(ratio "${USEC[$label,pipelined]}" "$base_usec")
  out "| $label usec_per_call ≤ 1.5× INCR | ${r}× | $(pass "$r <= 1.5") |"
done
r_max=0
for limit in "${HAMMER_LIMITS[@]}"; do
  for v in "${H_ADMIT_USEC[$limit]}" "${H_REF_USEC[$limit]}"; do
    r_max=$(awk -v a="$v" -v b="$base_usec" -v m="$r_max" 'BEGIN { r = a / b; printf "%.2f", (r > m ? r : m) }')
  done
done
r=$(ratio "${USEC[RL.SLIDINGLOG,pipelined]}" "$base_usec")
out "| RL.SLIDINGLOG usec_per_call ≤ 2× INCR (random keys) | ${r}× | $(pass "$r <= 2") |"
out "| RL.SLIDINGLOG ≤ 2× INCR at its limit, limits 10 … 100,000 (worst row) | ${r_max}× | $(pass "$r_max <= 2") |"
lo=${H_ADMIT_USEC[10]} hi=${H_ADMIT_USEC[100000]}
out "| RL.SLIDINGLOG flat from limit 10 to 100,000 (admit+evict, ±25%) | ${lo} → ${hi} usec | $(pass "$hi <= 1.25 * $lo && $hi >= 0.75 * $lo") |"
for label in RL.GCRA RL.TOKENBUCKET RL.LEAKY RL.SLIDING RL.FIXED RL.SLIDINGLOG CL.THROTTLE; do
  r=$(ratio "${RPS[$label,pipelined]}" "${RPS[INCR,pipelined]}")
  r2=$(ratio "${CAP[$label,pipelined]}" "${CAP[INCR,pipelined]}")
  out "| $label pipelined throughput ≥ 0.85× INCR (ops/s; ops per server CPU-s) | ${r}×; ${r2}× | $(pass "$r >= 0.85"); $(pass "$r2 >= 0.85") |"
done
for pair in "RL.TOKENBUCKET|Lua token bucket (seed 000)" "RL.GCRA|Lua token bucket (seed 000)" \
            "RL.SLIDING|Lua sliding counter (seed 003)" "RL.SLIDINGLOG|Lua sorted-set log (seed 002)"; do
  IFS='|' read -r a b <<<"$pair"
  r=$(ratio "${RPS[$a,pipelined]}" "${RPS[$b,pipelined]}")
  r2=$(ratio "${CAP[$a,pipelined]}" "${CAP[$b,pipelined]}")
  out "| $a pipelined throughput ≥ 5× $b (ops/s; ops per server CPU-s) | ${r}×; ${r2}× | $(pass "$r >= 5"); $(pass "$r2 >= 5") |"
done
for label in RL.GCRA RL.TOKENBUCKET RL.LEAKY RL.SLIDING RL.FIXED; do
  out "| $label memory ≤ 150 B/key | ${MEM[$label]} B/key | $(pass "${MEM[$label]} <= 150") |"
done
for label in RL.GCRA RL.TOKENBUCKET RL.LEAKY RL.SLIDING RL.FIXED; do
  over=$(calc "%.1f" "${MEM[$label]} - $base_mem")
  out "| $label value ≤ 150 B/key over a bare key with a TTL (lenient reading) | ${over} B/key | $(pass "$over <= 150") |"
done
slope=$(calc "%.2f" "(${LOGMEM[rl,1000]} - ${LOGMEM[rl,10]}) / 990")
const=$(calc "%.0f" "${LOGMEM[rl,10]} - 10 * $slope")
out "| RL.SLIDINGLOG memory ≤ 8 B per stored request + a constant | ${slope} B/entry + ${const} B/key (fit 10 → 1,000) | $(pass "$slope <= 8") |"

mkdir -p "$(dirname "$REPORT")"
cp "$REPORT_BODY" "$REPORT"
log "report written to $REPORT"
