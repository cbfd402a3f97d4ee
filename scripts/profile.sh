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
# PROFILE_OUT [target/profile] (callgrind.out.* files and profile.md).
#
# For each command: FLUSHALL, one unmeasured call on every key (keys exist, as in the benchmark),
# counters zeroed, PROFILE_N pipelined calls, counters dumped. Read a dump with
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
mkdir -p "$OUT"
rm -f "$OUT"/callgrind.out.*
OUT=$(cd "$OUT" && pwd)
cp "$MODULE" "$OUT/module.so"   # symbols stay resolvable even if the module is rebuilt meanwhile

valgrind --tool=callgrind --toggle-collect=call --callgrind-out-file="$OUT/callgrind.out.%p" \
  redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$OUT" \
  --loadmodule "$OUT/module.so" >"$OUT/valgrind.log" 2>&1 &
VPID=$!
cleanup() { kill "$VPID" 2>/dev/null || true; wait "$VPID" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 300); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.2; done
cli() { redis-cli -p "$PORT" "$@"; }
cli ping >/dev/null

SHA_TB=$(cli SCRIPT LOAD "$(cat scripts/lua/token_bucket.lua)")
SHA_SW=$(cli SCRIPT LOAD "$(cat scripts/lua/sliding_counter.lua)")
SHA_ZL=$(cli SCRIPT LOAD "$(cat scripts/lua/zset_log.lua)")

CASES=(
  "INCR|INCR key:__rand_int__"
  "SET k 1 EX 86400|SET key:__rand_int__ 1 EX 86400"
  "RL.GCRA|RL.GCRA key:__rand_int__ 1000 1d"
  "RL.GCRA DRYRUN|RL.GCRA key:__rand_int__ 1000 1d DRYRUN"
  "RL.TOKENBUCKET|RL.TOKENBUCKET key:__rand_int__ 1000 1d"
  "RL.LEAKY|RL.LEAKY key:__rand_int__ 1000 1d"
  "RL.SLIDING|RL.SLIDING key:__rand_int__ 1000 1d"
  "RL.FIXED|RL.FIXED key:__rand_int__ 1000 1d"
  "RL.SLIDINGLOG|RL.SLIDINGLOG key:__rand_int__ 1000 1d"
  "CL.THROTTLE|CL.THROTTLE key:__rand_int__ 999 1000 86400 1"
  "Lua token bucket (seed 000)|EVALSHA $SHA_TB 1 key:__rand_int__ 1000 0.011574074074074073 - 1"
  "Lua sliding counter (seed 003)|EVALSHA $SHA_SW 1 key:__rand_int__ 1000 86400000"
  "Lua sorted-set log (seed 002)|EVALSHA $SHA_ZL 1 key:__rand_int__ - 86400000 1000"
)

declare -A IR FILE
i=0
for c in "${CASES[@]}"; do
  IFS='|' read -r label command <<<"$c"
  read -r -a argv <<<"$command"
  warm=("${argv[@]}")
  [ "$label" = "RL.GCRA DRYRUN" ] && warm=("${argv[@]:0:4}")   # warm up with real (stored) calls
  echo "profile: $label" >&2
  cli FLUSHALL >/dev/null
  # Warm-up: one call on every key redis-benchmark's __rand_int__ can name, so the measured
  # calls find their keys in place (as in scripts/bench.sh).
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
  f=$(ls -t "$OUT"/callgrind.out.*.* | head -1)
  FILE[$label]=$f
  total=$(callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
  IR[$label]=$((total / N))
done

{
  echo "### Instructions per call inside call() (callgrind; $N pipelined calls over $KEYS warm keys)"
  echo ""
  echo "| command | Ir/call | × INCR |"
  echo "|---|---:|---:|"
  for c in "${CASES[@]}"; do
    IFS='|' read -r label _ <<<"$c"
    echo "| $label | ${IR[$label]} | $(awk -v a="${IR[$label]}" -v b="${IR[INCR]}" 'BEGIN { printf "%.2f", a / b }') |"
  done
  echo ""
  echo "### Where RL.GCRA's instructions go (inclusive Ir per call, selected functions)"
  echo ""
  echo "| function | Ir/call |"
  echo "|---|---:|"
  callgrind_annotate --inclusive=yes "${FILE[RL.GCRA]}" 2>/dev/null |
    awk -v n="$N" '
      /=>/ { next }
      /:(RM_Replicate|lookupCommandByCString|moduleCreateArgvFromUserFormat|RM_OpenKey|RM_SetAbsExpire|RM_ReplyWithLongLong|RM_ReplyWithArray|RM_GetContextFlags|RM_CloseKey|RM_Milliseconds|RM_ModuleTypeSetValue)[[:space:]]/ ||
      /redis_ratelimit::(commands::store|reply::named_integers|core::spec::Spec::check|args::spec_and_options|commands::limiter) \[/ {
        ir = $1; gsub(",", "", ir); name = $0; sub(/^[^:]*:/, "", name); sub(/ \[.*/, "", name)
        if (!(name in seen)) { seen[name] = 1; printf "| %s | %d |\n", name, ir / n }
      }'
} | tee "$OUT/profile.md"
echo "profile: dumps and profile.md in $OUT" >&2
