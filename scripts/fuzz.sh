#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/fuzz_targets/*.rs) for FUZZ_SECONDS seconds each
# (default 10), with AddressSanitizer, debug assertions and overflow checks.
#
#   FUZZ_SECONDS=10   seconds per target
#   FUZZ_TARGETS="args codec algorithms"
#   FUZZ_JOBS=1       parallel fuzzing processes per target
#   RL_FUZZ_SKIP_KNOWN=1  do not stop on the known, reported bugs (fuzz past them)
#
# cargo fuzz needs nightly compiler flags (-Zsanitizer): on a stable toolchain they are allowed
# with RUSTC_BOOTSTRAP=1, which this script sets. The working corpus lives in fuzz/corpus/
# (not committed), seeded from fuzz/seeds/. A crash leaves its input in fuzz/artifacts/<target>/;
# once fixed, copy it to fuzz/regressions/<target>/ so tests/fuzz_props.rs replays it in CI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -f "${HOME:-/root}/.cargo/env" ]; then
  # shellcheck disable=SC1091
  . "${HOME:-/root}/.cargo/env"
fi

SECS=${FUZZ_SECONDS:-10}
TARGETS=${FUZZ_TARGETS:-"args codec algorithms"}
JOBS=${FUZZ_JOBS:-1}

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz from crates.io"
  cargo install cargo-fuzz --version 0.13.2 --locked
fi
export RUSTC_BOOTSTRAP=1

echo "fuzz: building targets ($(rustc --version))"
cargo fuzz build --debug-assertions

failed=()
for t in $TARGETS; do
  mkdir -p "fuzz/corpus/$t"
  extra=()
  if [ -f "fuzz/dict/$t.dict" ]; then
    extra+=("-dict=fuzz/dict/$t.dict")
  fi
  seeds=()
  if [ -d "fuzz/seeds/$t" ]; then
    seeds+=("fuzz/seeds/$t")
  fi
  echo "fuzz: $t for ${SECS}s"
  log="fuzz/corpus/$t.log"
  if cargo fuzz run --debug-assertions --jobs "$JOBS" "$t" "fuzz/corpus/$t" "${seeds[@]}" -- \
      -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${extra[@]}" >"$log" 2>&1; then
    runs=$(grep -Eo 'Done [0-9]+ runs' "$log" | tail -1 || true)
    echo "fuzz: $t ok (${runs:-see $log}, corpus $(ls "fuzz/corpus/$t" | wc -l) inputs)"
  else
    echo "fuzz: $t FAILED, see $log; inputs:" >&2
    ls "fuzz/artifacts/$t" >&2 || true
    grep -E -m3 "panicked at|ERROR: (libFuzzer|AddressSanitizer)" -A2 "$log" >&2 || tail -20 "$log" >&2
    failed+=("$t")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in: ${failed[*]} (replay with: cargo fuzz run <target> fuzz/artifacts/<target>/<file>)" >&2
  exit 1
fi
echo "fuzz: all targets ran ${SECS}s without a crash"
