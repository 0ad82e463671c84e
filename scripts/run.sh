#!/usr/bin/env bash
# Starts Spillway's release build for local use. When REDIS_URL is unset and nothing answers
# on 127.0.0.1:6379, starts a redis-server under .spillway/ with the append-only file on, so
# policies survive a restart.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${REDIS_URL:-}" ]; then
  if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    mkdir -p .spillway
    echo "run: starting redis-server on 127.0.0.1:6379 (data in .spillway/)"
    redis-server --bind 127.0.0.1 --port 6379 --daemonize yes \
      --dir "$PWD/.spillway" --appendonly yes \
      --pidfile "$PWD/.spillway/redis.pid" --logfile "$PWD/.spillway/redis.log"
    for _ in $(seq 50); do redis-cli -p 6379 ping >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  export REDIS_URL=redis://127.0.0.1:6379
fi
exec ./target/release/spillway "$@"
