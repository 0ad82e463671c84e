//! Inspecting an identifier (its live state in every policy, a peek that consumes nothing)
//! and resetting it (everywhere, in one policy, or one rule), with the reset's audit record.
//! The admin API and the dashboard's inspector both call these.

use super::{Service, now_ms};
use crate::{
    domain::{
        Identifier, Name, Policy, RulesFor,
        inspection::{Inspection, LeaseView, PolicyState, RuleState},
        lease::LeaseId,
    },
    service::audit::{Actor, Change},
    store::{CheckEntry, StoreError},
};

mod reset;
pub use reset::*;

/// The overrides of `policy` that apply to `id` at `now_ms`, the one in force marked.
fn overrides_of(
    policy: &crate::domain::Policy,
    id: &Identifier,
    now_ms: i64,
) -> Vec<crate::domain::inspection::OverrideView> {
    let best = crate::domain::overrides::best_match(&policy.overrides, id, now_ms);
    policy
        .overrides
        .iter()
        .enumerate()
        .filter(|(_, o)| o.applies(id, now_ms))
        .map(|(index, o)| crate::domain::inspection::OverrideView {
            policy: policy.name.to_string(),
            index,
            document: serde_json::to_value(o).unwrap_or_default(),
            in_force: best.is_some_and(|b| std::ptr::eq(b, o)),
        })
        .collect()
}

/// Policies whose streaks an inspection reads, at most (two keys each, in one pipeline).
const MAX_STREAK_POLICIES: usize = 500;

impl Service {
    /// The identifier's state in every policy that has rules for it: a peek at cost 0 per
    /// policy, and each rule's key's TTL. Redis failing is an error, not an empty answer.
    pub async fn inspect(&self, id: &Identifier) -> Result<Inspection, StoreError> {
        let now_ms = now_ms();
        let mut out = Inspection {
            identifier: id.to_string(),
            at_ms: now_ms,
            ..Inspection::default()
        };
        for policy in self.policies.all() {
            out.overrides.extend(overrides_of(&policy, id, now_ms));
            let mut ps = PolicyState {
                policy: policy.name.to_string(),
                version: policy.version,
                status: "rules".into(),
                rules: Vec::new(),
            };
            match policy.rules_for(id, now_ms) {
                RulesFor::Unlimited => ps.status = "unlimited".into(),
                RulesFor::Blocked => ps.status = "blocked".into(),
                RulesFor::Rules(rules) => {
                    // An Envoy domain counts a descriptor under the one limit it finds.
                    let found = policy
                        .envoy
                        .as_ref()
                        .and_then(|t| t.rule_for(id))
                        .map(|i| &policy.rules[i].name);
                    let entries: Vec<CheckEntry<'_>> = rules
                        .iter()
                        .filter(|r| {
                            r.applies_to(id.dimension().as_str())
                                && found.is_none_or(|name| *name == r.name)
                        })
                        // As a check of cost 1 counts it: a weighted rule's too.
                        .map(|rule| super::check::entry_at(rule, id, 1))
                        .collect();
                    if entries.is_empty() {
                        continue;
                    }
                    // Each rule's state, and when a request of cost 1 would pass it: what
                    // support staff are asked ("when can they try again?").
                    let decision = self.store.probe(&policy.name, &entries, 1).await?;
                    let ttls = self.store.rule_ttls(&policy.name, &entries).await?;
                    let mut leases = Vec::with_capacity(entries.len());
                    for entry in &entries {
                        leases.push(if entry.takes_lease() {
                            self.leases_view(&policy.name, entry).await?
                        } else {
                            Vec::new()
                        });
                    }
                    let rule_named = |name: &crate::domain::Name| {
                        policy.all_rules().find(|rule| rule.name == *name)
                    };
                    ps.rules = decision
                        .results
                        .into_iter()
                        .zip(ttls)
                        .zip(leases)
                        .map(|((r, ttl), leases)| RuleState {
                            rule: r.rule.to_string(),
                            algorithm: r.algorithm_name().to_owned(),
                            identifier: r.identifier.to_string(),
                            limit: r.outcome.limit,
                            remaining: r.outcome.remaining,
                            reset_ms: r.outcome.reset_ms,
                            ttl_ms: (ttl >= 0).then_some(ttl),
                            binding: r.binding,
                            retry_after_ms: r.outcome.retry_after_ms,
                            penalty: r.outcome.penalty,
                            block_ms: rule_named(&r.rule).and_then(|rule| rule.block_ms),
                            flush_ms: rule_named(&r.rule).and_then(|rule| rule.local_flush_ms()),
                            leases,
                        })
                        .collect();
                }
            }
            out.policies.push(ps);
        }
        self.fill_streaks(&mut out).await;
        Ok(out)
    }

