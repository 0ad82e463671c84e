//! The `spillway` binary: read the configuration, connect to Redis, serve until a signal.

use anyhow::Context;
use spillway::{config::Config, server, state::AppState};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::from_env().context("reading the configuration")?;
    server::init_tracing(&config);
    let state = AppState::connect(config).await.context("connecting to Redis")?;
    let addr = state.leptos_options.site_addr;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    tracing::info!(%addr, "spillway listening on http://{addr}");
    server::run(listener, state, server::shutdown_signal()).await?;
    Ok(())
}
