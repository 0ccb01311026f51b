# Postern — build, run and test.
#
#   make run    build and start an all-in-one cluster in ./.postern-data
#   make run-ha build and start etcd x3, auth x2, proxy x2, node x2 in ./.postern-ha
#               (both: PORT_BASE=N moves every port, see scripts/ports.sh)
#   make test   every test (race detector on), as CI runs it
#   make chaos  the full fault-injection test (root, ~5 minutes)
#   make package build/postern_VERSION_amd64.deb and .rpm (scripts/package)
#
GO        ?= go
BUILD_DIR ?= build
DATA_DIR  ?= $(CURDIR)/.postern-data
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/postern-dev/postern/lib/version.Version=$(VERSION)
# FUZZTIME bounds each fuzz target's run in `make fuzz` (and CI).
FUZZTIME  ?= 10s

BINARIES := postern psh pctl

.PHONY: all build run run-ha test test-go test-integration bench bench-report chaos fuzz lint clean web e2e package check-package

all: build

build: web
	@mkdir -p $(BUILD_DIR)
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BUILD_DIR)/ $(addprefix ./tool/,$(BINARIES))

# package writes $(BUILD_DIR)/postern_VERSION_amd64.deb and .rpm with
# scripts/package (nfpm as a library; VERSION from git describe, made into a
# package version there): stripped binaries with the web UI, the conffile
# /etc/postern/postern.yaml, postern.service and its drop-in examples, man
# pages and bash/zsh completions generated from the binaries, and the
# maintainer scripts. check-package checks them (scripts/check-package.sh;
# with CI=true it also installs, runs and purges the .deb: CI only).
PKG_BIN := $(BUILD_DIR)/package/bin
package: web
	@mkdir -p $(PKG_BIN)
	@rm -f $(BUILD_DIR)/postern_*_amd64.deb $(BUILD_DIR)/postern_*_amd64.rpm
	$(GO) build -ldflags "-s -w $(LDFLAGS)" -o $(PKG_BIN)/ $(addprefix ./tool/,$(BINARIES))
	$(GO) run ./scripts/package --version "$(VERSION)" --bin-dir $(PKG_BIN) --out $(BUILD_DIR) \
		--mtime "$$(git log -1 --format=%ct 2>/dev/null || date +%s)"

check-package:
	BUILD_DIR="$(BUILD_DIR)" ./scripts/check-package.sh

# run: ports PORT_BASE (default 3000: the daemon's defaults) +0 diagnostics,
# +21 peer, +22 node, +23 proxy SSH, +24 tunnel, +25 auth, +80 web. A busy
# port stops it with a message naming the port: `make run PORT_BASE=4000`.
PORT_BASE ?= 3000

run: build
	@DATA_DIR="$(DATA_DIR)" BUILD_DIR="$(BUILD_DIR)" PORT_BASE="$(PORT_BASE)" ./scripts/run.sh

# run-ha: several auth and proxy processes on one machine (scripts/run-ha.sh):
# a three-member etcd built from etcd's Go module, two auth, two proxies,
# two nodes (one in a network namespace with only a tunnel, when root).
# Ports PORT_BASE+100 to PORT_BASE+799 (the script lists them), clear of
# `make run`'s on the same base.
run-ha: build
	@HA_DIR="$(CURDIR)/.postern-ha" BUILD_DIR="$(BUILD_DIR)" GO="$(GO)" PORT_BASE="$(PORT_BASE)" ./scripts/run-ha.sh

# test runs the whole suite with the race detector. Integration tests drive
# real OpenSSH clients; .ci/run installs them. Some drive Debian's chromium
# through e2e/'s playwright-core against binaries with the web UI in them
# (psh login --auth web): both are built first.
test: web e2e/node_modules/.package-lock.json
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m ./...
	# Tests that skip under -race because they push hundreds of MiB
	# through byte loops the detector slows tenfold: run them plain.
	$(GO) test -count=1 -run 'TestWriterCapsAtTheDefault' ./lib/recording/
	$(MAKE) e2e

# bench runs every Go benchmark briefly: BENCHTIME (default 2x; each op of
# integration/bench moves 64 MiB through a real cluster). With
# BENCH_OPENSSH=1 it then runs bench/postern-vs-openssh.sh: the OpenSSH
# client through Postern's proxy vs through an OpenSSH sshd bastion, side by
# side with a direct connection and a bare x/crypto hop (bench/barehop) as
# the floors (setup time and hop CPU, 1 GB each way and hop CPU per GB, PSS
# per idle -J connection). That needs root (it creates a throwaway user),
# free ports 2201-2202 and ~10 minutes; RUNS, TP_RUNS, TP_SIZE, MEM_N and
# PROFILE=1 tune it (see the script).
# With BENCH_LOAD=1 it runs bench/load.sh: LOAD_N (500) concurrent idle
# `ssh -J` sessions through each of the two jump hosts, one at a time:
# setup p50/p99 and PSS per idle forwarded connection (root, ~5 minutes;
# LOAD_N, LOAD_RATE, LOAD_KEX tune it, see the script).
bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(or $(BENCHTIME),2x) -timeout 30m ./...
	@if [ "$(BENCH_OPENSSH)" = 1 ]; then BUILD_DIR="$(abspath $(BUILD_DIR))" ./bench/postern-vs-openssh.sh; fi
	@if [ "$(BENCH_LOAD)" = 1 ]; then BUILD_DIR="$(abspath $(BUILD_DIR))" ./bench/load.sh; fi

