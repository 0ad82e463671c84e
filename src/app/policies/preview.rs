//! The burst preview beside the editor: what a burst of requests would meet under the
//! rules as typed, drawn over time, before anything is saved.

use leptos::prelude::*;

use leptos_router::{components::Form, hooks::use_query_map};

use super::RuleForm;
use crate::domain::preview::burst;

use super::words::*;

/// The rules the editor's fields describe, or why they do not make a policy yet.
pub(super) fn rules_of(name: &str, forms: &[RuleForm]) -> Result<Vec<crate::domain::Rule>, String> {
    let doc = super::document_of("", false, false, forms);
    let name = if name.is_empty() { "draft" } else { name };
    crate::domain::Policy::from_document(name, &doc)
        .map(|p| p.rules)
        .map_err(|e| {
            format!(
                "{}: {}",
                field_label(&super::field_in_form(&e.field, forms), forms),
                e.message
            )
        })
}

/// The form's fields as (name, value), read from the form an input event came from.
#[cfg(feature = "hydrate")]
pub(super) fn form_pairs(ev: &leptos::ev::Event) -> Option<Vec<(String, String)>> {
    use wasm_bindgen::JsCast;
    let target = ev.target()?.dyn_into::<web_sys::Element>().ok()?;
    let form = target
        .closest("form")
        .ok()??
        .dyn_into::<web_sys::HtmlFormElement>()
        .ok()?;
    let data = web_sys::FormData::new_with_form(&form).ok()?;
    let mut out = Vec::new();
    for entry in js_sys::try_iter(&data).ok()??.flatten() {
        let pair = js_sys::Array::from(&entry);
        if let (Some(k), Some(v)) = (pair.get(0).as_string(), pair.get(1).as_string()) {
            out.push((k, v));
        }
    }
    Some(out)
}

/// How a burst would be treated: a GET form (`burst_n`, `burst_s`), computed with the
/// domain model — in the browser when hydrated — from the rules as typed (`draft`, read at
/// each change; `typed`, a failed save's), else from the saved policy; a sentence and a
/// timeline of the burst.
#[component]
pub(super) fn Preview(
    name: String,
    document: String,
    typed: Option<Result<Vec<crate::domain::Rule>, String>>,
    draft: RwSignal<Option<Result<Vec<crate::domain::Rule>, String>>>,
) -> impl IntoView {
    let query = use_query_map();
    let n = move || {
        query.with(|q| {
            q.get("burst_n")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(50)
        })
    };
    let secs = move || {
        query.with(|q| {
            q.get("burst_s")
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(1.0)
        })
    };
    let saved = serde_json::from_str::<serde_json::Value>(&document)
        .ok()
        .and_then(|d| crate::domain::Policy::from_document(&name, &d).ok())
        .map(|p| p.rules)
        .unwrap_or_default();
    let rules = move || -> Result<(Vec<crate::domain::Rule>, bool), String> {
        match draft.get().or_else(|| typed.clone()) {
            Some(Ok(r)) => Ok((r, true)),
            Some(Err(e)) => Err(e),
            None => Ok((saved.clone(), false)),
        }
    };
    view! {
        <section class="card" aria-labelledby="preview-heading">
            <h2 id="preview-heading">"Burst preview"</h2>
            <Form method="GET" action="" on_form_data=crate::app::without_nameless() attr:class="row">
                <input type="hidden" name="name" value=name.clone()/>
                <label>"Requests"<input name="burst_n" inputmode="numeric" value=move || n().to_string() prop:value=move || n().to_string()/></label>
                <label>"Over (seconds)"<input name="burst_s" inputmode="decimal" value=move || secs().to_string() prop:value=move || secs().to_string()/></label>
                <button type="submit">"Preview"</button>
            </Form>
            {move || match rules() {
                Err(e) => view! { <p class="muted" data-testid="preview">{format!("The rules as typed do not make a policy yet: {e}")}</p> }.into_any(),
                Ok((rules, drafted)) if rules.is_empty() => view! { <p class="muted" data-testid="preview">{if drafted { "Add a rule to preview a burst." } else { "No rules yet." }}</p> }.into_any(),
                Ok((rules, drafted)) => {
                    let ms = (secs().clamp(0.0, 86_400.0) * 1000.0) as u64;
                    let r = burst(&rules, n(), ms);
                    let first = r.first_denied.map_or("none is denied".to_owned(), |(k, ms)| format!("the first denial is request {k}, at {}", if ms < 1000 { format!("{ms} ms") } else { format!("{:.2} s", ms as f64 / 1000.0) }));
                    let by_rule = r.denials_by_rule.iter().zip(r.penalties_by_rule.iter().chain(std::iter::repeat(&0))).filter(|((_, d), _)| *d > 0).map(|((rule, d), p)| {
                        if *p > 0 { format!("{rule}: {d}, {p} of them while its penalty box held the identifier") } else { format!("{rule}: {d}") }
                    }).collect::<Vec<_>>().join("; ");
                    let which = if drafted { " (the rules as typed, not saved yet)" } else { "" };
                    view! {
                        <p data-testid="preview">
                            {format!("{} requests: {} allowed, {} denied; {first}.", r.requests, r.allowed, r.denied)}
                            {(!by_rule.is_empty()).then(|| format!(" Denied by {by_rule}."))}
                            <span class="muted">{which}</span>
                        </p>
                        <BurstTimeline timeline=r.timeline.clone() over_ms=ms/>
                    }.into_any()
                }
            }}
        </section>
    }
}

/// The burst's timeline: a bar per slice, allowed below and denied above.
#[component]
pub(super) fn BurstTimeline(timeline: Vec<(u64, u64)>, over_ms: u64) -> impl IntoView {
    const W: f64 = 600.0;
    const H: f64 = 60.0;
    let peak = timeline
        .iter()
        .map(|(a, d)| a + d)
        .max()
        .unwrap_or(0)
        .max(1);
    let bar = W / timeline.len().max(1) as f64;
    let bars = crate::app::widgets::stacked_bars(
        timeline.iter().enumerate().map(|(i, (a, d))| (i, *a, *d)),
        bar,
        peak,
        H,
    );
    let end = if over_ms == 0 {
        "all at once".to_owned()
    } else {
        format!("{:.1} s", over_ms as f64 / 1000.0)
    };
    view! {
        <figure class="chart" data-testid="preview-timeline">
            <svg viewBox=format!("0 0 {W} {H}") preserveAspectRatio="none" role="img" aria-label="The burst over time: allowed below, denied above">
                {bars}
            </svg>
            <div class="x-axis flat" aria-hidden="true"><span>"first request"</span><span>{end}</span></div>
        </figure>
    }
}
