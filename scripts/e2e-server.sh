#!/usr/bin/env bash
# Serves the release build for the browser tests: its own redis-server on a free port in a
# temporary directory, and Spillway on $E2E_PORT. Both stop when this script is stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${E2E_PORT:?E2E_PORT must be set}"

dir=$(mktemp -d)
redis_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$dir" --save '' --appendonly no \
  --logfile "$dir/redis.log" &
redis_pid=$!
cleanup() { kill "$app_pid" 2>/dev/null || true; kill "$redis_pid" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 0' TERM INT
for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done

export REDIS_URL="redis://127.0.0.1:$redis_port"
# The people the specs sign in as, and the service key they drive traffic with.
: "${E2E_PASSWORD:?E2E_PASSWORD must be set}"
: "${E2E_SERVICE_KEY:?E2E_SERVICE_KEY must be set}"
printf '%s\n' "$E2E_PASSWORD" | ./target/release/spillway user add e2e-admin --role admin --password-stdin
printf '%s\n' "$E2E_PASSWORD" | ./target/release/spillway user add e2e-support --role support --password-stdin
# gRPC on a free port too: a `make run` may hold the default 8081.
grpc_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# A Redis timeout that fits a shared machine (the 50 ms default once turned the first sign-in
# of a run into "Redis is unavailable"); no spec tests the timeout itself.
SPILLWAY_SERVICE_KEYS="$E2E_SERVICE_KEY" LEPTOS_SITE_ADDR="127.0.0.1:$E2E_PORT" SPILLWAY_HISTORY_FLUSH_MS=300 \
  SPILLWAY_GRPC_ADDR="127.0.0.1:$grpc_port" SPILLWAY_REDIS_TIMEOUT_MS=2000 \
  ./target/release/spillway &
app_pid=$!
wait "$app_pid"
