//! Pieces several dashboard pages draw alike: a table of identifiers with their policy and
//! a number, the stacked bars of a chart (allowed below, denied above), and the step that
//! asks before a change (`ConfirmStep`), a Copy button (`CopyButton`).

use leptos::prelude::*;

/// One row of [`identifier_table`]: the number already written as the page shows it.
pub struct IdentifierRow {
    pub policy: String,
    pub identifier: String,
    pub value: String,
}

/// Identifiers, each linked to the inspector, with their policy and a number headed `what`;
/// `empty` when there are none.
pub fn identifier_table(
    rows: Vec<IdentifierRow>,
    what: &'static str,
    testid: &'static str,
    empty: &'static str,
) -> AnyView {
    if rows.is_empty() {
        return view! { <p class="empty" data-testid=testid>{empty}</p> }.into_any();
    }
    view! {
        <table data-testid=testid>
            <thead><tr><th>"Identifier"</th><th>"Policy"</th><th class="num">{what}</th></tr></thead>
            <tbody>
                {rows.into_iter().map(|r| {
                    let href = format!("/identifiers?id={}", crate::domain::percent_encode(&r.identifier));
                    view! {
                        <tr>
                            <td><a href=href>{crate::domain::envoy::readable(&r.identifier).to_owned()}</a></td>
                            <td>{r.policy}</td>
                            <td class="num">{r.value}</td>
                        </tr>
                    }
                }).collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}

/// The bars of a chart `height` high: for each `(slot, allowed, denied)`, allowed below and
/// denied above, `bar` wide a slot, scaled so that `peak` fills the height. SVG attributes,
/// no inline styles (the CSP allows none).
pub fn stacked_bars(
    slots: impl Iterator<Item = (usize, u64, u64)>,
    bar: f64,
    peak: u64,
    height: f64,
) -> impl IntoView {
    slots
        .map(|(i, a, d)| {
            let x = i as f64 * bar;
            let ha = a as f64 / peak as f64 * height;
            let hd = d as f64 / peak as f64 * height;
            view! {
                <rect class="allowed" x=format!("{x:.1}") y=format!("{:.1}", height - ha) width=format!("{:.1}", bar * 0.85) height=format!("{ha:.1}")/>
                <rect class="denied" x=format!("{x:.1}") y=format!("{:.1}", height - ha - hd) width=format!("{:.1}", bar * 0.85) height=format!("{hd:.1}")/>
            }
        })
        .collect_view()
}

/// A change asked for twice: `summary` opens it (`Remove…`), `warning` says what it will do,
/// and the form inside (`children`) makes it. Works without JavaScript.
#[component]
pub fn ConfirmStep(
    #[prop(into)] summary: String,
    #[prop(optional, into)] warning: Option<String>,
    children: Children,
) -> impl IntoView {
    view! {
        <details class="confirm-step">
            <summary>{summary}</summary>
            {warning.map(|w| view! { <p class="small">{w}</p> })}
            {children()}
        </details>
    }
}

/// Copies `text` to the clipboard (needs JavaScript; without it the text is there to select).
#[component]
pub fn CopyButton(text: String) -> impl IntoView {
    let copied = RwSignal::new(false);
    let copy = move |_| {
        #[cfg(feature = "hydrate")]
        if let Some(window) = web_sys::window() {
            let _ = window.navigator().clipboard().write_text(&text);
            copied.set(true);
        }
        #[cfg(not(feature = "hydrate"))]
        let _ = &text;
    };
    view! {
        <button type="button" class="small" on:click=copy>{move || if copied.get() { "Copied" } else { "Copy" }}</button>
    }
}
