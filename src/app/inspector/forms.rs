//! The inspector's forms: the reset (with its notice and undo) and the override.

use leptos::prelude::*;

use super::*;

/// What a reset or its undo did: from the action's answer on a hydrated page, from the
/// address a form posted without JavaScript came back to otherwise. A reset offers its
/// undo for a minute.
#[component]
pub(super) fn ResetNotice(
    reset: ServerAction<ResetIdentifier>,
    undo: ServerAction<UndoReset>,
) -> impl IntoView {
    let query = leptos_router::hooks::use_query_map();
    let session = use_session();
    // A new reset's notice replaces the last undo's.
    Effect::new(move |_| {
        if reset.version().get() > 0 {
            undo.value().set(None);
        }
    });
    move || {
        let q = query.get();
        let id = q.get("id").unwrap_or_default();
        let undone = match undo.value().get() {
            Some(Ok(n)) => Some(n.to_string()),
            _ => q.get("undone"),
        };
        if let Some(n) = undone {
            return view! { <p class="notice" role="status">{format!("Reset undone: {n} {} put back as they were.", if n == "1" { "key" } else { "keys" })}</p> }.into_any();
        }
        let answer = match reset.value().get() {
            Some(Ok(a)) => Some((a.deleted.to_string(), a.undo, a.what)),
            _ => q
                .get("reset")
                .map(|n| (n, q.get("undo"), q.get("what").unwrap_or_default())),
        };
        let Some((n, token, what)) = answer else {
            return ().into_any();
        };
        if n == "0" {
            return view! {
                <p class="alert" role="status" data-testid="reset-nothing">
                    {format!("Nothing was reset: no counters were held for {what}. If requests are still refused, look at what it is checked with and at its overrides below.")}
                </p>
            }
            .into_any();
        }
        let keys = if n == "1" { "1 key" } else { "" };
        let keys = if keys.is_empty() {
            format!("{n} keys")
        } else {
            keys.to_owned()
        };
        let undo_form = token.map(|token| view! {
            <Suspense fallback=|| ()>
                {let (id, token) = (id.clone(), token.clone()); move || { let (id, token) = (id.clone(), token.clone()); Suspend::new(async move {
                    let s = session.await.unwrap_or_default();
                    view! {
                        <ActionForm action=undo attr:class="inline">
                            <CsrfField csrf=s.csrf.clone()/>
                            <input type="hidden" name="id" value=id/>
                            <input type="hidden" name="token" value=token/>
                            <button type="submit" class="small">"Undo (for a minute)"</button>
                        </ActionForm>
                    }
                })}}
            </Suspense>
        });
        view! {
            <div class="notice" role="status">
                {format!("Reset done ({what}): {keys} deleted. The counters start again from nothing. ")}
                {undo_form}
            </div>
        }
        .into_any()
    }
}

/// The reset's choices, "what refuses it when you press Reset" first (and chosen): for the identifier and each one
/// it was checked together with, every policy, each policy with state and each rule of
/// those; and all of them at once. Policies without state are left out.
pub(super) fn reset_choices(i: &Inspection) -> (Vec<(String, String)>, String) {
    let mut opts: Vec<(String, String)> = vec![(
        super::actions::NOW.to_owned(),
        "What refuses it when you press Reset (decided then)".to_owned(),
    )];
    let with_state = |p: &PolicyState| {
        p.status == "rules"
            && p.rules
                .iter()
                .any(|r| r.ttl_ms.is_some() || r.remaining < r.limit)
    };
    for x in std::iter::once(i).chain(&i.companions) {
        opts.push((
            format!("* {}", x.identifier),
            format!("{}: everything", x.identifier),
        ));
        for p in x.policies.iter().filter(|p| with_state(p)) {
            opts.push((
                format!("{} {}", p.policy, x.identifier),
                format!("{}: policy {}", x.identifier, p.policy),
            ));
            for r in &p.rules {
                opts.push((
                    format!("{}/{} {}", p.policy, r.rule, x.identifier),
                    format!("{}: rule {} of {}", x.identifier, r.rule, p.policy),
                ));
            }
        }
    }
    if !i.companions.is_empty() {
        let all: Vec<String> = std::iter::once(i)
            .chain(&i.companions)
            .map(|x| format!("* {}", x.identifier))
            .collect();
        opts.push((
            all.join("\n"),
            format!(
                "{} and the {} checked with it: everything",
                i.identifier,
                i.companions.len()
            ),
        ));
    }
    // Decided when pressed: what blocks may change between the page's read and the press.
    let chosen = super::actions::NOW.to_owned();
    (opts, chosen)
}

