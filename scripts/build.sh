#!/usr/bin/env bash
# The release build (make build): the browser bundle and the server built side by side.
#
# They do not depend on each other (the server reads hash.txt when it starts). The bundle's
# last steps run on one core (link-time optimisation in one codegen unit, then
# scripts/site.mjs: wasm-split, wasm-bindgen, wasm-opt, brotli at its highest level): side
# by side, the server's build takes the other core meanwhile. cargo-leptos is not used: it
# would be built first, about 6 minutes on 2 cores (`cargo leptos watch` still works for
# development, where it is installed). The two cargo builds have target directories of their
# own (target/front for the bundle), so neither waits on the other's lock. The bundle's
# output goes to target/front.log, shown when it fails.
#
# `scripts/build.sh --check`: whether a whole build is there (the binary, hash.txt and every
# file it names), so make builds again when something was deleted or overwritten (a
# `cargo leptos watch` writes the site with other names).
set -euo pipefail
cd "$(dirname "$0")/.."

# The site's settings as Leptos.toml says them, each key as its LEPTOS_ variable.
eval "$(scripts/leptos-env.sh Leptos.toml)"
pkg="$LEPTOS_SITE_ROOT/$LEPTOS_SITE_PKG_DIR"
if [ "${1:-}" = "--check" ]; then
  [ -x target/release/spillway ] && [ -f target/release/hash.txt ] || exit 1
  while read -r kind hash; do
    kind=${kind%:}
    case "$kind" in
      js | wasm | css) [ -f "$pkg/$LEPTOS_OUTPUT_NAME.$hash.$kind" ] || exit 1 ;;
      manifest) [ -f "$pkg/__wasm_split_manifest.$hash.json" ] || exit 1 ;;
      split) [ -f "$pkg/__wasm_split.$hash.js" ] || exit 1 ;;
    esac
  done < target/release/hash.txt
  exit 0
fi

mkdir -p target
# What cargo-leptos gives both builds (Leptos reads some of it when compiling), and what
# tells scripts/site.mjs where to write: the site's settings exported above from Leptos.toml
# (each key as its LEPTOS_ variable), and how cargo-leptos lays out a release build.
unset LEPTOS_ENV # a setting of the running server, which neither build reads
export LEPTOS_LIB_DIR=. LEPTOS_BIN_DIR=. LEPTOS_JS_MINIFY=true LEPTOS_HASH_FILE_NAME=hash.txt
# The bundle: the wasm linked with its relocations (the splitter needs them), in the
# size-optimised profile, then scripts/site.mjs makes the site from it.
# Its tools are installed first when missing (scripts/deps.sh build: tools/bundle, the npm
# tools): on a first run they build while the server does. It runs at the lowest priority
# (nice 19): the server's build is the longer chain (its own crate, 4 minutes mostly on one
# core, waits for every dependency), so the bundle takes the cores the server leaves idle.
# From a fresh clone the first build took 17m00s at the same priority, 15m18s at nice 19
# (the bundle then finished 3.5 minutes after the server); at nice 10 the server alone took
# 13m24s. On a faster day, on a new machine, the first `make run` served after 11m07s.
# What can stop it early is checked here, where it can be seen (and where apt may ask for a
# password): the wasm32 target, node, the tool's wasm-bindgen against Cargo.lock's.
scripts/deps.sh prepare
echo "build: the browser bundle builds beside the server; its output is in target/front.log"
# In a process group of its own (set -m), so that a failed or interrupted build stops all of
# it: cargo, node and the tools' installs, not only the subshell.
set -m
(
  renice -n 19 -p "$BASHPID" > /dev/null
  scripts/deps.sh build
  RUSTFLAGS="--cfg erase_components -Clink-args=--emit-relocs" \
    cargo build --lib --target wasm32-unknown-unknown --profile wasm-release \
    --no-default-features --features hydrate --target-dir target/front
  node scripts/site.mjs target/front/wasm32-unknown-unknown/wasm-release/spillway.wasm
) > target/front.log 2>&1 &
front=$!
set +m
trap 'kill -- -"$front" 2>/dev/null || true' EXIT
server_status=0
cargo build --release --bin spillway --no-default-features --features ssr || server_status=$?
if [ "$server_status" -ne 0 ]; then
  echo "build: the server failed (exit $server_status)" >&2
  df -h . >&2
  exit 1
fi
front_status=0
wait "$front" || front_status=$?
trap - EXIT
if [ "$front_status" -ne 0 ]; then
  cat target/front.log >&2
  echo "build: the browser bundle failed (exit $front_status); its output is above" >&2
  df -h . >&2
  exit 1
fi
tail -n 3 target/front.log
