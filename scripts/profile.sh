#!/usr/bin/env bash
# Deterministic per-call cost of each command: instructions executed inside Redis's call() (the
# span usec_per_call times), counted by valgrind's callgrind, and where RL.GCRA's go. Unlike
# timings, instruction counts do not move with the machine's load, so this is the measure to
# compare before/after a change to src/ on a shared or noisy machine.
#
#   bash scripts/profile.sh            (~5-10 min: redis-server runs under valgrind)
#
# Environment: PROFILE_PORT [6391], RL_MODULE [target/release/libredis_ratelimit.so],
# PROFILE_KEYS [20000] (-r), PROFILE_N [20000] (measured calls per command),
# PROFILE_OUT [target/profile] (callgrind.out.* files and profile.md),
# PROFILE_LOG_LIMITS ["10 1000 100000"] (the sliding log at its limit; empty to skip),
# PROFILE_ONLY [all] (an extended regex: only the commands whose label matches, e.g. 'INCR|RL.GCRA$').
#
# For each command: FLUSHALL, one unmeasured call on every key (keys exist, as in the benchmark;
# a case's third field, when given, is the warm-up command instead), counters zeroed, PROFILE_N pipelined calls, counters dumped. Read a dump with
#   callgrind_annotate --inclusive=yes target/profile/callgrind.out.<pid>.<n>
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PORT=${PROFILE_PORT:-6391}
MODULE=${RL_MODULE:-target/release/libredis_ratelimit.so}
KEYS=${PROFILE_KEYS:-20000}
N=${PROFILE_N:-20000}
OUT=${PROFILE_OUT:-target/profile}

for tool in valgrind callgrind_control callgrind_annotate redis-server redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "profile: $tool not found (apt-get install valgrind)" >&2; exit 1; }
done
[ -f "$MODULE" ] || { echo "profile: module not found at $MODULE: run cargo build --release" >&2; exit 1; }
if redis-cli -p "$PORT" ping >/dev/null 2>&1; then
  echo "profile: port $PORT is busy; set PROFILE_PORT" >&2; exit 1
fi
STAMP=$(bash scripts/perf-doc.sh stamp)   # this checkout, as the run starts
mkdir -p "$OUT"
rm -f "$OUT"/callgrind.out.*
OUT=$(cd "$OUT" && pwd)
cp "$MODULE" "$OUT/module.so"   # symbols stay resolvable even if the module is rebuilt meanwhile

valgrind --tool=callgrind --toggle-collect=call --callgrind-out-file="$OUT/callgrind.out.%p" \
  redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$OUT" \
  --loadmodule "$OUT/module.so" DEBUG_CLOCK >"$OUT/valgrind.log" 2>&1 &
VPID=$!
cleanup() { kill "$VPID" 2>/dev/null || true; wait "$VPID" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 300); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.2; done
cli() { redis-cli -p "$PORT" "$@"; }
cli ping >/dev/null

SHA_TB=$(cli SCRIPT LOAD "$(cat scripts/lua/token_bucket.lua)")
SHA_SW=$(cli SCRIPT LOAD "$(cat scripts/lua/sliding_counter.lua)")
SHA_ZL=$(cli SCRIPT LOAD "$(cat scripts/lua/zset_log.lua)")
SHA_STEP=$(cli SCRIPT LOAD "$(cat scripts/lua/log_step.lua)")
read -r -a LOG_LIMITS <<<"${PROFILE_LOG_LIMITS-10 1000 100000}"

