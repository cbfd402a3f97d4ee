#!/usr/bin/env bash
# The local path's cost per check, two ways, each case with governor's keyed limiter measured the
# same way in the same run (client/benches/ir.rs; the cold path: client/benches/cold.rs):
#   bash client/benches/ir.sh [case…]       instructions per check (callgrind): each case at N
#                                            and 2N checks, (Ir(2N) − Ir(N)) ÷ N, so the warm-up,
#                                            the server's start and the runtime cancel out
#   bash client/benches/ir.sh cpu [case…]    CPU time per check (CLOCK_PROCESS_CPUTIME_ID, not
#                                            wall time: other processes do not count), the
#                                            median of 5 runs of each case, natively
# Cases: engine_1 governor_1 limiter_1 engine_1000 governor_1000 limiter_1000 (default: all).
# N=$IR_N (default 100000).
# The driver cases run on a current-thread runtime (a background refill is sent only when a
# check waits, so one stays in flight); IR_MT=1: a multi-thread runtime with one worker, so
# refills complete as in a service.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=ir
if [ "${1:-}" = cpu ]; then MODE=cpu; shift; fi
N=${IR_N:-100000}
CASES=${*:-engine_1 governor_1 limiter_1 engine_1000 governor_1000 limiter_1000}
BIN=$(cargo bench -p redis-ratelimit-client --bench ir --no-run --message-format=json 2>/dev/null |
  jq -r 'select(.reason == "compiler-artifact" and .target.name == "ir") | .executable' | tail -1)
ir() { # case n -> total Ir of the process (every thread)
  local out; out=$(mktemp)
  IR_CASE=$1 IR_N=$2 valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file="$out" "$BIN" >/dev/null 2>"$out.err" ||
    { cat "$out.err" >&2; exit 1; }
  grep -h '^summary:' "$out"* | awk '{s += $2} END {printf "%.0f\n", s}'
  rm -f "$out" "$out".* "$out.err"
}
cpu() { # case n -> median ns per check of 5 runs
  for _ in 1 2 3 4 5; do
    IR_CASE=$1 IR_N=$2 "$BIN" 2>&1 >/dev/null | awk '/^cpu /{print $3}'
  done | sort -n | sed -n 3p
}
if [ $MODE = ir ]; then printf '| case | Ir per check |\n|---|---:|\n'; else printf '| case | CPU ns per check (median of 5) |\n|---|---:|\n'; fi
for c in $CASES; do
  n=$N
  if [ $MODE = ir ]; then
    a=$(ir "$c" "$n"); b=$(ir "$c" $((2 * n)))
    printf '| %s | %s |\n' "$c" $(((b - a) / n))
  else
    n=$((N * 20))
    printf '| %s | %s |\n' "$c" "$(cpu "$c" "$n")"
  fi
done
