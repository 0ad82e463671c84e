#!/usr/bin/env bash
# Starts the image `make image` built, against a redis-server on a free port, as a container
# (buildah run, chroot isolation, the host's network; podman where buildah is absent) and
# checks: it runs as the unprivileged user, owns no file of its root filesystem, /readyz
# answers ready, one check is answered, the dashboard's assets are served, and SIGTERM stops it.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${1:-localhost/spillway:latest}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
fail() { echo "image-test: FAILED: $*" >&2; [ -f "$log" ] && tail -20 "$log" >&2; exit 1; }

work=$(mktemp -d)
log="$work/spillway.log"
redis_port=$(free_port); http_port=$(free_port); grpc_port=$(free_port)
service_key="spw_svc_image_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
admin_key="spw_adm_image_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --pidfile "$work/redis.pid" --logfile "$work/redis.log"
ctr=""; pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  [ -n "$ctr" ] && buildah --storage-driver vfs rm "$ctr" >/dev/null 2>&1 || true
  [ -f "$work/redis.pid" ] && kill "$(cat "$work/redis.pid")" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

envs=(REDIS_URL="redis://127.0.0.1:$redis_port" LEPTOS_SITE_ADDR="127.0.0.1:$http_port"
      SPILLWAY_GRPC_ADDR="127.0.0.1:$grpc_port" SPILLWAY_SERVICE_KEYS="$service_key"
      SPILLWAY_ADMIN_KEYS="$admin_key")
if command -v buildah >/dev/null; then
  ctr=$(buildah --storage-driver vfs from "$image")
  # No file of the image belongs to the user it runs as: the root filesystem is not its to write.
  root=$(buildah --storage-driver vfs mount "$ctr")
  owned=$(find "$root" -uid 65532 -o -perm -o+w ! -type l | awk 'NR <= 5')
  [ -z "$owned" ] || fail "files the server's user could write: $owned"
  [ ! -e "$root/bin/sh" ] || fail "the image has a shell"
  [ "$(readlink "$root/bin/ratelimit")" = /app/spillway ] \
    || fail "no /bin/ratelimit, where Envoy Gateway and Istio's guide start upstream's image"
  # What a registry and a scanner read: the SBOM, glibc's dpkg entry, the OCI labels.
  grep -q '"purl": "pkg:cargo/tokio@' "$root/app/sbom.cdx.json" || fail "no SBOM listing the server's crates at /app/sbom.cdx.json"
  grep -q '"purl": "pkg:deb/[a-z]*/libc6@' "$root/app/sbom.cdx.json" || fail "the SBOM does not list glibc"
  grep -q '^Package: libc6$' "$root/var/lib/dpkg/status.d/libc6" || fail "no dpkg entry for the glibc the image holds"
  buildah --storage-driver vfs umount "$ctr" >/dev/null
  labels=$(buildah --storage-driver vfs inspect --type image "$image" | python3 -c \
    'import json, sys; print("\n".join(json.load(sys.stdin)["OCIv1"]["config"].get("Labels", {})))')
  for label in title version revision created licenses; do
    grep -qx "org.opencontainers.image.$label" <<<"$labels" || fail "no org.opencontainers.image.$label label"
  done
  env_args=(); for e in "${envs[@]}"; do env_args+=(--env "$e"); done
  buildah --storage-driver vfs run --isolation chroot --network host "${env_args[@]}" "$ctr" -- /app/spillway >"$log" 2>&1 &
  pid=$!
elif command -v podman >/dev/null; then
  env_args=(); for e in "${envs[@]}"; do env_args+=(--env "$e"); done
  podman run --rm --read-only --network host "${env_args[@]}" "$image" >"$log" 2>&1 &
  pid=$!
else
  fail "needs buildah or podman"
fi

ready=""
for _ in $(seq 300); do
  if curl -fsS "http://127.0.0.1:$http_port/readyz" >/dev/null 2>&1; then ready=yes; break; fi
  kill -0 "$pid" 2>/dev/null || fail "the container exited"
  sleep 0.1
done
[ -n "$ready" ] || fail "/readyz never answered ready"

# The server runs as the image's unprivileged user.
server=$(pgrep -f -n "^/app/spillway" || true)
[ -n "$server" ] || fail "no /app/spillway process"
uid=$(awk '/^Uid:/ { print $2 }' "/proc/$server/status")
[ "$uid" = 65532 ] || fail "runs as uid $uid, not 65532"

answer=$(curl -sS -w '\n%{http_code}' -H "Authorization: Bearer $service_key" -H 'Content-Type: application/json' \
  -d '{"policy":"demo","identifiers":{"ip":"203.0.113.7","user":"42"}}' "http://127.0.0.1:$http_port/api/v1/check")
[ "$(tail -1 <<<"$answer")" = 200 ] || fail "check answered: $answer"
grep -q '"allowed":true' <<<"$answer" || fail "check answered: $answer"
# The dashboard's hashed assets are in the image.
page=$(curl -fsS "http://127.0.0.1:$http_port/login") || fail "the sign-in page did not load"
asset=$(grep -o '/pkg/spillway[^"]*\.js' <<<"$page" | awk 'NR == 1')
[ -n "$asset" ] || fail "the sign-in page names no script"
curl -fsS -o /dev/null "http://127.0.0.1:$http_port$asset" || fail "$asset is not served"

kill -TERM "$server"
for _ in $(seq 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
! kill -0 "$server" 2>/dev/null || fail "SIGTERM did not stop it within 10 s"
pid=""

# Reproducible: the same inputs build the same image, to the digest.
digest() { buildah --storage-driver vfs inspect --type image "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["FromImageDigest"])'; }
if command -v buildah >/dev/null; then
  first=$(digest "$image")
  scripts/image.sh >/dev/null
  second=$(digest "$image")
  [ "$first" = "$second" ] || fail "two builds of the same commit differ: $first, then $second"
  reproducible=", built twice: $second"
fi
echo "image-test: ok ($image: ready, uid 65532, a check answered 200, $asset served, stopped on SIGTERM; labels, SBOM, dpkg entries${reproducible:-})"
