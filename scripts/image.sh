#!/usr/bin/env bash
# Builds Spillway's OCI image from the release build (make build): stages the context in
# target/image/ and builds deploy/image/Containerfile with buildah (vfs storage, chroot
# isolation: works without a daemon or privileges beyond root), podman or docker.
# Usage: scripts/image.sh [tag]   (default spillway:<version>, also tagged spillway:latest)
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(awk -F'"' '/^version = / { print $2; exit }' Cargo.toml)
tag=${1:-localhost/spillway:$version}
stage=target/image
binary=target/release/spillway
eval "$(scripts/leptos-env.sh Leptos.toml)"
site=$LEPTOS_SITE_ROOT
[ -x "$binary" ] && [ -f target/release/hash.txt ] && [ -d "$site/$LEPTOS_SITE_PKG_DIR" ] \
  || { echo "image: no release build; run make build first" >&2; exit 1; }

rm -rf "$stage"
mkdir -p "$stage/app" "$stage/etc/ssl/certs"
cp "$binary" "$stage/app/spillway"
# Where Envoy Gateway and Istio's guide start envoyproxy/ratelimit's image (`command:
# /bin/ratelimit`): the same binary, so replacing the image is the whole change.
mkdir -p "$stage/bin"
ln -s /app/spillway "$stage/bin/ratelimit"
strip --strip-unneeded "$stage/app/spillway"
cp target/release/hash.txt "$stage/app/"
cp -r "$site" "$stage/app/site"
# The site's settings as the repository has them; the image's own site root and address
# are set in the Containerfile's environment, which overrides them.
cp Leptos.toml "$stage/app/Leptos.toml"
# The C libraries the binary links (glibc resolves names itself since 2.34: no NSS modules).
for lib in $(ldd "$binary" | awk '$2 == "=>" { print $3 } $1 ~ /^\/.*ld-linux/ { print $1 }'); do
  cp --parents -L "$lib" "$stage/"
done
# The system CA store, for rediss:// with a public CA.
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$stage/etc/ssl/certs/"
# The unprivileged user by name, for tools that show it.
printf 'root:x:0:0:root:/:/sbin/nologin\nspillway:x:65532:65532:spillway:/app:/sbin/nologin\n' > "$stage/etc/passwd"
printf 'root:x:0:\nspillway:x:65532:\n' > "$stage/etc/group"
chmod -R go-w "$stage"

if command -v buildah >/dev/null; then
  buildah --storage-driver vfs bud --isolation chroot --layers=false -q -f deploy/image/Containerfile \
    -t "$tag" -t localhost/spillway:latest "$stage" >/dev/null
  # awk reads the whole list: `head` would close the pipe early and, under pipefail, buildah's
  # SIGPIPE would fail the build (CI saw exit 141 once a second image of the tag was listed).
  size=$(buildah --storage-driver vfs images --format '{{.Size}}' "$tag" | awk 'NR == 1')
elif command -v podman >/dev/null; then
  podman build -q -f deploy/image/Containerfile -t "$tag" -t localhost/spillway:latest "$stage" >/dev/null
  size=$(podman image inspect --format '{{.Size}}' "$tag")
elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  docker build -q -f deploy/image/Containerfile -t "${tag#localhost/}" -t spillway:latest "$stage" >/dev/null
  size=$(docker image inspect --format '{{.Size}}' "${tag#localhost/}")
else
  echo "image: needs buildah, podman or docker (scripts/deps.sh image installs buildah)" >&2
  exit 1
fi
echo "image: built $tag ($size)"
