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
    auth::session::CurrentSession,
    net::connection::{MAX_LIVE_STREAMS, STREAMS_PER_USER, StreamSlot, StreamsFull},
    state::AppState,
};

/// The answer to one stream too many: 429 with a problem document that says what to do.
fn too_many_streams(full: StreamsFull) -> axum::response::Response {
    use axum::response::IntoResponse;
    let detail = match full {
        StreamsFull::User => format!(
            "you already follow {STREAMS_PER_USER} live pages on this server; close a tab of \
             the dashboard and reload"
        ),
        StreamsFull::Instance => format!(
            "this server already serves {MAX_LIVE_STREAMS} live pages; the page still works \
             without live updates (reload it to see new data)"
        ),
    };
    let problem = serde_json::json!({
        "type": "https://spillway.dev/problems/too-many-streams",
        "title": "Too many live streams",
        "status": 429,
        "detail": detail,
    });
    (
        axum::http::StatusCode::TOO_MANY_REQUESTS,
        [(axum::http::header::CONTENT_TYPE, "application/problem+json")],
        problem.to_string(),
    )
        .into_response()
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/events/overview", get(overview_events))
        .route("/events/identifier", get(identifier_events))
}

/// One event a second while the session lasts: `step` makes each from the state and what
/// the previous step kept (`seed` at first), and keeps something for the next. Ends when the
/// server drains, or when the session is gone (checked every 5 events).
fn ticks<S, T, F, Fut>(
    state: AppState,
    session: CurrentSession,
    slot: StreamSlot,
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
        // Held by the stream itself: dropped with it, whichever way it ends.
        let _slot = &slot;
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
            if n % 5 == 0
                && !state
                    .service()
                    .still_signed_in(&digest, state.sessions)
                    .await
            {
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
    Query(query): Query<OverviewQuery>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let view = query.view();
    let slot = match stream_slot(&state, &session) {
        Ok(slot) => slot,
        Err(full) => return too_many_streams(full),
    };
    let shared = format!("overview\u{0}{}\u{0}{}", view.filter, view.all);
    let stream = ticks(
        state,
        session,
        slot,
        None::<std::sync::Arc<super::overview::OverviewData>>,
        move |state, last| {
            let view = view.clone();
            let shared = shared.clone();
            async move {
                // One read a second for every stream of this view.
                let data = state
                    .live_reads
                    .clone()
                    .get(&shared, Duration::from_millis(900), async {
                        super::overview::gather(&state, &view).await
                    })
                    .await;
                let delta = super::overview::OverviewDelta::between(last.as_deref(), &data);
                (delta, Some(data))
            }
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A place for one more stream of this session's user, if they and the server have one
/// left.
fn stream_slot(state: &AppState, session: &CurrentSession) -> Result<StreamSlot, StreamsFull> {
    let user = session
        .0
        .as_ref()
        .and_then(|s| s.user().map(|(name, _)| name.to_string()))
        .unwrap_or_default();
    state.streams.take(&user)
}

/// The overview stream's view: the filter box and `all=1`, as on the page.
#[derive(Deserialize)]
struct OverviewQuery {
    #[serde(default)]
    filter: String,
    #[serde(default)]
    all: Option<String>,
}

impl OverviewQuery {
    fn view(&self) -> super::overview::View {
        super::overview::View {
            filter: self.filter.clone(),
            all: self.all.as_deref() == Some("1"),
        }
    }
}

#[derive(Deserialize)]
struct IdentifierQuery {
    id: String,
}

async fn identifier_events(
    State(state): State<AppState>,
    Extension(session): Extension<CurrentSession>,
    Query(q): Query<IdentifierQuery>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let slot = match stream_slot(&state, &session) {
        Ok(slot) => slot,
        Err(full) => return too_many_streams(full),
    };
    let id = q.id;
    Sse::new(ticks(state, session, slot, (), move |s, ()| {
        let id = id.clone();
        async move {
            let shared = format!("identifier\u{0}{id}");
            let read = s
                .live_reads
                .clone()
                .get(&shared, Duration::from_millis(900), async {
                    s.service().inspect_typed(&id).await
                })
                .await;
            (read, ())
        }
    }))
    .keep_alive(KeepAlive::default())
    .into_response()
}
