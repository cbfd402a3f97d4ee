#!/usr/bin/env bash
# Installs what the client examples need and runs their tests against the
# built module: examples/python (redis-py, unittest), examples/node (ioredis,
# node --test), examples/rust (redis + tokio, cargo test).
#
# usage: scripts/examples.sh [python] [node] [rust]     (default: all three)
#
# Environment:
#   RL_MODULE        module .so, relative to the repo root unless absolute
#                    (default target/release/libredis_ratelimit.so; built with
#                    `cargo build --release` when that default is missing)
#   RL_REDIS_SERVER  redis-server binary (default: redis-server on PATH)
#   PYTHON           python interpreter for the venv (default python3)
#
# Everything installed stays out of the source tree except node_modules:
#   target/examples-venv/        Python venv (pip install -r requirements.txt)
#   target/examples-rust/        CARGO_TARGET_DIR of the Rust example
#   examples/node/node_modules/  npm ci (git-ignored)
# Each install step is skipped when its lock/requirements file has not changed
# since the last successful install, so a second run only runs the tests.
#
# Exits non-zero if any example fails; the last line is the summary
# "examples: N passed, N failed".
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 2
if [ -f "${HOME:-/root}/.cargo/env" ]; then
  # shellcheck disable=SC1091
  . "${HOME:-/root}/.cargo/env"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 npm_config_fund=false npm_config_audit=false npm_config_update_notifier=false

say() { echo "examples: $*"; }

selected=("$@")
[ ${#selected[@]} -eq 0 ] && selected=(python node rust)
for e in "${selected[@]}"; do
  case "$e" in python | node | rust) ;; *) echo "usage: $0 [python] [node] [rust]" >&2; exit 2 ;; esac
done

# ---- the module and redis-server ------------------------------------------
module=${RL_MODULE:-target/release/libredis_ratelimit.so}
case "$module" in /*) ;; *) module=$root/$module ;; esac
if [ ! -f "$module" ] && [ -z "${RL_MODULE:-}" ]; then
  say "building the module (cargo build --release)"
  cargo build --release --locked || { say "0 passed, ${#selected[@]} failed"; exit 1; }
fi
if [ ! -f "$module" ]; then
  echo "examples: module not found at $module (run \`make build\` or set RL_MODULE)" >&2
  say "0 passed, ${#selected[@]} failed"
  exit 1
fi
RL_MODULE=$(cd "$(dirname "$module")" && pwd)/$(basename "$module")
export RL_MODULE
redis_bin=${RL_REDIS_SERVER:-redis-server}
if ! command -v "$redis_bin" >/dev/null 2>&1; then
  echo "examples: $redis_bin not found (run scripts/deps.sh, or apt-get install redis-server)" >&2
  say "0 passed, ${#selected[@]} failed"
  exit 1
fi
say "module $RL_MODULE, $("$redis_bin" --version | sed -n 's/.*\(v=[^ ]*\).*/redis-server \1/p')"

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "examples: $1 not found: $2" >&2; return 1; }
}
sha() { sha256sum "$@" | sha256sum | cut -c1-16; }

# ---- python ---------------------------------------------------------------
run_python() {
  local py=${PYTHON:-python3} venv=$root/target/examples-venv dir=$root/examples/python
  need "$py" "install python3 (3.10 or later)" || return 1
  if [ ! -x "$venv/bin/python" ]; then
    mkdir -p "$root/target"
    if ! "$py" -m venv "$venv" >/dev/null 2>&1; then
      rm -rf "$venv"
      # Debian ships venv/ensurepip separately (python3-venv, python3.X-venv).
      if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        local ver
        ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        say "installing python3-venv (apt-get)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$ver-venv" python3-venv >/dev/null
      fi
      "$py" -m venv "$venv" || { echo "examples: cannot create a venv: install python3-venv" >&2; return 1; }
    fi
  fi
  local stamp=$venv/.requirements.sha want
  want=$(sha "$dir/requirements.txt")
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "pip install -r examples/python/requirements.txt"
    "$venv/bin/python" -m pip install -q -r "$dir/requirements.txt" || return 1
    echo "$want" >"$stamp"
  fi
  (cd "$dir" && "$venv/bin/python" -m unittest -v test_service.py)
}

# ---- node -----------------------------------------------------------------
run_node() {
  local dir=$root/examples/node
  need node "install Node.js 18 or later" || return 1
  need npm "install npm" || return 1
  local stamp=$dir/node_modules/.examples-lock.sha want
  want=$(sha "$dir/package.json" "$dir/package-lock.json")
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "npm ci (examples/node)"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) || return 1
    echo "$want" >"$stamp"
  fi
  (cd "$dir" && npm test --silent)
}

# ---- rust -----------------------------------------------------------------
run_rust() {
  need cargo "install a Rust toolchain (rustup)" || return 1
  # Its own target dir under the main one: git-ignored, and kept between runs.
  (cd "$root/examples/rust" && CARGO_TARGET_DIR=$root/target/examples-rust cargo test --locked)
}

passed=0
failed=0
failures=()
timings=()
for e in "${selected[@]}"; do
  say "=== $e ==="
  t0=$SECONDS
  if "run_$e"; then
    passed=$((passed + 1))
    result=ok
  else
    failed=$((failed + 1))
    failures+=("$e")
    result=FAILED
  fi
  timings+=("$e $result $((SECONDS - t0))s")
done

say "$(IFS=,; echo "${timings[*]}" | sed 's/,/, /g')"
[ $failed -gt 0 ] && say "failed: ${failures[*]}"
say "$passed passed, $failed failed"
[ $failed -eq 0 ]