CASES=(
  "INCR|INCR key:__rand_int__"
  "SET k 1 EX 86400|SET key:__rand_int__ 1 EX 86400"
  "RL.GCRA|RL.GCRA key:__rand_int__ 1000 1d"
  "RL.GCRA DRYRUN|RL.GCRA key:__rand_int__ 1000 1d DRYRUN"
  "RL.TOKENBUCKET|RL.TOKENBUCKET key:__rand_int__ 1000 1d"
  "RL.LEAKY|RL.LEAKY key:__rand_int__ 1000 1d"
  "RL.GCRA 11/1h|RL.GCRA key:__rand_int__ 11 1h"
  "RL.LEAKY 23/1h|RL.LEAKY key:__rand_int__ 23 1h"
  "RL.GCRA 999999999999989/1d (compact)|RL.GCRA key:__rand_int__ 999999999999989 1d COST 10000000000000"
  "RL.SLIDING|RL.SLIDING key:__rand_int__ 1000 1d"
  "RL.FIXED|RL.FIXED key:__rand_int__ 1000 1d"
  "RL.SLIDINGLOG|RL.SLIDINGLOG key:__rand_int__ 1000 1d"
  "CL.THROTTLE|CL.THROTTLE key:__rand_int__ 999 1000 86400 1"
  "RL.MULTI (GCRA + FIXED)|RL.MULTI 2 key:__rand_int__ win:__rand_int__ GCRA 1000 1d FIXED 1000 1d"
  "RL.INFO|RL.INFO key:__rand_int__|RL.GCRA key:__rand_int__ 1000 1d"
  "RL.RETURN|RL.RETURN key:__rand_int__ 1|RL.GCRA key:__rand_int__ 1000 1d COST 1000"
  "Lua token bucket (seed 000)|EVALSHA $SHA_TB 1 key:__rand_int__ 1000 0.011574074074074073 - 1"
  "Lua sliding counter (seed 003)|EVALSHA $SHA_SW 1 key:__rand_int__ 1000 86400000"
  "Lua sorted-set log (seed 002)|EVALSHA $SHA_ZL 1 key:__rand_int__ - 86400000 1000"
)

if [ -n "${PROFILE_ONLY:-}" ]; then
  selected=()
  for c in "${CASES[@]}"; do [[ "${c%%|*}" =~ $PROFILE_ONLY ]] && selected+=("$c"); done
  CASES=("${selected[@]}")
fi
declare -A IR FILE
i=0
for c in "${CASES[@]}"; do
  IFS='|' read -r label command warmup <<<"$c"
  read -r -a argv <<<"$command"
  warm=("${argv[@]}")
  [ -n "$warmup" ] && read -r -a warm <<<"$warmup"
  [ "$label" = "RL.GCRA DRYRUN" ] && warm=("${argv[@]:0:4}")   # warm up with real (stored) calls
  echo "profile: $label" >&2
  cli FLUSHALL >/dev/null
  # Warm-up: one call on every key redis-benchmark's __rand_int__ can name, so the measured
  # calls find their keys in place (as in the server benchmark, benches/server).
  awk -v keys="$KEYS" -v tpl="${warm[*]}" 'BEGIN {
    n = split(tpl, a, " ")
    for (i = 0; i < keys; i++) {
      r = "*" n "\r\n"
      for (j = 1; j <= n; j++) { w = a[j]; sub(/__rand_int__/, sprintf("%012d", i), w); r = r "$" length(w) "\r\n" w "\r\n" }
      printf "%s", r
    } }' | cli --pipe >/dev/null 2>&1 || { echo "profile: warm-up of $label failed" >&2; exit 1; }
  callgrind_control -z "$VPID" >/dev/null 2>&1
  cli CONFIG RESETSTAT >/dev/null   # (its own call() is counted too: a few thousand Ir, negligible)
  redis-benchmark -p "$PORT" -c 50 -P 16 -n "$N" -r "$KEYS" -q "${argv[@]}" >/dev/null 2>&1
  i=$((i + 1))
  callgrind_control -d "case$i" "$VPID" >/dev/null 2>&1
  f=$(grep -l "^desc: Trigger: dump case$i\$" "$OUT"/callgrind.out.*.* | head -1)
  [ -n "$f" ] || { echo "profile: no callgrind dump for $label" >&2; exit 1; }
  FILE[$label]=$f
  total=$(callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
  IR[$label]=$((total / N))
done

# The sliding log at its limit: `limit` entries one second apart on the debug clock (window =
# limit seconds), then PROFILE_N/2 calls of scripts/lua/log_step.lua, each stepping the clock one
# second: every call evicts one entry and admits one. Counted: RL.SLIDINGLOG's command body.
declare -A LOG_IR
for limit in "${LOG_LIMITS[@]}"; do
  echo "profile: sliding log at its limit $limit" >&2
  cli FLUSHALL >/dev/null
  cli RL.DEBUG CLOCK SET "$(( $(date +%s) * 1000000 ))" >/dev/null
  awk -v n="$limit" -v sha="$SHA_STEP" 'BEGIN {
    for (i = 0; i < n; i++) printf "EVALSHA %s 1 hot %d %ds 1000000\r\n", sha, n, n }' |
    cli --pipe >/dev/null 2>&1 || { echo "profile: filling the log failed" >&2; exit 1; }
  callgrind_control -z "$VPID" >/dev/null 2>&1
  redis-benchmark -p "$PORT" -c 50 -P 16 -n $((N / 2)) -q EVALSHA "$SHA_STEP" 1 hot "$limit" "${limit}s" 1000000 >/dev/null 2>&1
  i=$((i + 1))
  callgrind_control -d "case$i" "$VPID" >/dev/null 2>&1
  f=$(grep -l "^desc: Trigger: dump case$i\$" "$OUT"/callgrind.out.*.* | head -1)
  ir=$(callgrind_annotate --inclusive=yes "$f" 2>/dev/null | awk '/=>/ { next } /commands::SLIDINGLOG::run([[:space:]]|$)/ && !done { gsub(",", "", $1); print $1; done = 1 }')
  LOG_IR[$limit]=$(( ${ir:-0} / (N / 2) ))
  cli RL.DEBUG CLOCK REAL >/dev/null
