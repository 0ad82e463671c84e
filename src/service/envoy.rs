//! Envoy's rate limit check (`ShouldRateLimit`), on the same engine as every other check:
//! the domain's policy from memory, each request descriptor's limit found in its tree, one
//! all-or-nothing decision through the over-limit cache and the check scripts, the live
//! counters, the metrics and the policy's failure mode. The gRPC server and `POST /json`
//! both call [`Service::should_rate_limit`].
//!
//! The descriptors are planned in `domain::envoy_plan` (a pure function, table-tested, with
//! the notes on how envoyproxy/ratelimit's rules map onto the engine); this runs the plan's
//! checks and shares the failure mode, history and metrics with every other check
//! (`service::check`).

use std::sync::Arc;

use super::{Service, check::MAX_COST};
pub use crate::domain::envoy_plan::{
    CurrentLimit, DescriptorAnswer, EnvoyDescriptor, EnvoyRequest,
};
use crate::{
    domain::{
        Decision, Policy, envoy,
        envoy_plan::{self, Group, Plan},
        history,
    },
    store::{CheckEntry, StoreError},
};

/// Most descriptors in one request, and most entries in one descriptor.
pub const MAX_DESCRIPTORS: usize = 64;
pub const MAX_ENTRIES: usize = 16;

/// The answer: OK only when every descriptor is.
#[derive(Clone, Debug)]
pub struct EnvoyAnswer {
    pub ok: bool,
    pub statuses: Vec<DescriptorAnswer>,
    /// Redis failed and the domain fails open: every descriptor is OK, nothing was counted.
    pub degraded: bool,
    /// The domain's policy, when there is one.
    pub policy: Option<Arc<Policy>>,
}

