#!/usr/bin/env bash
# Prints the site's settings of a Leptos.toml as `export LEPTOS_…=…` lines, as cargo-leptos
# exports them to the builds it runs (`site-root = "target/site"` becomes
# `export LEPTOS_SITE_ROOT=target/site`). Only `key = value` lines of its
# [package.metadata.leptos] table. The release build takes them as they are: a LEPTOS_
# variable in the environment does not change what is built (the server still reads them).
set -euo pipefail
awk '
  /^\[/ { inside = ($0 == "[package.metadata.leptos]"); next }
  inside && /^[a-z-]+ *= */ {
    key = $0; sub(/ *=.*/, "", key); value = $0; sub(/^[^=]*= */, "", value)
    sub(/ *#.*/, "", value); gsub(/"/, "", value)
    name = "LEPTOS_" toupper(key); gsub(/-/, "_", name)
    printf "export %s=\"%s\"\n", name, value
  }
' "${1:-Leptos.toml}"