done

{
  echo "# make profile"
  echo ""
  echo "$STAMP"
  echo "- Module: $MODULE"
  echo "- Command: \`PROFILE_N=$N PROFILE_KEYS=$KEYS PROFILE_LOG_LIMITS=\"${LOG_LIMITS[*]}\"${PROFILE_ONLY:+ PROFILE_ONLY='$PROFILE_ONLY'} bash scripts/profile.sh\`; $(redis-server --version | awk '{ print $1, $2, $3 }')"
  echo ""
  echo "### Instructions per call inside call() (callgrind; $N pipelined calls over $KEYS warm keys)"
  echo ""
  echo "| command | Ir/call | × INCR |"
  echo "|---|---:|---:|"
  for c in "${CASES[@]}"; do
    IFS='|' read -r label _ <<<"$c"
    echo "| $label | ${IR[$label]} | $(awk -v a="${IR[$label]}" -v b="${IR[INCR]:-0}" 'BEGIN { if (b == 0) print "n/a"; else printf "%.2f", a / b }') |"
  done
  echo ""
  echo "### Where RL.GCRA's instructions go (inclusive Ir per call, selected functions)"
  echo ""
  echo "| function | Ir/call |"
  echo "|---|---:|"
  [ -n "${FILE[RL.GCRA]:-}" ] && callgrind_annotate --inclusive=yes "${FILE[RL.GCRA]}" 2>/dev/null |
    awk -v n="$N" '
      # (callgrind_annotate prints "file:function [object]" or, depending on the directory it
      # runs in, "file:function": match both)
      /=>/ { next }
      /:(RM_Replicate|lookupCommandByCString|moduleCreateArgvFromUserFormat|RM_OpenKey|RM_SetAbsExpire|RM_GetAbsExpire|RM_ReplyWithLongLong|RM_ReplyWithArray|RM_GetContextFlags|RM_CloseKey|RM_Milliseconds|RM_ModuleTypeSetValue)([[:space:]]|$)/ ||
      /redis_ratelimit::(commands::store|reply::named_integers|args::spec_and_options|commands::limiter)([[:space:]]|$)/ ||
      /redis_ratelimit_core::spec::Spec::check([[:space:]]|$)/ {
        ir = $1; gsub(",", "", ir); name = $0; sub(/^[^:]*:/, "", name); sub(/ \[.*/, "", name)
        if (!(name in seen)) { seen[name] = 1; printf "| %s | %d |\n", name, ir / n }
      }'
  if [ ${#LOG_LIMITS[@]} -gt 0 ]; then
    echo ""
    echo "### RL.SLIDINGLOG at its limit, admit one and evict one per call (its command body, Ir per call)"
    echo ""
    echo "| limit | Ir/call |"
    echo "|---:|---:|"
    for limit in "${LOG_LIMITS[@]}"; do echo "| $limit | ${LOG_IR[$limit]} |"; done
  fi
} | tee "$OUT/profile.md"
echo "profile: dumps and profile.md in $OUT" >&2
