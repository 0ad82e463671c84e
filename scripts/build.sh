#!/usr/bin/env bash
# The release build (make build): the browser bundle and the server built side by side.
#
# cargo-leptos builds them one after the other when the assets' names are hashed, but they
# do not depend on each other (the server reads hash.txt when it starts). The bundle's last
# steps run on one core (link-time optimisation in one codegen unit, wasm-split,
# wasm-bindgen, wasm-opt, brotli at its highest level): side by side, the server's build
# takes the other core meanwhile. The two cargo builds have target directories of their
# own (target/front for the bundle), so neither waits on the other's lock.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo leptos build --release --split --precompress --frontend-only &
front=$!
server_status=0
cargo leptos build --release --server-only || server_status=$?
front_status=0
wait "$front" || front_status=$?
if [ "$front_status" -ne 0 ] || [ "$server_status" -ne 0 ]; then
  echo "build failed (browser bundle: exit $front_status, server: exit $server_status); free disk space:" >&2
  df -h . >&2
  exit 1
fi
