#!/usr/bin/env bash
# Memory of RL.SLIDINGLOG's logs, by entries per key and by the time between requests: the
# method of the server benchmark's "memory of the logs" rows (INFO used_memory before and after
# loading N keys, FLUSHALL between), extended to 10,000 entries and to wider gaps.
#
#   bash scripts/log_memory.sh        (~1 min)
#
# Environment: LOG_MEM_PORT [6393], RL_MODULE [target/release/libredis_ratelimit.so],
# LOG_MEM_SIZES ["10 100 1000 10000"] entries per key, LOG_MEM_KEYS ["20000 2000 200 20"] keys
# per size, LOG_MEM_GAPS ["1 1000000"] µs between a key's requests (RL.DEBUG CLOCK ADVANCE
# between rounds, as the benchmark does with 1), LOG_MEM_WINDOW [1d] (each key's window:
# RL.SLIDINGLOG log:<n> 100000 <window>; it must cover size × gap for every entry to stay).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PORT=${LOG_MEM_PORT:-6393}
MODULE=${RL_MODULE:-target/release/libredis_ratelimit.so}
read -r -a SIZES <<<"${LOG_MEM_SIZES:-10 100 1000 10000}"
read -r -a KEYS <<<"${LOG_MEM_KEYS:-20000 2000 200 20}"
read -r -a GAPS <<<"${LOG_MEM_GAPS:-1 1000000}"
WINDOW=${LOG_MEM_WINDOW:-1d}
[ -f "$MODULE" ] || { echo "log_memory: module not found at $MODULE: run cargo build --release" >&2; exit 1; }
if redis-cli -p "$PORT" ping >/dev/null 2>&1; then
  echo "log_memory: port $PORT is busy; set LOG_MEM_PORT" >&2; exit 1
fi
DIR=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" \
  --loadmodule "$(realpath "$MODULE")" DEBUG_CLOCK >"$DIR/redis.log" 2>&1 &
PID=$!
cleanup() { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -rf "$DIR"; }
trap cleanup EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
cli() { redis-cli -p "$PORT" "$@"; }
used_memory() { cli INFO memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }'; }

echo "| gap | entries/key | keys | bytes/key | marginal bytes/entry (from ${SIZES[0]}) | MEMORY USAGE of one key |"
echo "|---:|---:|---:|---:|---:|---:|"
for gap in "${GAPS[@]}"; do
  first=
  for i in "${!SIZES[@]}"; do
    size=${SIZES[$i]} keys=${KEYS[$i]}
    cli FLUSHALL >/dev/null
    cli RL.DEBUG CLOCK SET "$(( $(date +%s) * 1000000 ))" >/dev/null
    sleep 0.2
    before=$(used_memory)
    # size rounds of one call per key, the debug clock stepped by the gap between rounds
    res=$(awk -v keys="$keys" -v rounds="$size" -v gap="$gap" -v win="$WINDOW" 'BEGIN {
      for (j = 0; j < rounds; j++) {
        for (i = 0; i < keys; i++) {
          k = sprintf("log:%012d", i)
          printf "*4\r\n$13\r\nRL.SLIDINGLOG\r\n$%d\r\n%s\r\n$6\r\n100000\r\n$%d\r\n%s\r\n", length(k), k, length(win), win
        }
        printf "*4\r\n$8\r\nRL.DEBUG\r\n$5\r\nCLOCK\r\n$7\r\nADVANCE\r\n$%d\r\n%s\r\n", length(gap), gap
      } }' | cli --pipe 2>&1)
    case "$(tail -1 <<<"$res")" in *"errors: 0,"*) ;; *) echo "log_memory: loading failed: $res" >&2; exit 1 ;; esac
    after=$(used_memory)
    [ "$(cli RL.INFO log:000000000000 | grep -A1 -x entries | tail -1)" = "$size" ] ||
      { echo "log_memory: a key does not hold $size entries" >&2; exit 1; }
    per_key=$(awk -v a="$after" -v b="$before" -v k="$keys" 'BEGIN { printf "%.1f", (a - b) / k }')
    [ -n "$first" ] || first=$per_key
    marginal=$(awk -v p="$per_key" -v f="$first" -v n="$size" -v n0="${SIZES[0]}" 'BEGIN { if (n == n0) print "–"; else printf "%.2f", (p - f) / (n - n0) }')
    echo "| ${gap} µs | $size | $keys | $per_key | $marginal | $(cli MEMORY USAGE log:000000000000) |"
  done
  cli RL.DEBUG CLOCK REAL >/dev/null
done
