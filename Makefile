# redis-ratelimit: build, run and test the Redis module.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

CARGO ?= cargo
MODULE := target/release/libredis_ratelimit.so
CLUSTER_BASE ?= 7001
TEST_THREADS ?= 4

.PHONY: all deps build run test examples burst cluster cluster-stop clean

all: build

deps:
	@bash scripts/deps.sh

build: deps
	$(CARGO) build --release

run: build
	exec redis-server redis.conf

test: build
	$(CARGO) test --release -- --test-threads=$(TEST_THREADS)
	bash scripts/examples.sh

examples: build
	bash scripts/examples.sh

# The effective-burst harness: worst count in any 60 s window per algorithm and trace.
burst: build
	$(CARGO) test --release --test effective_burst -- --ignored --nocapture print_table

cluster: build
	bash scripts/cluster.sh start $(CLUSTER_BASE) $(CURDIR)/$(MODULE)

cluster-stop:
	bash scripts/cluster.sh stop $(CLUSTER_BASE)

clean:
	$(CARGO) clean
