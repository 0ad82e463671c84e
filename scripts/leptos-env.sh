#!/usr/bin/env bash
# Prints the site's settings of a Leptos.toml as `export LEPTOS_…=…` lines, as cargo-leptos
# exports them to the builds it runs (`site-root = "target/site"` becomes
# `export LEPTOS_SITE_ROOT=target/site`). Only `key = value` lines of its
# [package.metadata.leptos] table; a setting already in the environment is kept.
set -euo pipefail
awk '
  /^\[/ { inside = ($0 == "[package.metadata.leptos]"); next }
  inside && /^[a-z-]+ *= */ {
    key = $0; sub(/ *=.*/, "", key); value = $0; sub(/^[^=]*= */, "", value)
    sub(/ *#.*/, "", value); gsub(/"/, "", value)
    name = "LEPTOS_" toupper(key); gsub(/-/, "_", name)
    printf "export %s=\"${%s:-%s}\"\n", name, name, value
  }
' "${1:-Leptos.toml}"
