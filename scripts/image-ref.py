#!/usr/bin/env python3
"""The image every manifest runs, set in one place: deploy/image/repository names the
repository (the tag is always this version, Cargo.toml's). `make image` tags the build with it,
`make push` pushes it, and the manifests name it.

  scripts/image-ref.py                 prints the reference (repository:version)
  scripts/image-ref.py set REPOSITORY  makes REPOSITORY the one every manifest names
  scripts/image-ref.py check           fails when a manifest names another (make test-deploy)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = "deploy/image/repository"
# Where a manifest names the image: (file, pattern whose group 1 is the repository).
PLACES = [
    ("deploy/kubernetes/base/kustomization.yaml", r"^    newName: (\S+)$"),
    ("deploy/helm/spillway/values.yaml", r"^  repository: (\S+)$"),
    ("deploy/kubernetes/overlays/envoy-gateway/envoy-gateway-config.yaml", r"^ +image: (\S+?):[^:\s]+$"),
    ("deploy/kubernetes/overlays/envoy-gateway/gateway-helm-values.yaml", r"^ +image: (\S+?):[^:\s]+$"),
]
# Where a manifest names the tag: it is the version.
TAGS = [
    ("deploy/kubernetes/base/kustomization.yaml", r"^    newTag: (\S+)$"),
    ("deploy/kubernetes/overlays/envoy-gateway/envoy-gateway-config.yaml", r"^ +image: \S+?:([^:\s]+)$"),
    ("deploy/kubernetes/overlays/envoy-gateway/gateway-helm-values.yaml", r"^ +image: \S+?:([^:\s]+)$"),
    ("deploy/helm/spillway/Chart.yaml", r'^appVersion: "([^"]+)"$'),
]


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def version():
    return re.search(r'^version = "([^"]+)"', read("Cargo.toml"), re.M).group(1)


def repository():
    return read(SOURCE).strip()


def found(path, pattern):
    match = re.search(pattern, read(path), re.M)
    if not match:
        sys.exit(f"image-ref: {path} names no image where expected ({pattern})")
    return match


def check():
    want, tag = repository(), version()
    wrong = [f"{path} names {found(path, p).group(1)}, not {want}" for path, p in PLACES
             if found(path, p).group(1) != want]
    wrong += [f"{path} tags {found(path, p).group(1)}, not {tag}" for path, p in TAGS
              if found(path, p).group(1) != tag]
    if wrong:
        sys.exit("image-ref: the manifests disagree with " + SOURCE + " (scripts/image-ref.py set "
                 + want + "):\n  " + "\n  ".join(wrong))
    print(f"image-ref: every manifest runs {want}:{tag}")


def set_repository(repo):
    if not re.fullmatch(r"[a-z0-9]+([._/:-][a-z0-9]+)*", repo) or "@" in repo:
        sys.exit(f"image-ref: {repo!r} is not a repository (registry/path/name, no tag: the tag is the version)")
    # Every file's new text first: a manifest that names no image stops it before any is written.
    texts = {}
    for path, pattern in PLACES:
        text = texts.get(path, read(path))
        match = re.search(pattern, text, re.M)
        if not match:
            sys.exit(f"image-ref: {path} names no image where expected ({pattern}); nothing changed")
        texts[path] = text[:match.start(1)] + repo + text[match.end(1):]
    for path, text in texts.items():
        with open(os.path.join(ROOT, path), "w") as f:
            f.write(text)
    with open(os.path.join(ROOT, SOURCE), "w") as f:
        f.write(repo + "\n")
    check()


if __name__ == "__main__":
    match sys.argv[1:]:
        case []:
            print(f"{repository()}:{version()}")
        case ["check"]:
            check()
        case ["set", repo]:
            set_repository(repo)
        case _:
            sys.exit(__doc__)
