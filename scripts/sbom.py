#!/usr/bin/env python3
"""The image's software bill of materials, CycloneDX 1.5 JSON, from what the image holds:
the crates compiled into the server (cargo's resolve for the release build's features and
this platform, normal dependencies only: build tools and dev-dependencies are not shipped)
and the Debian packages whose libraries scripts/image.sh copies (their dpkg entries, which
the image also carries under var/lib/dpkg/status.d/ for scanners).

Usage: scripts/sbom.py STAGE VERSION REVISION CREATED   (writes STAGE/app/sbom.cdx.json)
The output depends on its inputs only (no random serial, the commit's time), so two image
builds of one commit are the same bytes.
"""
import json
import os
import re
import subprocess
import sys
import urllib.parse
import uuid

stage, version, revision, created = sys.argv[1:5]
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
host = re.search(r"^host: (\S+)$", subprocess.run(["rustc", "-vV"], capture_output=True, text=True,
                                                   check=True).stdout, re.M).group(1)


def resolve(platform, feature):
    """cargo's resolve of the crate built for `platform` with `feature`."""
    return json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", platform,
         "--no-default-features", "--features", feature],
        cwd=root, capture_output=True, text=True, check=True).stdout)


checksums = {}
lock = open(os.path.join(root, "Cargo.lock")).read()
for block in lock.split("[[package]]"):
    fields = dict(re.findall(r'^(name|version|checksum) = "([^"]+)"$', block, re.M))
    if "checksum" in fields:
        checksums[(fields["name"], fields["version"])] = fields["checksum"]


def shipped(meta):
    """Every package reached from the root of `meta` by normal (not build, not dev)
    dependencies, less proc-macro crates (they run in the compiler, nothing of them ships)."""
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    macro = {p["id"] for p in meta["packages"] if all("proc-macro" in t["kind"] for t in p["targets"])}
    seen, todo = set(), [meta["resolve"]["root"]]
    while todo:
        node = nodes[todo.pop()]
        for dep in node["deps"]:
            if any(k["kind"] is None for k in dep["dep_kinds"]) and dep["pkg"] not in seen | macro:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    return seen


def crate(pkg):
    component = {"type": "library", "bom-ref": f"pkg:cargo/{pkg['name']}@{pkg['version']}",
                 "name": pkg["name"], "version": pkg["version"],
                 "purl": f"pkg:cargo/{pkg['name']}@{pkg['version']}"}
    if pkg.get("license"):
        component["licenses"] = [{"expression": pkg["license"]}]
    checksum = checksums.get((pkg["name"], pkg["version"]))
    if checksum:
        component["hashes"] = [{"alg": "SHA-256", "content": checksum}]
    return component


def os_release():
    """The build host's distribution (the packages' namespace) and release, for the purl."""
    try:
        fields = dict(re.findall(r'^([A-Z_]+)="?([^"\n]*)"?$', open("/etc/os-release").read(), re.M))
    except OSError:
        fields = {}
    return fields.get("ID", "debian"), fields.get("VERSION_ID", "")


def debian(path):
    """The Debian package behind a dpkg status entry the stage holds."""
    entry = dict(re.findall(r"^([A-Za-z-]+): (.*)$", open(path).read(), re.M))
    name, ver, arch = entry["Package"], entry["Version"], entry["Architecture"]
    distro, release = os_release()
    quoted = urllib.parse.quote(ver, safe="")
    purl = f"pkg:deb/{distro}/{name}@{quoted}?arch={arch}" + (f"&distro={distro}-{release}" if release else "")
    return {"type": "library", "bom-ref": purl, "name": name, "version": ver, "purl": purl}


# The server, and the dashboard's WebAssembly the site serves.
builds = [resolve(host, "ssr"), resolve("wasm32-unknown-unknown", "hydrate")]
packages = {p["id"]: p for meta in builds for p in meta["packages"]}
ids = set().union(*(shipped(meta) for meta in builds))
components = sorted((crate(packages[i]) for i in ids), key=lambda c: c["bom-ref"])
status_dir = os.path.join(stage, "var/lib/dpkg/status.d")
if os.path.isdir(status_dir):
    components += [debian(os.path.join(status_dir, f)) for f in sorted(os.listdir(status_dir))]
main = f"pkg:oci/spillway@{version}"
bom = {
    "bomFormat": "CycloneDX",
    "specVersion": "1.5",
    "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'spillway/{version}/{revision}')}",
    "version": 1,
    "metadata": {
        "timestamp": created,
        "component": {"type": "container", "bom-ref": main, "name": "spillway", "version": version,
                      "properties": [{"name": "org.opencontainers.image.revision", "value": revision}]},
    },
    "components": components,
    "dependencies": [{"ref": main, "dependsOn": [c["bom-ref"] for c in components]}],
}
out = os.path.join(stage, "app", "sbom.cdx.json")
with open(out, "w") as f:
    json.dump(bom, f, indent=1, sort_keys=True)
    f.write("\n")
print(f"sbom: {len(components)} components ({sum(c['purl'].startswith('pkg:deb') for c in components)} Debian packages)")