#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("the policies have not been loaded from Redis yet")]
    PoliciesNotLoaded,
    /// Redis failed and the domain fails closed.
    #[error("redis is unavailable: {0}")]
    Unavailable(StoreError),
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> EnvoyError {
    EnvoyError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

impl EnvoyAnswer {
    /// OK for every one of `n` descriptors, nothing counted.
    fn free(n: usize, policy: Option<Arc<Policy>>) -> Self {
        Self {
            ok: true,
            statuses: vec![DescriptorAnswer::unlimited(); n],
            degraded: false,
            policy,
        }
    }

    /// What this answer counts as in the history and the metrics.
    fn outcome(&self) -> history::Outcome {
        match (self.degraded, self.ok) {
            (true, _) => history::Outcome::Degraded,
            (false, true) if self.statuses.iter().any(|s| s.shadow_denied) => {
                history::Outcome::ShadowDenied
            }
            (false, true) => history::Outcome::Allowed,
            (false, false) => history::Outcome::Denied,
        }
    }
}

impl Service {
    /// Answers an Envoy rate limit request; see `domain::envoy_plan` for the rules. A
    /// domain that does not exist is OK and consumes nothing.
    pub async fn should_rate_limit(
        &self,
        request: &EnvoyRequest,
    ) -> Result<EnvoyAnswer, EnvoyError> {
        let span = crate::telemetry::traces::child_span("check");
        let traced = span.clone();
        let answer =
            crate::telemetry::traces::within(span, self.should_rate_limit_untraced(request)).await;
        if let Some(cx) = traced {
            crate::telemetry::traces::record_on(
                &cx,
                vec![opentelemetry::KeyValue::new(
                    "spillway.envoy_domain",
                    request.domain.clone(),
                )],
            );
            if let Err(error @ (EnvoyError::Unavailable(_) | EnvoyError::PoliciesNotLoaded)) =
                &answer
            {
                crate::telemetry::traces::failed(&cx, error.to_string());
            }
        }
        answer
    }

    /// As [`Service::should_rate_limit`], for Envoy's gRPC: an over-limit answer of a domain
    /// whose policy waits (`on_deny: wait`) is held until its limits' windows end and asked
    /// again, within the policy's `max_wait_ms` and the call's `grpc-timeout` (`deadline`).
    pub async fn should_rate_limit_or_wait(
        &self,
        request: &EnvoyRequest,
        deadline: Option<std::time::Instant>,
    ) -> Result<EnvoyAnswer, EnvoyError> {
        let started = std::time::Instant::now();
        let answer = self.should_rate_limit(request).await?;
        let Some((policy, max_wait)) = answer
            .policy
            .as_ref()
            .and_then(|p| Some((p.name.to_string(), p.max_wait()?)))
        else {
            return Ok(answer);
        };
        // Over the limit until the latest window of the limits over it ends.
        let held = |a: &EnvoyAnswer| {
            (!a.ok && !a.degraded).then(|| {
                a.statuses
                    .iter()
                    .filter(|s| !s.ok)
                    .map(|s| s.reset_ms)
                    .collect::<Option<Vec<u64>>>()
                    .and_then(|resets| resets.into_iter().max())
            })
        };
        self.hold_while_denied(&policy, started + max_wait, deadline, answer, held, || {
            self.should_rate_limit(request)
        })
        .await
    }

    async fn should_rate_limit_untraced(
        &self,
        request: &EnvoyRequest,
    ) -> Result<EnvoyAnswer, EnvoyError> {
        let started = std::time::Instant::now();
        validate(request)?;
        let n = request.descriptors.len();
        let Some(policy) = self.domain_policy(&request.domain)? else {
            return Ok(EnvoyAnswer::free(n, None));
        };
        let tree = policy
            .envoy
            .as_ref()
            .expect("a domain's policy has its tree");
        let mut plan = envoy_plan::plan(&policy, tree, request, super::now_ms())
            .map_err(|e| invalid(e.field, e.message))?;
        // Descriptors that found no limit: a wiring that sends what the file does not know
        // limits nothing, silently; the domain's page names them.
        for i in plan.unmatched() {
            self.live
                .unmatched(policy.name.as_str(), &request.descriptors[i].entries);
        }
        if let Some(i) = plan.over_already {
            // Denied without Redis (a limit of 0, or blocked): the live view still hears of it.
            self.live
                .denied_from_cache(policy.name.as_str(), Some(plan.identifiers[i].to_string()));
        }
        let answer = match self.count(&mut plan).await {
            Ok(ok) => self.shadow_all(EnvoyAnswer {
                ok,
                statuses: plan.answers(),
                degraded: false,
                policy: Some(policy.clone()),
            }),
            Err(error) => {
                self.failure_mode(&policy, error, plan.limited(), started)
                    .map_err(EnvoyError::Unavailable)?;
                EnvoyAnswer {
                    degraded: true,
                    ..EnvoyAnswer::free(n, Some(policy.clone()))
                }
            }
        };
        let denied_by_index = answer
            .statuses
            .iter()
            .position(|s| !s.ok || s.shadow_denied)
            .filter(|_| !answer.degraded);
        let rule = denied_by_index.map(|i| plan.rule_of(i));
        self.settle(
            super::check::Settled {
                policy: &policy,
                outcome: answer.outcome(),
                degraded: answer.degraded,
                together: &plan.identifiers,
                denial: denied_by_index
                    .zip(rule.as_deref())
                    .map(|(i, rule)| super::live::Denial {
                        identifier: &plan.identifiers[i],
                        rule,
                        retry_after_ms: answer.statuses[i].reset_ms,
                    }),
            },
            plan.limited(),
            started,
        );
        if !answer.degraded {
            descriptor_metrics(&plan, &answer.statuses);
            self.record_envoy(&policy, &plan, answer.ok);
        }
        Ok(answer)
    }

    /// With every request in shadow mode (`SPILLWAY_ENVOY_SHADOW_MODE`), an answer over its
    /// limits is OK overall, as envoyproxy/ratelimit's `SHADOW_MODE` answers: each descriptor
    /// keeps its status (OVER_LIMIT, nothing remaining), and counts as a shadow denial.
    fn shadow_all(&self, mut answer: EnvoyAnswer) -> EnvoyAnswer {
        if self.envoy_shadow_all && !answer.ok {
            answer.ok = true;
            for status in answer.statuses.iter_mut().filter(|s| !s.ok) {
                status.shadow_denied = true;
            }
            crate::telemetry::metrics::envoy_global_shadow();
        }
        answer
    }

    /// The policy of Envoy domain `domain`, from memory; `None` when there is no such
    /// domain.
    fn domain_policy(&self, domain: &str) -> Result<Option<Arc<Policy>>, EnvoyError> {
        let Ok(name) = envoy::policy_name(domain) else {
            return Ok(None);
        };
        let saved_before =
            || envoy::cut_policy_name(domain).and_then(|n| self.policies.get(n.as_str()));
        let policy = match self.policies.get(name.as_str()).or_else(saved_before) {
            Some(p) => p,
            None if self.policies.is_loaded() => return Ok(None),
            None => return Err(EnvoyError::PoliciesNotLoaded),
        };
        let is_this_domain = policy
            .envoy
            .as_ref()
            .is_some_and(|t| t.doc.domain == domain);
        Ok(is_this_domain.then_some(policy))
    }

    /// Makes `plan`'s checks and takes their answers: the enforced descriptors together
    /// (all or nothing), then each cost of the shadow- and quota-mode ones (only read when
    /// the enforced ones were denied), then the peeks. Whether the request is OK; the first
    /// Redis failure stops the rest.
    async fn count(&self, plan: &mut Plan) -> Result<bool, StoreError> {
        if !plan.enforced.is_empty() {
            let enforced = plan.enforced.clone();
            let decision = self.check_group(plan, &enforced).await?;
            plan.fill(&enforced, &decision, Group::Enforced, super::now_ms());
            if !decision.allowed {
                plan.enforced_denied();
            }
        }
        for (group_of, checks) in [
            (Group::Shadow, plan.shadow_checks()),
            (Group::Quota, plan.quota_checks()),
        ] {
            for (_, group) in checks {
                let decision = self.check_group(plan, &group).await?;
                plan.fill(&group, &decision, group_of, super::now_ms());
            }
        }
        if !plan.peeks.is_empty() {
            let peeks = plan.peeks.clone();
            let decision = self.check_group(plan, &peeks).await?;
            plan.fill(&peeks, &decision, Group::Peek, super::now_ms());
        }
        Ok(!plan.over())
    }

    /// Decides the counted descriptors `idx` of `plan` together, all or nothing, each at its
    /// own hits (the check's cost when they all share it).
    async fn check_group(&self, plan: &Plan, idx: &[usize]) -> Result<Decision, StoreError> {
        let entries = plan.entries(idx);
        let first = entries.first().map_or(0, |&(_, _, hits)| hits);
        let shared = entries.iter().all(|&(_, _, hits)| hits == first);
        let entries: Vec<CheckEntry<'_>> = entries
            .into_iter()
            .map(|(rule, identifier, hits)| CheckEntry {
                cost: (!shared).then_some(hits),
                ..CheckEntry::new(rule, identifier)
            })
            .collect();
        self.decide(plan.policy(), &entries, first).await
    }
}

impl Service {
    /// Kuadrant's `CheckRateLimit` (Limitador's semantics): whether one more hit of every
    /// descriptor would fit, counting nothing. `false` when one would not.
    pub async fn check_envoy_limits(&self, request: &EnvoyRequest) -> Result<bool, EnvoyError> {
        let request = EnvoyRequest {
            check_only: true,
            ..request.clone()
        };
        Ok(self.should_rate_limit(&request).await?.ok)
    }

    /// Kuadrant's `Report` (Limitador's semantics): adds the request's hits (0 means 1) to
    /// every descriptor's counter, past its limit too; a domain that does not exist counts
    /// nothing.
    pub async fn report_envoy_usage(&self, request: &EnvoyRequest) -> Result<(), EnvoyError> {
        validate(request)?;
        let Some(policy) = self.domain_policy(&request.domain)? else {
            return Ok(());
        };
        let tree = policy
            .envoy
            .as_ref()
            .expect("a domain's policy has its tree");
        let hits = request.hits_addend.max(1);
        let uniform = EnvoyRequest {
            hits_addend: hits,
            descriptors: request
                .descriptors
                .iter()
                .map(|d| EnvoyDescriptor {
                    hits_addend: None,
                    ..d.clone()
                })
                .collect(),
            ..request.clone()
        };
        let plan = envoy_plan::plan(&policy, tree, &uniform, super::now_ms())
            .map_err(|e| invalid(e.field, e.message))?;
        let counted = plan.counted();
        let entries: Vec<CheckEntry<'_>> = plan
            .entries(&counted)
            .into_iter()
            .map(|(rule, identifier, _)| CheckEntry::new(rule, identifier))
            .collect();
        if entries.is_empty() {
            return Ok(());
        }
        let cost = i64::try_from(hits).unwrap_or(i64::MAX);
        self.store
            .report(&policy.name, &entries, cost, crate::store::Now::Redis)
            .await
            .map_err(EnvoyError::Unavailable)?;
        crate::telemetry::metrics::reported(policy.name.as_str(), cost);
        Ok(())
    }
}

/// Each descriptor's hits under its metric key (only those that found a limit in the
/// domain's file: see `domain::envoy::Found`).
fn descriptor_metrics(plan: &Plan, statuses: &[DescriptorAnswer]) {
    for ((key, status), &hits) in plan.metric_keys.iter().zip(statuses).zip(&plan.costs) {
        let Some(key) = key else { continue };
        let status_label = match (status.ok, status.shadow_denied) {
            (false, _) => "over_limit",
            (true, true) => "shadow_mode",
            (true, false) => "within_limit",
        };
        crate::telemetry::metrics::envoy_hits(key, status_label, hits);
    }
}

fn validate(request: &EnvoyRequest) -> Result<(), EnvoyError> {
    if request.domain.is_empty() {
        return Err(invalid("domain", "is required"));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(invalid(
            "descriptors",
            format!("at most {MAX_DESCRIPTORS} in one request"),
        ));
    }
    if request.hits_addend > MAX_COST {
        return Err(invalid("hits_addend", format!("at most {MAX_COST}")));
    }
    if request.descriptors.is_empty() {
        return Err(invalid("descriptors", "must not be empty"));
    }
    for (i, d) in request.descriptors.iter().enumerate() {
        if d.entries.len() > MAX_ENTRIES {
            return Err(invalid(
                format!("descriptors[{i}].entries"),
                format!("at most {MAX_ENTRIES}"),
            ));
        }
        for (j, (k, v)) in d.entries.iter().enumerate() {
            if k.is_empty() {
                return Err(invalid(
                    format!("descriptors[{i}].entries[{j}].key"),
                    "is required",
                ));
            }
            if k.len() > envoy::MAX_TEXT || v.len() > envoy::MAX_TEXT {
                return Err(invalid(
                    format!("descriptors[{i}].entries[{j}]"),
                    format!("keys and values are at most {} bytes", envoy::MAX_TEXT),
                ));
            }
        }
        if let Some((rpu, _)) = d.limit
            && u64::from(rpu) > crate::domain::rule::MAX_AMOUNT
        {
            return Err(invalid(
                format!("descriptors[{i}].limit.requests_per_unit"),
                format!("at most {}", crate::domain::rule::MAX_AMOUNT),
            ));
        }
        if d.hits_addend.is_some_and(|h| h > MAX_COST) {
            return Err(invalid(
                format!("descriptors[{i}].hits_addend"),
                format!("at most {MAX_COST}"),
            ));
        }
    }
    Ok(())
}

/// An Envoy domain's YAML file as the JSON value the domain is read from. A key repeated in
/// one mapping is refused with its line (envoyproxy/ratelimit refuses such a file; read
/// straight into JSON, the last one silently won).
pub fn domain_yaml(text: &[u8]) -> Result<serde_json::Value, String> {
    refuse_deep_yaml(&String::from_utf8_lossy(text))?;
    let yaml: serde_yaml::Value =
        serde_yaml::from_slice(text).map_err(|e| format!("is not valid YAML: {e}"))?;
    serde_json::to_value(yaml).map_err(|e| format!("is not a configuration file: {e}"))
}

/// Each domain file of a text that holds one or several (YAML documents separated by
/// `---`, as a folder of upstream's files pasted together), as JSON values; an empty
/// document is skipped. The error names the document (`document 2: …`).
pub fn domain_files(text: &str) -> Result<Vec<serde_json::Value>, String> {
    use serde::Deserialize;
    refuse_deep_yaml(text)?;
    let mut out = Vec::new();
    for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let yaml = serde_yaml::Value::deserialize(document)
            .map_err(|e| format!("document {}: is not valid YAML: {e}", i + 1))?;
        if yaml.is_null() {
            continue;
        }
        out.push(
            serde_json::to_value(yaml)
                .map_err(|e| format!("document {}: is not a configuration file: {e}", i + 1))?,
        );
    }
    if out.is_empty() {
        return Err("holds no domain file".into());
    }
    Ok(out)
}

