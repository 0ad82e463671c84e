//! The overview page. For now it shows Redis's status, read on the server through a server
//! function, with a "Check again" control that works both hydrated (client-side navigation,
//! no reload) and with JavaScript off (a plain GET form).

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::{components::Form, hooks::use_query_map};
use serde::{Deserialize, Serialize};

/// Redis as the server sees it at one moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisReport {
    /// Whether Redis answered the health script.
    pub up: bool,
    /// Redis server clock, milliseconds since the epoch, when it answered.
    pub server_time_ms: Option<i64>,
    /// Round trip of the health script, microseconds.
    pub round_trip_us: Option<u64>,
}

/// Reads Redis's status on the server by running the health script.
#[server(prefix = "/fn", endpoint = "redis_status")]
pub async fn redis_status() -> Result<RedisReport, ServerFnError> {
    crate::auth::guard::require(crate::domain::people::Action::View)?;
    let store = expect_context::<crate::store::Store>();
    Ok(match store.health().await {
        Ok(h) => RedisReport {
            up: true,
            server_time_ms: Some(h.server_time_us / 1000),
            round_trip_us: Some(h.round_trip_us),
        },
        Err(error) => {
            tracing::warn!(%error, "redis health probe failed");
            RedisReport {
                up: false,
                server_time_ms: None,
                round_trip_us: None,
            }
        }
    })
}

/// Formats epoch milliseconds as a UTC time of day with milliseconds.
fn clock(ms: i64) -> String {
    let day_ms = ms.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03} UTC",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

#[component]
pub fn OverviewPage() -> impl IntoView {
    let query = use_query_map();
    let probe = move || {
        query.with(|q| {
            q.get("probe")
                .and_then(|p| p.parse::<u32>().ok())
                .unwrap_or(0)
        })
    };
    let status = Resource::new(probe, |_| redis_status());

    view! {
        <Title text="Overview"/>
        <h1>"Overview"</h1>
        <section class="card" aria-labelledby="redis-heading">
            <h2 id="redis-heading">"Redis"</h2>
            <Suspense fallback=|| view! { <p>"Asking Redis…"</p> }>
                {move || Suspend::new(async move {
                    match status.await {
                        Ok(s) if s.up => view! {
                            <dl class="facts" data-testid="redis-status">
                                <dt>"Status"</dt>
                                <dd><span class="badge ok">"up"</span></dd>
                                <dt>"Server clock"</dt>
                                <dd data-testid="redis-clock">{s.server_time_ms.map(clock)}</dd>
                                <dt>"Script round trip"</dt>
                                <dd>{s.round_trip_us.map(|us| format!("{:.2} ms", us as f64 / 1000.0))}</dd>
                            </dl>
                        }.into_any(),
                        _ => view! {
                            <p data-testid="redis-status"><span class="badge bad">"down"</span>
                                " Redis did not answer the health script."</p>
                        }.into_any(),
                    }
                })}
            </Suspense>
            <Form method="GET" action="">
                <input type="hidden" name="probe" prop:value=move || (probe() + 1).to_string()
                    value=move || (probe() + 1).to_string()/>
                <button type="submit">"Check again"</button>
                <span class="muted" data-testid="probe-count">{move || format!("Checks this visit: {}", probe())}</span>
            </Form>
        </section>
    }
}
