//! Spillway: a rate limiter service backed by Redis, with an admin dashboard.
//!
//! The crate builds twice: with `ssr` it is the server (axum, Redis, the JSON API and the
//! server-rendered dashboard); with `hydrate` it is the browser bundle that hydrates the
//! dashboard. `domain` is pure and compiles in both, so the browser shares the server's types
//! and algorithm models.

// Functions stay short (clippy.toml: 80 lines); a dashboard page whose body is one
// `view!` may be exempted by an `expect` of its own, counted by tests/it/architecture.rs.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// Leptos's typed views nest deeply; the dashboard's larger pages need more than 128.
#![recursion_limit = "256"]

pub mod app;
pub mod domain;

// The layers, the arrows pointing down only (tests/it/architecture.rs): domain ← config ←
// store ← service ← state ← auth ← front doors (api, envoy, app, cli, sources) ← server.
#[cfg(feature = "ssr")]
pub mod api;
#[cfg(feature = "ssr")]
pub mod auth;
#[cfg(feature = "ssr")]
pub mod cli;
#[cfg(feature = "ssr")]
pub mod config;
#[cfg(feature = "ssr")]
pub mod envoy;
#[cfg(feature = "ssr")]
pub mod server;
#[cfg(feature = "ssr")]
pub mod service;
#[cfg(feature = "ssr")]
pub mod sources;
#[cfg(feature = "ssr")]
pub mod state;
#[cfg(feature = "ssr")]
pub mod store;

// Leaves anyone may use: the network's edges, metrics and traces, small helpers.
#[cfg(feature = "ssr")]
pub mod net;
#[cfg(feature = "ssr")]
pub mod support;
#[cfg(feature = "ssr")]
pub mod telemetry;

/// Installs rustls's process-wide crypto provider (ring), which both `rediss://`
/// connections and the outgoing HTTP clients (webhooks, the demo) need; anything that builds
/// either calls it first. Installing twice is harmless. Without it an HTTP client panicked
/// with "No provider set" when nothing had connected to a single Redis before (a cluster,
/// the demo).
#[cfg(feature = "ssr")]
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Entry point of the browser bundle: attaches the dashboard to the server-rendered page.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_lazy(app::App);
}
