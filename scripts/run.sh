#!/usr/bin/env bash
# Starts Spillway's release build for local use. When no Redis is configured (REDIS_URL,
# REDIS_SENTINELS, REDIS_CLUSTER_URLS) and nothing answers
# on 127.0.0.1:6379, starts a redis-server under .spillway/ with the append-only file on, so
# policies survive a restart.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${REDIS_URL:-}${REDIS_SENTINELS:-}${REDIS_CLUSTER_URLS:-}" ]; then
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

# API keys: generated on the first run, kept in .spillway/keys.env (mode 600), shown once.
if [ -z "${SPILLWAY_SERVICE_KEYS:-}${SPILLWAY_ADMIN_KEYS:-}" ]; then
  mkdir -p .spillway
  if [ ! -f .spillway/keys.env ]; then
    key() { printf '%s_%s' "$1" "$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')"; }
    service=$(key spw_svc); admin=$(key spw_adm)
    (umask 077; printf 'SPILLWAY_SERVICE_KEYS=%s\nSPILLWAY_ADMIN_KEYS=%s\n' "$service" "$admin" > .spillway/keys.env)
    cat <<MSG
run: created API keys (shown this once; kept in .spillway/keys.env):
  service key (check endpoints): $service
  admin key   (everything):      $admin
try:
  curl -s -H "Authorization: Bearer $service" -H 'Content-Type: application/json' \\
    -d '{"policy":"demo","identifiers":{"ip":"203.0.113.7","user":"42"}}' http://127.0.0.1:3000/api/v1/check
MSG
  else
    echo "run: API keys are in .spillway/keys.env"
  fi
  set -a; . .spillway/keys.env; set +a
fi
exec ./target/release/spillway "$@"
