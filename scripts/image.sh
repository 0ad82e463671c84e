#!/usr/bin/env bash
# Builds Spillway's OCI image from the release build (make build): stages the context in
# target/image/ and builds deploy/image/Containerfile with buildah (vfs storage, chroot
# isolation: works without a daemon or privileges beyond root), podman or docker.
# Usage: scripts/image.sh [tag]   (default: scripts/image-ref.py's, also tagged localhost/spillway:latest)
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(awk -F'"' '/^version = / { print $2; exit }' Cargo.toml)
# The reference every manifest runs (deploy/image/repository, at this version).
tag=${1:-$(scripts/image-ref.py)}
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
# The C libraries the binary links (glibc resolves names itself since 2.34: no NSS modules),
# and, as distroless images do, the dpkg entry and copyright of each Debian package they come
# from, so a scanner (Trivy, Grype) sees which glibc the image holds.
mkdir -p "$stage/var/lib/dpkg/status.d"
for lib in $(ldd "$binary" | awk '$2 == "=>" { print $3 } $1 ~ /^\/.*ld-linux/ { print $1 }'); do
  cp --parents -L "$lib" "$stage/"
  # dpkg knows a library by one of its paths (/lib or /usr/lib, with merged /usr).
  if command -v dpkg >/dev/null && { pkg=$(dpkg -S "$lib" 2>/dev/null) \
      || pkg=$(dpkg -S "/usr$lib" 2>/dev/null) || pkg=$(dpkg -S "$(realpath "$lib")" 2>/dev/null); }; then
    pkg=${pkg%%:*}
    dpkg-query -s "$pkg" | grep -v '^Status:' > "$stage/var/lib/dpkg/status.d/$pkg"
    [ -f "/usr/share/doc/$pkg/copyright" ] \
      && mkdir -p "$stage/usr/share/doc/$pkg" && cp "/usr/share/doc/$pkg/copyright" "$stage/usr/share/doc/$pkg/"
  fi
done
# The system CA store, for rediss:// with a public CA.
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$stage/etc/ssl/certs/"
# The unprivileged user by name, for tools that show it.
printf 'root:x:0:0:root:/:/sbin/nologin\nspillway:x:65532:65532:spillway:/app:/sbin/nologin\n' > "$stage/etc/passwd"
printf 'root:x:0:\nspillway:x:65532:\n' > "$stage/etc/group"
# What the image is, for its labels and SBOM: the commit and its time, so that two builds of
# one commit are the same image (the same digest: scripts/image-test.sh builds twice).
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# A build of uncommitted changes says so.
git diff --quiet HEAD 2>/dev/null || revision="$revision-dirty"
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
sbom=$(scripts/sbom.py "$stage" "$version" "$revision" "$created")
chmod -R go-w "$stage"
find "$stage" -exec touch -h -d "@$epoch" {} +
labels=(--label "org.opencontainers.image.title=spillway"
        --label "org.opencontainers.image.description=$(awk -F'"' '/^description = / { print $2; exit }' Cargo.toml)"
        --label "org.opencontainers.image.version=$version"
        --label "org.opencontainers.image.revision=$revision"
        --label "org.opencontainers.image.created=$created"
        --label "org.opencontainers.image.licenses=$(awk -F'"' '/^license = / { print $2; exit }' Cargo.toml)"
        --label "org.opencontainers.image.ref.name=$tag")

if command -v buildah >/dev/null; then
  buildah --storage-driver vfs bud --isolation chroot --layers=false -q -f deploy/image/Containerfile \
    --timestamp "$epoch" "${labels[@]}" -t "$tag" -t localhost/spillway:latest "$stage" >/dev/null
  # awk reads the whole list: `head` would close the pipe early and, under pipefail, buildah's
  # SIGPIPE would fail the build (CI saw exit 141 once a second image of the tag was listed).
  size=$(buildah --storage-driver vfs images --format '{{.Size}}' "$tag" | awk 'NR == 1')
  id=$(buildah --storage-driver vfs inspect --type image --format '{{.FromImageID}}' "$tag")
elif command -v podman >/dev/null; then
  podman build -q -f deploy/image/Containerfile --timestamp "$epoch" "${labels[@]}" \
    -t "$tag" -t localhost/spillway:latest "$stage" >/dev/null
  size=$(podman image inspect --format '{{.Size}}' "$tag")
  id=$(podman image inspect --format '{{.Id}}' "$tag")
elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  SOURCE_DATE_EPOCH=$epoch docker build -q -f deploy/image/Containerfile "${labels[@]}" \
    -t "${tag#localhost/}" -t spillway:latest "$stage" >/dev/null
  size=$(docker image inspect --format '{{.Size}}' "${tag#localhost/}")
  id=$(docker image inspect --format '{{.Id}}' "${tag#localhost/}")
else
  echo "image: needs buildah, podman or docker (scripts/deps.sh image installs buildah)" >&2
  exit 1
fi
echo "image: built $tag ($size, $id; $sbom)"