    /// The inspected identifier's streaks of denials, in every policy (a check of it may be
    /// denied by a policy none of whose rules counts it); left out when Redis cannot say.
    async fn fill_streaks(&self, out: &mut Inspection) {
        let names: Vec<String> = self
            .policies
            .all()
            .iter()
            .take(MAX_STREAK_POLICIES)
            .map(|p| p.name.to_string())
            .collect();
        let of: Vec<(&str, &str)> = names
            .iter()
            .map(|p| (p.as_str(), out.identifier.as_str()))
            .collect();
        match self.store.streaks(&of).await {
            Ok(streaks) => {
                out.streaks = names
                    .iter()
                    .zip(streaks)
                    .filter_map(|(p, s)| s.map(|s| (p.clone(), s)))
                    .collect();
            }
            Err(error) => tracing::debug!(%error, "could not read the streaks of denials"),
        }
    }

    /// The leases a concurrency entry holds now, with their ids.
    async fn leases_view(
        &self,
        policy: &Name,
        entry: &CheckEntry<'_>,
    ) -> Result<Vec<LeaseView>, StoreError> {
        let (now_us, held) = self
            .store
            .leases_of(policy, entry.identifier, &entry.rule.name)
            .await?;
        Ok(held
            .into_iter()
            .map(|l| LeaseView {
                id: LeaseId {
                    policy: policy.clone(),
                    rule: entry.rule.name.clone(),
                    identifier: entry.identifier.clone(),
                    token: l.token,
                    cost: l.cost,
                    taken_us: l.taken_us,
                }
                .to_string(),
                cost: l.cost,
                age_ms: ((now_us - l.taken_us).max(0) / 1000) as u64,
                expires_in_ms: ((l.expires_us - now_us).max(0) as u64).div_ceil(1000),
            })
            .collect())
    }

    /// As [`Service::inspect`] for what a person typed: `user=42`, a bare value (`bob`,
    /// looked up in every dimension in use), or a descriptor as the overview shows it
    /// (`path=/x` for `envoy=path=/x`). One identifier with state is inspected, with the
    /// identifiers it was checked together with; several are offered as candidates.
    /// Redis failing is said in the inspection's `error`, for the page to show.
    pub async fn inspect_typed(&self, raw: &str) -> Inspection {
        let typed = raw.trim();
        match self.resolve_and_inspect(typed).await {
            Ok(inspection) => inspection,
            Err(error) => {
                tracing::warn!(%error, "inspector: Redis call failed");
                Inspection {
                    identifier: typed.to_owned(),
                    at_ms: now_ms(),
                    error: Some("Redis is unavailable; the counters cannot be read".into()),
                    ..Inspection::default()
                }
            }
        }
    }

    async fn resolve_and_inspect(&self, typed: &str) -> Result<Inspection, StoreError> {
        let parsed = Identifier::parse(typed).ok();
        let direct = match &parsed {
            Some(id) => !self.policies_with_state(id).await?.is_empty(),
            None => false,
        };
        let (id, resolved_from, lookup) = if direct {
            (parsed.expect("parsed above"), None, Lookup::default())
        } else {
            let lookup = self.lookup(typed).await?;
            // Nothing with state: one recent identifier of exactly that value is still who
            // was meant (bob, just reset, is "not blocked", not "unknown").
            let recent_one = || {
                let mut exact = lookup
                    .recent
                    .iter()
                    .filter(|r| r.split_once('=').is_some_and(|(_, v)| v == typed));
                match (exact.next(), exact.next()) {
                    (Some(one), None) => Identifier::parse(one).ok(),
                    _ => None,
                }
            };
            match (lookup.with_state.as_slice(), parsed) {
                ([(only, _)], _) => {
                    let from = (only.to_string() != typed).then(|| typed.to_owned());
                    (only.clone(), from, lookup)
                }
                ([], Some(id)) => (id, None, lookup),
                ([], None) if let Some(id) = recent_one() => (id, Some(typed.to_owned()), lookup),
                _ => {
                    return Ok(Inspection {
                        identifier: typed.to_owned(),
                        at_ms: now_ms(),
                        error: lookup.with_state.is_empty().then(|| {
                            format!(
                                "nothing with the value “{typed}” has state now; \
                                 write it as dimension=value, such as user={typed}"
                            )
                        }),
                        candidates: lookup
                            .with_state
                            .into_iter()
                            .map(|(id, p)| (id.to_string(), p))
                            .collect(),
                        recent: lookup.recent,
                        typed: Some(typed.to_owned()),
                        ..Inspection::default()
                    });
                }
            }
        };
        let mut inspection = self.inspect(&id).await?;
        inspection.typed = resolved_from;
        inspection.recent = lookup.recent;
        let companions = self.companions(&id).await?;
        inspection.companions_seen = self.companions_seen(&id, companions.len()).await?;
        for companion in companions.into_iter().take(MAX_COMPANIONS) {
            let mut c = self.inspect(&companion).await?;
            let listed = self.companions(&companion).await?.len();
            c.companions_seen = self.companions_seen(&companion, listed).await?;
            inspection.companions.push(c);
        }
        Ok(inspection)
    }
}