# chaos runs the full fault-injection test (integration TestChaosFull,
# docs/reliability.md): a three-member etcd, two auth servers sharing an
# S3 bucket, two proxies and a tunnel node in a network namespace, under
# load, through auth SIGKILL and SIGSTOP, proxy SIGKILL, an etcd member
# down, quorum lost, the etcd leader stopped and a rolling restart of
# everything; it prints the results table. Root (network namespaces),
# about five minutes. `make test` runs its short form, TestChaosShort.
chaos:
	POSTERN_CHAOS=1 $(GO) test -race -count=1 -v -run '^TestChaos' -timeout 30m ./integration/

# bench-report runs the side-by-side suite (direct, bare x/crypto hop
# bench/barehop, Postern, sshd bastion) REPORT_RUNS times (default 2) and
# writes docs/performance.md: medians with min-max over runs, ratios
# (postern/sshd, postern/direct, postern/bare) within each run, per-phase setup
# percentiles, date, machine, commit. Root, free ports 2201-2202, about 4
# minutes per run (bench/report.sh). bench/hold.sh is the scale run.
bench-report:
	BUILD_DIR="$(abspath $(BUILD_DIR))" ./bench/report.sh

# fuzz runs every fuzz target for FUZZTIME each.
fuzz:
	@./scripts/fuzz.sh $(FUZZTIME)

# lint: gofmt, go vet and staticcheck (pinned; `go run` fetches it through
# the module proxy once and caches it, so CI needs no install step).
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	@test -z "$$(gofmt -l lib tool integration 2>/dev/null)" || { gofmt -l lib tool integration; echo "gofmt needed"; exit 1; }
	@# The repository carries its own reference (docs/reference.md): no
	@# citing documents that are not in it.
	@! git grep -nE '(SPEC|DESIGN)(\.md)?\b[^_]' -- lib tool integration e2e docs web/src scripts fixtures README.md || { echo "cite docs/reference.md or docs/*.md instead"; exit 1; }
	$(GO) vet ./...
	$(STATICCHECK) ./...

clean:
	rm -rf $(BUILD_DIR)

# web builds the browser UI (web/, npm: @xterm/xterm, esbuild) into
# lib/web/ui/dist, which `go build` embeds. Without npm the binary serves a
# placeholder page instead of the UI, so this says so loudly.
web:
	@if command -v npm >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory web/node_modules/.package-lock.json && cd web && npm run --silent build; \
	else \
		echo "WARNING: npm not found: building without the web UI (lib/web serves a placeholder)" >&2; \
	fi

web/node_modules/.package-lock.json: web/package.json web/package-lock.json
	cd web && npm ci --no-audit --no-fund

e2e/node_modules/.package-lock.json: e2e/package.json e2e/package-lock.json
	cd e2e && npm ci --no-audit --no-fund

# e2e drives the web UI in Debian's chromium (CHROMIUM, default
# /usr/bin/chromium) through playwright-core against a real `postern start`
# on loopback ports; screenshots land in e2e/artifacts/. Ends with
# "N passed, N failed" and fails when any step failed. passkeys.mjs does
# the passkey steps against its own daemon, with Chromium's virtual
# authenticator; openssh.mjs a web terminal to Debian's sshd registered
# with `pctl nodes add-openssh` (run as root: sshd needs it).
e2e: build e2e/node_modules/.package-lock.json
	$(GO) build -o $(BUILD_DIR)/genrec ./e2e/genrec
	$(GO) build -o $(BUILD_DIR)/oidc-op ./fixtures/oidc-op
	POSTERN_BUILD_DIR=$(BUILD_DIR) node e2e/run.mjs
	POSTERN_BUILD_DIR=$(BUILD_DIR) node e2e/passkeys.mjs
	POSTERN_BUILD_DIR=$(BUILD_DIR) node e2e/requests.mjs
	POSTERN_BUILD_DIR=$(BUILD_DIR) node e2e/sessions.mjs
	POSTERN_BUILD_DIR=$(BUILD_DIR) node e2e/openssh.mjs
