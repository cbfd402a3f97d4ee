# redis-ratelimit: build, run and test the Redis module.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

CARGO ?= cargo
MODULE := target/release/libredis_ratelimit.so
CLUSTER_BASE ?= 30001
TEST_THREADS ?= 4

.PHONY: all deps build run test examples cluster cluster-stop clean

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

cluster: build
	bash scripts/cluster.sh start $(CLUSTER_BASE) $(CURDIR)/$(MODULE)

cluster-stop:
	bash scripts/cluster.sh stop $(CLUSTER_BASE)

clean:
	$(CARGO) clean