/// What a lookup of what a person typed found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lookup {
    /// The identifiers it may mean that have state now: (identifier, policies with state).
    pub with_state: Vec<(Identifier, Vec<String>)>,
    /// Identifiers from the last two hours' traffic whose text contains it, most checked
    /// first (at most 20).
    pub recent: Vec<String>,
}

/// Companions the inspector reads the state of, at most.
const MAX_COMPANIONS: usize = 4;

/// Most identifiers a lookup tries, whatever the number of dimensions in use.
const LOOKUP_CANDIDATES: usize = 32;

impl Service {
    /// What `typed` may mean: `bob` as `user=bob`, `ip=bob`… (every dimension a policy
    /// names or recent traffic used), `path=/x` as the Envoy descriptor `envoy=path=/x`;
    /// those with state now, and recent identifiers that contain the text.
    pub async fn lookup(&self, typed: &str) -> Result<Lookup, StoreError> {
        let typed = typed.trim();
        let policies = self.policies.all();
        let recent = self.recent_identifiers().await?;
        let mut dimensions: Vec<String> = Vec::new();
        let mut add = |d: &str| {
            if !dimensions.iter().any(|x| x == d) {
                dimensions.push(d.to_owned());
            }
        };
        for p in &policies {
            for r in p.all_rules() {
                for d in r.dimensions.iter().flatten() {
                    add(d.as_str());
                }
            }
            for o in &p.overrides {
                add(o.dimension.as_str());
            }
        }
        for id in &recent {
            if let Some((d, _)) = id.split_once('=') {
                add(d);
            }
        }
        let mut candidates: Vec<Identifier> = Vec::new();
        if let Ok(id) = Identifier::parse(typed) {
            candidates.push(id);
        }
        if policies.iter().any(|p| p.envoy.is_some())
            && let Ok(id) = Identifier::parse(&format!("envoy={typed}"))
        {
            candidates.push(id);
        }
        for d in &dimensions {
            if let Ok(id) = Identifier::parse(&format!("{d}={typed}"))
                && !candidates.contains(&id)
            {
                candidates.push(id);
            }
        }
        candidates.truncate(LOOKUP_CANDIDATES);
        let mut with_state = Vec::new();
        for id in candidates {
            let held = self.policies_with_state(&id).await?;
            if !held.is_empty() {
                with_state.push((id, held));
            }
        }
        let needle = typed.to_lowercase();
        let recent = recent
            .into_iter()
            .filter(|id| !needle.is_empty() && id.to_lowercase().contains(&needle))
            .take(20)
            .collect();
        Ok(Lookup { with_state, recent })
    }

    /// The policies where `id` has state now (one pipelined read of its keys' TTLs).
    async fn policies_with_state(&self, id: &Identifier) -> Result<Vec<String>, StoreError> {
        let now_ms = now_ms();
        let mut out = Vec::new();
        for policy in self.policies.all() {
            let RulesFor::Rules(rules) = policy.rules_for(id, now_ms) else {
                continue;
            };
            let entries: Vec<CheckEntry<'_>> = rules
                .iter()
                .filter(|r| r.applies_to(id.dimension().as_str()))
                .map(|rule| CheckEntry::new(rule, id))
                .collect();
            if entries.is_empty() {
                continue;
            }
            let ttls = self.store.rule_ttls(&policy.name, &entries).await?;
            if ttls.iter().any(|t| *t != -2) {
                out.push(policy.name.to_string());
            }
        }
        Ok(out)
    }

    /// The identifiers of the last two hours' lists of the most checked and most denied,
    /// most first.
    async fn recent_identifiers(&self) -> Result<Vec<String>, StoreError> {
        use crate::domain::history::{self, ALL, Step, TopKind};
        let now = now_ms();
        let hour = Step::Hour.period_of(now);
        let mut out: Vec<String> = Vec::new();
        for kind in [TopKind::Denied, TopKind::Checked] {
            let top = self
                .store
                .history_top(ALL, kind, Step::Hour, hour - 1..=hour, 200)
                .await?;
            for (member, _) in top {
                let (_, id) = history::split_member(&member);
                if !out.iter().any(|o| o == id) {
                    out.push(id.to_owned());
                }
            }
        }
        Ok(out)
    }

    /// How many distinct identifiers `id` was checked together with in the last hour: the
    /// count kept for a shared one, else the `listed` its companions list holds.
    async fn companions_seen(&self, id: &Identifier, listed: usize) -> Result<u64, StoreError> {
        Ok(self
            .store
            .companion_count(&id.to_string())
            .await?
            .map_or(listed as u64, |n| n.max(listed as u64)))
    }

    /// The identifiers `id` was checked together with in the last hour.
    pub async fn companions(&self, id: &Identifier) -> Result<Vec<Identifier>, StoreError> {
        Ok(self
            .store
            .companions(&id.to_string())
            .await?
            .iter()
            .filter_map(|c| Identifier::parse(c).ok())
            .collect())
    }
}
