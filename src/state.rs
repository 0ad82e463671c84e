//! Shared application state, built once at startup and handed to every handler.

use axum::extract::FromRef;
use leptos::config::LeptosOptions;

use crate::{
    config::Config,
    store::{Keys, Store, StoreError},
};

/// What every handler and server function can reach.
#[derive(Clone)]
pub struct AppState {
    pub leptos_options: LeptosOptions,
    pub store: Store,
}

impl AppState {
    /// Connects to Redis as configured.
    pub async fn connect(config: Config) -> Result<Self, StoreError> {
        let store = if config.redis_cluster_urls.is_empty() {
            Store::connect(&config.redis_url, config.redis_timeout).await?
        } else {
            Store::connect_cluster(&config.redis_cluster_urls, config.redis_timeout, Keys::default()).await?
        };
        Ok(Self { leptos_options: config.leptos_options, store })
    }
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos_options.clone()
    }
}
