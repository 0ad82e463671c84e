#!/usr/bin/env bash
# The release build (make build): the browser bundle and the server built side by side.
#
# cargo-leptos builds them one after the other when the assets' names are hashed, but they
# do not depend on each other (the server reads hash.txt when it starts). The bundle's last
# steps run on one core (link-time optimisation in one codegen unit, wasm-split,
# wasm-bindgen, wasm-opt, brotli at its highest level): side by side, the server's build
# takes the other core meanwhile. The two cargo builds have target directories of their
# own (target/front for the bundle), so neither waits on the other's lock. The bundle's
# output goes to target/front.log, shown when it fails.
#
# `scripts/build.sh --check`: whether a whole build is there (the binary, hash.txt and every
# file it names), so make builds again when something was deleted or overwritten (a
# `cargo leptos watch` writes the site with other names).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--check" ]; then
  [ -x target/release/spillway ] && [ -f target/release/hash.txt ] || exit 1
  while read -r kind hash; do
    kind=${kind%:}
    case "$kind" in
      js | wasm | css) [ -f "target/site/pkg/spillway.$hash.$kind" ] || exit 1 ;;
      manifest) [ -f "target/site/pkg/__wasm_split_manifest.$hash.json" ] || exit 1 ;;
      split) [ -f "target/site/pkg/__wasm_split.$hash.js" ] || exit 1 ;;
    esac
  done < target/release/hash.txt
  exit 0
fi

mkdir -p target
cargo leptos build --release --split --precompress --frontend-only > target/front.log 2>&1 &
front=$!
# A failed or interrupted build stops the other half too.
trap 'kill "$front" 2>/dev/null || true' EXIT
server_status=0
cargo leptos build --release --server-only || server_status=$?
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