#[component]
pub(super) fn ResetForm(
    action: ServerAction<ResetIdentifier>,
    inspection: Inspection,
    csrf: String,
    /// What the page was asked for (`bob`), to come back to.
    page_id: String,
) -> impl IntoView {
    // The choices as the page was read: a live sample must not change the selection
    // under the person's hand.
    let (opts, chosen) = reset_choices(&inspection);
    // Only "now" and "everything" of each identifier: nothing is counted for any of them.
    let holds_nothing = !opts
        .iter()
        .any(|(v, _)| v != super::actions::NOW && !v.starts_with("* "));
    let nothing = holds_nothing.then(|| view! {
        <p class="notice" role="note" data-testid="reset-would-delete-nothing">
            {format!("No counters are held for {} or what it is checked with now: a reset would delete nothing. If requests are refused, look at its overrides.", inspection.identifier)}
        </p>
    });
    let options = opts
        .into_iter()
        .map(|(v, l)| {
            let selected = v == chosen;
            view! { <option value=v selected=selected>{l}</option> }
        })
        .collect_view();
    view! {
        <section class="card" aria-labelledby="reset-heading">
            <h2 id="reset-heading">"Reset"</h2>
            {nothing}
            <ActionForm action=action attr:class="row">
                <CsrfField csrf=csrf/>
                <input type="hidden" name="id" value=page_id/>
                <label>"What"<select name="what">{options}</select></label>
                <label>"Reason"<input name="reason" required maxlength="500" placeholder="support ticket, false positive…"/></label>
                <button type="submit" class="danger">"Reset counters"</button>
            </ActionForm>
            <p class="muted small">"A reset deletes the counters: the next request starts from a full allowance. It is written to the audit log with the reason, and can be undone for a minute."</p>
        </section>
    }
}

/// Block, exempt or limit the identifier in one policy for a while, with a reason: an override on
/// its exact value.
#[component]
pub(super) fn OverrideForm(
    action: ServerAction<crate::app::policies::AddOverride>,
    inspection: Inspection,
    csrf: String,
) -> impl IntoView {
    let i = inspection;
    let Some((dimension, value)) = i
        .identifier
        .split_once('=')
        .map(|(d, v)| (d.to_owned(), v.to_owned()))
    else {
        return ().into_any();
    };
    // The policies where it has state first: the override is most likely for one of those.
    let mut policies: Vec<&PolicyState> = i.policies.iter().collect();
    // Those that denied it lately first (it may be blocked there through another identifier,
    // with no state of its own), then those where it has state.
    let denied_in = |p: &PolicyState| i.streaks.iter().any(|(name, _)| *name == p.policy);
    policies.sort_by_key(|p| {
        !(denied_in(p)
            || p.status == "blocked"
            || p.rules
                .iter()
                .any(|r| r.ttl_ms.is_some() || r.remaining < r.limit))
    });
    // Then, of those, the ones that denied it lately first (a stable sort keeps the rest).
    policies.sort_by_key(|p| !denied_in(p));
    // What an own limit would replace, in each policy offered (from the rules' state).
    let replaces: Vec<String> = policies
        .iter()
        // Its own rules, not an own limit already in force there.
        .filter(|p| {
            p.rules
                .iter()
                .any(|r| r.rule != crate::app::policies::OWN_LIMIT_RULE)
        })
        .map(|p| {
            let rules: Vec<String> = p
                .rules
                .iter()
                .filter(|r| r.rule != crate::app::policies::OWN_LIMIT_RULE)
                .map(|r| format!("{} (limit {})", r.rule, r.limit))
                .collect();
            format!("in {} it replaces {}", p.policy, rules.join(", "))
        })
        .collect();
    let last = i
        .overrides
        .iter()
        .rev()
        .find_map(|o| crate::app::policies::own_limit_fields(&o.document));
    let policies: Vec<String> = policies.into_iter().map(|p| p.policy.clone()).collect();
    // A `*` in the value would make the override a wildcard, not this identifier.
    if policies.is_empty() || value.contains('*') {
        return ().into_any();
    }
    let matcher = format!("{dimension}={value}");
    view! {
        <section class="card" id="override" aria-labelledby="override-heading">
            <h2 id="override-heading">"Block, exempt or limit"</h2>
            <ActionForm action=action attr:class="row override-form">
                <CsrfField csrf=csrf/>
                <input type="hidden" name="matcher" value=matcher/>
                <label>"Policy"<select name="name">{policies.into_iter().map(|p| view! { <option value=p.clone()>{p.clone()}</option> }).collect_view()}</select></label>
                <label>"Action"<select name="action">
                    <option value="unlimited">"Exempt (let through without counting)"</option>
                    <option value="block">"Block (deny every request)"</option>
                    <option value="limit">"A limit of its own"</option>
                </select></label>
                <OwnLimitFields last=last replaces=replaces/>
                <label>"For"<select name="expires_minutes">
                    <option value="15">"15 minutes"</option>
                    <option value="60" selected>"1 hour"</option>
                    <option value="1440">"1 day"</option>
                    <option value="10080">"7 days"</option>
                    <option value="">"until removed"</option>
                </select></label>
                <label>"Reason"<input name="reason" required maxlength="500" placeholder="ticket 4711, partner load test…"/></label>
                <button type="submit">"Add override"</button>
            </ActionForm>
        </section>
    }
    .into_any()
}