/// The deepest nesting a domain file may have. Upstream's deepest configuration nests its
/// descriptors five deep, about 16 levels of YAML; a parser fed thousands of levels works
/// for seconds on one request.
pub const MAX_YAML_DEPTH: usize = 64;

/// Refuses YAML nested deeper than [`MAX_YAML_DEPTH`], judged before any parsing, in one
/// pass: each line's depth is its indentation levels open, its leading `- ` entries, and
/// the flow brackets (`[`, `{`) open outside quotes.
pub fn refuse_deep_yaml(text: &str) -> Result<(), String> {
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    for (n, line) in text.lines().enumerate() {
        let body = line.trim_start_matches(' ');
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        let indent = line.len() - body.len();
        if flow == 0 {
            while indents.last().is_some_and(|&i| i >= indent) {
                indents.pop();
            }
            indents.push(indent);
        }
        let mut rest = body;
        let mut dashes = 0;
        while let Some(after) = rest.strip_prefix("- ").or_else(|| rest.strip_prefix("-\t")) {
            dashes += 1;
            rest = after.trim_start();
        }
        let mut quote: Option<char> = None;
        let mut deepest = flow;
        for c in rest.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '#') => break,
                (None, '[' | '{') => {
                    flow += 1;
                    deepest = deepest.max(flow);
                }
                (None, ']' | '}') => flow = flow.saturating_sub(1),
                _ => {}
            }
        }
        let depth = indents.len() + dashes + deepest;
        if depth > MAX_YAML_DEPTH {
            return Err(format!(
                "line {}: nested {depth} levels deep; a domain file nests at most {MAX_YAML_DEPTH}",
                n + 1
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod yaml_tests {
    #[test]
    fn deep_nesting_is_refused_before_parsing() {
        let flow = format!(
            "domain: d\ndescriptors: {}{}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let started = std::time::Instant::now();
        let error = super::domain_yaml(flow.as_bytes()).unwrap_err();
        assert!(
            error.contains("line 2: nested") && error.contains("at most 64"),
            "{error}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        let mut indented = String::from("domain: d\n");
        for i in 0..80 {
            indented.push_str(&format!("{}k{i}:\n", "  ".repeat(i)));
        }
        assert!(
            super::domain_yaml(indented.as_bytes())
                .unwrap_err()
                .contains("nested")
        );
        let dashes = format!("domain: d\ndescriptors:\n  {}x\n", "- ".repeat(70));
        assert!(super::domain_files(&dashes).unwrap_err().contains("nested"));
        // Upstream's shape, descriptors five deep, passes.
        let mut nested = String::from("domain: d\ndescriptors:\n");
        for level in 0..5 {
            let pad = "    ".repeat(level);
            nested.push_str(&format!("{pad}  - key: k{level}\n{pad}    descriptors:\n"));
        }
        nested.push_str(&format!(
            "{}  - key: last\n{}    rate_limit: {{unit: second, requests_per_unit: 1}}\n",
            "    ".repeat(5),
            "    ".repeat(5)
        ));
        super::refuse_deep_yaml(&nested).unwrap();
    }

    #[test]
    fn a_repeated_key_is_refused_with_its_line() {
        let file = b"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      unit: minute\n      requests_per_unit: 1\n";
        let error = super::domain_yaml(file).unwrap_err();
        assert!(
            error.contains("duplicate entry with key \"unit\""),
            "{error}"
        );
        assert!(error.contains("descriptors[0].rate_limit"), "{error}");
        assert!(error.contains("line 5"), "{error}");
        let good = super::domain_yaml(b"domain: d\ndescriptors: []\n").unwrap();
        assert_eq!(good["domain"], "d");
    }
}
