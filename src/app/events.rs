//! Server-sent event streams the hydrated dashboard follows: the overview, and one
//! identifier in the inspector. A signed-in session is needed (the session middleware sends
//! anyone else to sign in), and it is checked again every few seconds, so signing out or
//! losing the role stops the stream.

use std::{convert::Infallible, time::Duration};

use axum::{
    Extension, Router,
    extract::{Query, State},
    response::sse::{Event, KeepAlive, Sse},
    routing::get,
};
use futures_util::stream::Stream;
use serde::Deserialize;

use crate::{
    auth::{keys::now_ms, session::CurrentSession},
    state::AppState,
};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/events/overview", get(overview_events))
        .route("/events/identifier", get(identifier_events))
}

/// Whether the session is still alive (re-read from Redis).
async fn still_signed_in(state: &AppState, digest: &str) -> bool {
    matches!(
        state
            .store
            .touch_session(digest, now_ms(), state.sessions.idle.as_millis() as u64)
            .await,
        Ok(Some(s)) if s.user.is_some()
    )
}

/// One event a second while the session lasts: `step` makes each from the state and what
/// the previous step kept (`seed` at first), and keeps something for the next. Ends when the
/// server drains, or when the session is gone (checked every 5 events).
fn ticks<S, T, F, Fut>(
    state: AppState,
    session: CurrentSession,
    seed: S,
    step: F,
) -> impl Stream<Item = Result<Event, Infallible>>
where
    S: Send + 'static,
    T: serde::Serialize,
    F: Fn(AppState, S) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = (T, S)> + Send,
{
    let digest = session.0.map(|s| s.digest).unwrap_or_default();
    futures_util::stream::unfold((0u64, seed), move |(n, kept)| {
        let state = state.clone();
        let digest = digest.clone();
        let fut = step(state.clone(), kept);
        async move {
            if n > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            // A stream never ends by itself: end it when shutting down, or the graceful
            // shutdown would wait for the browser to go away.
            if state.shutdown.is_draining() {
                return None;
            }
            if n % 5 == 0 && !still_signed_in(&state, &digest).await {
                return None;
            }
            let (data, kept) = fut.await;
            let event = Event::default()
                .json_data(&data)
                .unwrap_or_else(|_| Event::default().comment("unserializable"));
            Some((Ok(event), (n + 1, kept)))
        }
    })
}

/// The live overview: a first event with everything, then every second what changed (see
/// `OverviewDelta`), so an open page costs bytes only for busy policies.
async fn overview_events(
    State(state): State<AppState>,
    Extension(session): Extension<CurrentSession>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = ticks(
        state,
        session,
        None::<super::overview::OverviewData>,
        |state, last| async move {
            let data = super::overview::gather(&state).await;
            let delta = super::overview::OverviewDelta::between(last.as_ref(), &data);
            (delta, Some(data))
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

#[derive(Deserialize)]
struct IdentifierQuery {
    id: String,
}

async fn identifier_events(
    State(state): State<AppState>,
    Extension(session): Extension<CurrentSession>,
    Query(q): Query<IdentifierQuery>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let id = q.id;
    Sse::new(ticks(state, session, (), move |s, ()| {
        let id = id.clone();
        async move { (s.inspect_typed(&id).await, ()) }
    }))
    .keep_alive(KeepAlive::default())
}
