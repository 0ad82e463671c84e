# Spillway: `make run` to try it, `make test` to check it. Every target installs what it
# needs first (scripts/deps.sh), and installs nothing that is already there.

SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: demo deps-run run build lint test test-unit test-e2e test-image test-deploy image push deps-image deps-build deps-test deps-bench bench profile clean help

help:
	@echo "make run    build the release binary and serve on http://127.0.0.1:3000"
	@echo "make test   unit, integration (real redis-server) and browser tests"
	@echo "make lint   rustfmt check, clippy (warnings denied) for the server and the browser build"
	@echo "make build  release build only"
	@echo "make demo   synthetic traffic against the demo policy of a running make run"
	@echo "make bench  benchmarks against redis-benchmark and the node rate limiters"
	@echo "make image  the OCI image (buildah, podman or docker) of the release build"
	@echo "make push   the image to the registry deploy/image/repository names"

deps-build:
	@scripts/deps.sh build

deps-run:
	@scripts/deps.sh run

deps-test:
	@scripts/deps.sh test

# The release build, made again only when what goes into it changed (make test and make
# image both need it; the bundle's wasm-bindgen, wasm-opt and brotli steps take about a
# minute). It installs the bundle's tools itself, beside the server's build (scripts/build.sh). A missing binary or site is built again too.
# The directories are inputs too: a deleted file changes its directory's time. The stamp
# takes the time the build started, so a file saved during the build is built next time.
BUILD_INPUTS := $(shell find src style public lua 2>/dev/null) Cargo.toml Cargo.lock build.rs \
  Leptos.toml .cargo/config.toml scripts/build.sh scripts/leptos-env.sh scripts/deps.sh scripts/site.mjs \
  tools/site/package.json tools/site/package-lock.json \
  $(shell find tools/bundle/src 2>/dev/null) tools/bundle/Cargo.toml tools/bundle/Cargo.lock
BUILT := target/release/.built

build:
	@scripts/build.sh --check || rm -f $(BUILT)
	@$(MAKE) --no-print-directory $(BUILT)

$(BUILT): $(BUILD_INPUTS)
	@mkdir -p $(@D)
	@touch $@.new
	scripts/build.sh
	@mv $@.new $@

run: deps-run build
	@scripts/run.sh

# Formatting, and clippy with warnings denied for both builds of the crate: the server
# (with its tests, benches and examples) and the browser bundle.
lint: deps-build
	cargo fmt --check
	cargo clippy --features ssr --all-targets -- -D warnings
	cargo clippy --features hydrate --target wasm32-unknown-unknown --lib -- -D warnings
	cargo clippy -p spillway-client --all-targets -- -D warnings
	cargo fmt --check --manifest-path tools/bundle/Cargo.toml
	cargo clippy --manifest-path tools/bundle/Cargo.toml -- -D warnings

# Unit tests and the integration-test binary; the integration tests start their own
# redis-server processes on free ports.
test-unit: deps-test
	cargo test --features ssr
	cargo test -p spillway-client

# Browser tests against the release build (where a bad wasm-opt would break hydration),
# each spec run hydrated and with JavaScript off.
test-e2e: deps-test build
	cd end2end && E2E_PORT=$$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])') \
	  npx playwright test

# The image of the release build, started as a container against a Redis (scripts/image-test.sh).
deps-image:
	@scripts/deps.sh image

image: deps-image build
	@scripts/image.sh

test-image: image
	@scripts/image-test.sh

# Pushes the image to the registry deploy/image/repository names (scripts/image-ref.py set
# REPOSITORY changes it in every manifest); log in first (buildah login REGISTRY).
push: image
	@ref=$$(scripts/image-ref.py); \
	if command -v buildah >/dev/null; then buildah --storage-driver vfs push "$$ref" "docker://$$ref"; \
	elif command -v podman >/dev/null; then podman push "$$ref"; \
	else docker push "$${ref#localhost/}"; fi && echo "pushed $$ref"

# The Kubernetes manifests: every overlay rendered and validated against Kubernetes' schemas.
test-deploy: deps-test
	@scripts/deploy-test.sh

test: test-unit test-e2e test-image test-deploy

# Synthetic traffic against the demo policy of a running `make run` (another terminal).
demo: deps-run build
	@set -a; [ -f .spillway/keys.env ] && . .spillway/keys.env; set +a; ./target/release/spillway demo

deps-bench:
	@scripts/deps.sh bench

# A CPU profile of the 1-rule HTTP check and the gRPC check under load: builds the release
# binary with the sampling profiler into target/profile/ (then the release binary again, as
# make build leaves it) and writes benches/PROFILE.md. Takes about 8 minutes.
profile: deps-bench build
	cargo build --release --example grpcload --no-default-features --features ssr
	cargo build --release --bin spillway --no-default-features --features profile
	mkdir -p target/profile && cp target/release/spillway target/profile/spillway
	cargo build --release --bin spillway --no-default-features --features ssr
	BENCH_SECONDS=$${BENCH_SECONDS:-15} python3 benches/profile.py

# Side-by-side benchmarks (release build, peers from npm, redis-benchmark); writes
# bench-results/REPORT.md and benches/REPORT.md. Takes about 8 minutes (the first time 2
# more, to build the open-loop load generator).
bench: deps-bench build
	cargo build --release --example openloop --example grpcload --example replay --no-default-features --features ssr
	python3 benches/run.py

clean:
	cargo clean
	rm -rf end2end/test-results end2end/playwright-report
