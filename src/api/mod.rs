//! Plain axum handlers for services and automation: health probes and the JSON API.

mod problem;

pub use problem::ApiError;

use axum::{Json, Router, extract::State, routing::get};
use serde_json::{Value, json};

use crate::state::AppState;

/// Routes served outside the dashboard.
pub fn router() -> Router<AppState> {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz))
}

/// Liveness: the process is up and serving. Never touches Redis.
async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness: Redis answers and runs Lua scripts.
async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let health = state.store.health().await.map_err(ApiError::RedisUnavailable)?;
    Ok(Json(json!({
        "status": "ready",
        "redis": { "server_time_us": health.server_time_us, "round_trip_us": health.round_trip_us },
    })))
}
