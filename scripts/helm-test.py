"""The Helm chart (deploy/helm/spillway), checked offline as `make test` does: `helm lint
--strict` and `helm template` (Helm 4 as a library, PyPI's helm-python-sdk) for the default
values and every documented values file (deploy/helm/values/*.yaml), each rendering
validated against Kubernetes' schemas, strict, for the oldest and newest Kubernetes the chart
supports (PyPI's kubernetes-validate; custom resources are only rendered). Also holds the
renderings to the product: every setting given is one Spillway reads (docs/settings.md), the
image is this version's, an HPA's Deployment sets no replicas, the kustomize base renders
the same pod; and values that cannot work are refused naming the value.

python scripts/helm-test.py <a folder for the renderings> <kustomize base rendering>
"""

import glob
import os
import re
import subprocess
import sys

import helm_python
import yaml
from helm_python import Chart

CHART = "deploy/helm/spillway"
KUBERNETES = ["1.27.0", "1.37.0"]
OUT, BASE = sys.argv[1], sys.argv[2]
PY = os.path.dirname(sys.executable)


def fail(message):
    print(f"helm-test: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def render(values, name="spillway"):
    with Chart.load(CHART) as chart:
        return chart.render(values, name=name, namespace="rate-limit", is_install=True)


def docs(rendered):
    for path, text in rendered.items():
        if path.endswith(".yaml"):
            for doc in yaml.safe_load_all(text):
                if doc:
                    yield doc


known = set(re.findall(r"^\| `([A-Z_]+)` \|", open("docs/settings.md").read(), re.M))
version = re.search(r'^appVersion: "([^"]+)"', open(f"{CHART}/Chart.yaml").read(), re.M).group(1)
cargo = re.search(r'^version = "([^"]+)"', open("Cargo.toml").read(), re.M).group(1)
if version != cargo:
    fail(f"the chart's appVersion {version} is not the crate's {cargo}")

files = [None] + sorted(glob.glob("deploy/helm/values/*.yaml"))
for values_file in files:
    label = values_file or "default values"
    values = helm_python.values_from_yaml(open(values_file).read()) if values_file else {}
    for kube in KUBERNETES:
        report = helm_python.lint(CHART, values, strict=True, kube_version=f"v{kube}")
        bad = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        if bad:
            fail(f"helm lint, {label}, Kubernetes {kube}: {bad}")
    rendered = render(values)
    out = os.path.join(OUT, "helm-" + os.path.basename(values_file or "default.yaml"))
    with open(out, "w") as f:
        for path, text in sorted(rendered.items()):
            if path.endswith(".yaml") and text.strip():
                f.write(f"---\n# {path}\n{text}\n")
    for kube in KUBERNETES:
        result = subprocess.run([f"{PY}/kubernetes-validate", "--strict", "--quiet", "--no-warn",
                                 "-k", kube, out], capture_output=True, text=True)
        if result.returncode != 0:
            fail(f"{label} is not valid Kubernetes {kube}:\n{result.stdout}{result.stderr}")
    kinds = {d["kind"] for d in docs(rendered)}
    for doc in docs(rendered):
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-config"):
            unknown = sorted(set(doc["data"]) - known)
            if unknown:
                fail(f"{label}: the chart sets what Spillway does not read: {unknown}")
        if doc["kind"] == "Deployment":
            spec = doc["spec"]
            container = spec["template"]["spec"]["containers"][0]
            if not (container["image"].endswith(":" + version) or "@sha256:" in container["image"]):
                fail(f"{label}: image {container['image']} is not {version}")
            if "HorizontalPodAutoscaler" in kinds and "replicas" in spec:
                fail(f"{label}: the Deployment sets replicas beside the HPA (each apply would undo its scaling)")
    print(f"helm-test: {label}: lint clean, renders {len(kinds)} kinds, valid for Kubernetes {' and '.join(KUBERNETES)}")

# The keys the chart makes: two of 48 characters, kept as a Secret that survives uninstall.
secret = next(d for d in docs(render({})) if d["kind"] == "Secret")
assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
for key in ["SPILLWAY_SERVICE_KEYS", "SPILLWAY_ADMIN_KEYS"]:
    import base64
    if len(base64.b64decode(secret["data"][key])) != 48:
        fail(f"the generated {key} is not 48 characters")

# The kustomize base and the chart's defaults run the same pod.
base = next(d for d in yaml.safe_load_all(open(BASE)) if d and d["kind"] == "Deployment")
chart = next(d for d in docs(render({})) if d["kind"] == "Deployment")
pick = lambda d: {k: d["spec"]["template"]["spec"]["containers"][0][k]
                  for k in ["ports", "resources", "securityContext", "livenessProbe", "readinessProbe", "startupProbe"]}
if pick(base) != pick(chart):
    fail(f"the kustomize base's container differs from the chart's:\n{pick(base)}\n{pick(chart)}")
if base["spec"]["template"]["spec"]["securityContext"] != chart["spec"]["template"]["spec"]["securityContext"]:
    fail("the kustomize base's pod securityContext differs from the chart's")

# Values that cannot work are refused, naming the value.
for values, named in [
    ({"redis": {"mode": "sentinels"}}, "redis.mode"),
    ({"redis": {"mode": "sentinel"}}, "redis.sentinel.addresses"),
    ({"redis": {"mode": "cluster"}}, "redis.cluster.nodes"),
    ({"domains": {"files": {"a.yaml": "domain: a"}}, "xds": {"server": "eg:18001"}}, "xds.server"),
]:
    try:
        render(values)
    except helm_python.HelmError as e:
        if named not in str(e):
            fail(f"{values} was refused without naming {named}: {e}")
    else:
        fail(f"{values} rendered; it cannot work")
print("helm-test: generated keys, the kustomize base's pod, refused values: ok")
