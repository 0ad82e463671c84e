//! Policies: a named, versioned list of rules with a mode, a failure mode and overrides,
//! parsed from the policy document's JSON (docs/services.md, "The API"). Every error names the
//! offending field.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    Identifier, Name, PolicyError, Rule,
    calendar::{Period, ZoneName},
    overrides::Override,
    rule::{ALGORITHMS, Algorithm, AlgorithmKind},
};

mod dimensions;
mod parse;
pub use parse::parse_rules;
use parse::*;

/// Most rules one policy may have.
pub const MAX_RULES: usize = 32;
/// The fields of a policy document.
const FIELDS: &[&str] = &[
    "name",
    "version",
    "description",
    "mode",
    "failure_mode",
    "strict",
    "optional",
    "on_deny",
    "max_wait_ms",
    "record",
    "record_checks",
    "rules",
    "overrides",
    "envoy",
    "managed_by",
];

/// Longest description, in bytes.
pub const MAX_DESCRIPTION: usize = 1024;

/// Enforce denials, or only report them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Enforce,
    /// Denials are reported (`shadow_denied`) but callers are let through.
    Shadow,
}

/// What a check answers when Redis cannot be reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Allow, and say `degraded: true`.
    #[default]
    Open,
    /// Refuse with 503.
    Closed,
}

/// What the front doors that can hold a request (forward-auth, Envoy's gRPC) do with a
/// denied one: refuse it at once, or hold it until it would pass (`max_wait_ms` at most).
/// The JSON check always answers at once, with `retry_after_ms`: its caller decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDeny {
    #[default]
    Refuse,
    Wait,
}

impl OnDeny {
    fn is_refuse(&self) -> bool {
        *self == OnDeny::Refuse
    }
}

/// Which of a policy's checks are recorded for what-if replays (`service::record`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recording {
    /// Every check while the record's budget holds a day of them; past it, the checks of a
    /// sample of identifiers (one in 2, 4, 8…), so the record still covers the day.
    #[default]
    Sample,
    /// Every check: the newest within the budget (a busy policy's record covers less than a
    /// day).
    Every,
    /// None.
    Off,
}

impl Recording {
    fn is_sample(&self) -> bool {
        *self == Recording::Sample
    }
}

/// The longest a policy may hold a denied request (`max_wait_ms`): a minute.
pub const MAX_WAIT_MS: u64 = 60_000;

/// A valid policy. Built by [`Policy::from_document`]; it serializes back to the same
/// document (plus `name` and `version`), which is how the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub name: Name,
    /// 1 for the first version; every change of its rules or settings adds one.
    pub version: u64,
    /// Changes of its overrides within this version (from 0): an override is not a new
    /// version of the rules, and has its own audit record.
    #[serde(skip)]
    pub overrides_rev: u64,
    pub description: String,
    pub mode: Mode,
    pub failure_mode: FailureMode,
    /// Whether a check whose identifiers meet no rule (nor override) is refused (400,
    /// naming the dimensions the rules count) rather than let through as `unmatched`.
    /// `None`: the document did not say; a save settles it ([`Policy::settle_strict`]),
    /// and a stored policy that never said (saved before there was the choice) is lenient.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
    /// Dimensions its rules count whose absence from a check is a normal case: a check
    /// that gives none of the policy's dimensions, all of them optional, is let through
    /// uncounted even when strict (anonymous callers of a per-user policy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub optional: Vec<Name>,
    /// Refuse a denied request at once, or hold it (see [`OnDeny`]).
    #[serde(default, skip_serializing_if = "OnDeny::is_refuse")]
    pub on_deny: OnDeny,
    /// With `on_deny: wait`: the longest a denied request is held (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u64>,
    /// Which checks are recorded for what-if replays.
    #[serde(default, skip_serializing_if = "Recording::is_sample")]
    pub record: Recording,
    /// At most this many of its checks in the record (within the server's
    /// `SPILLWAY_RECORD_CHECKS`, which caps it); `None`: the server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_checks: Option<u64>,
    pub rules: Vec<Rule>,
    #[serde(default)]
    pub overrides: Vec<Override>,
    /// An Envoy domain's file, for a policy loaded from one: its limits are the rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envoy: Option<super::envoy::EnvoyDomain>,
    /// What keeps this domain's file (`folder:<dir>`, `xds:<server>`): its limits change
    /// there, not through the API or the dashboard. `None`: whoever saves it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub managed_by: Option<String>,
}

/// Policy names starting with this are Spillway's own (the sign-in limits keep their
/// counters under `spillway-login`): no new policy may take one.
pub const RESERVED_PREFIX: &str = "spillway-";

/// Why an override listed after `overrides[earlier]` would never apply.
fn shadowed(earlier: usize) -> String {
    format!(
        "would never apply: overrides[{earlier}] has the same match and lasts as long or longer (remove it first)"
    )
}

/// Refuses a name Spillway keeps for itself. Checked where policies are created (the API,
/// the editor, an import), not where they are read: a policy stored under such a name
/// before the prefix was reserved still loads, and can be read and deleted.
pub fn refuse_reserved(name: &Name) -> Result<(), PolicyError> {
    if name.as_str().starts_with(RESERVED_PREFIX) {
        return Err(PolicyError::field(
            "name",
            format!("names starting with {RESERVED_PREFIX} are reserved for Spillway's own limits"),
        ));
    }
    Ok(())
}

impl Policy {
    /// What changes with any change of it: its version, and its overrides' changes within.
    pub fn revision(&self) -> (u64, u64) {
        (self.version, self.overrides_rev)
    }

    /// The entity tag the API gives it: `"3"`, or `"3.2"` once its overrides changed twice
    /// within version 3.
    pub fn etag(&self) -> String {
        match self.overrides_rev {
            0 => format!("\"{}\"", self.version),
            r => format!("\"{}.{r}\"", self.version),
        }
    }

    /// The document this policy is stored and exported as (the policy document's shape): everything but
    /// its name and version.
    pub fn document(&self) -> serde_json::Value {
        let mut doc = serde_json::to_value(self).expect("a policy always serializes");
        if let Some(obj) = doc.as_object_mut() {
            obj.remove("name");
            obj.remove("version");
        }
        doc
    }
}

impl Policy {
    /// Parses the policy document `doc` for `name` (version 1; the store numbers versions).
    /// A `managed_by` it holds (an exported document's) is not taken: only the source that
    /// keeps a domain sets it.
    pub fn from_document(name: &str, doc: &Value) -> Result<Self, PolicyError> {
        Self::parse(name, doc, false)
    }

    /// A policy as the store keeps it: [`Policy::from_document`], with its `managed_by`.
    pub fn from_stored(name: &str, doc: &Value) -> Result<Self, PolicyError> {
        Self::parse(name, doc, true)
    }

    fn parse(name: &str, doc: &Value, stored: bool) -> Result<Self, PolicyError> {
        let name = Name::parse(name).map_err(|m| PolicyError::field("name", m))?;
        let obj = doc
            .as_object()
            .ok_or_else(|| PolicyError::field("body", "must be a JSON object"))?;
        reject_unknown(obj, "", FIELDS)?;
        if let Some(given) = obj.get("name")
            && given.as_str() != Some(name.as_str())
        {
            return Err(PolicyError::field(
                "name",
                format!("does not match the policy in the path ({name})"),
            ));
        }
        let description = parse_description(obj)?;
        let mode = enum_field(
            obj,
            "mode",
            &[("enforce", Mode::Enforce), ("shadow", Mode::Shadow)],
        )?;
        let failure_mode = enum_field(
            obj,
            "failure_mode",
            &[("open", FailureMode::Open), ("closed", FailureMode::Closed)],
        )?;
        let strict = match obj.get("strict") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => return Err(PolicyError::field("strict", "must be true or false")),
        };
        let on_deny = enum_field(
            obj,
            "on_deny",
            &[("refuse", OnDeny::Refuse), ("wait", OnDeny::Wait)],
        )?;
        let max_wait_ms = parse_max_wait(obj, on_deny)?;
        let record = enum_field(
            obj,
            "record",
            &[
                ("sample", Recording::Sample),
                ("every", Recording::Every),
                ("off", Recording::Off),
            ],
        )?;
        let record_checks = parse_record_checks(obj)?;
        let mut envoy = parse_envoy(obj)?;
        // An Envoy domain's rules are its limits; any given with it are made again from them.
        let rules = match &mut envoy {
            Some(domain) => domain.rules(),
            None => {
                let rules_value = obj
                    .get("rules")
                    .ok_or_else(|| PolicyError::field("rules", "is required"))?;
                parse_rules(rules_value, "rules")?
            }
        };
        let optional = dimensions::parse_optional(obj, &rules)?;
        let overrides = parse_overrides(obj)?;
        let managed_by = parse_managed_by(obj, stored, envoy.is_some())?;
        Ok(Self {
            name,
            version: 1,
            overrides_rev: 0,
            description,
            mode,
            failure_mode,
            strict,
            optional,
            on_deny,
            max_wait_ms,
            record,
            record_checks,
            rules,
            overrides,
            envoy,
            managed_by,
        })
    }

    /// How long a front door that can hold a request may hold a denied one: `None` when the
    /// policy refuses at once.
    pub fn max_wait(&self) -> Option<std::time::Duration> {
        match self.on_deny {
            OnDeny::Refuse => None,
            OnDeny::Wait => self.max_wait_ms.map(std::time::Duration::from_millis),
        }
    }

    /// The policy an Envoy domain's file becomes (version 1; the store numbers versions).
    pub fn from_envoy(
        mut domain: super::envoy::EnvoyDomain,
        failure_mode: FailureMode,
    ) -> Result<Self, PolicyError> {
        let name = super::envoy::policy_name(&domain.doc.domain)
            .map_err(|m| PolicyError::field("domain", m))?;
        refuse_reserved(&name).map_err(|e| PolicyError::field("domain", e.message))?;
        Ok(Self {
            name,
            version: 1,
            overrides_rev: 0,
            description: format!("Envoy rate limit domain {}", domain.doc.domain),
            mode: Mode::Enforce,
            failure_mode,
            // Envoy's protocol answers a descriptor no limit matches OK, counting nothing.
            strict: Some(false),
            optional: Vec::new(),
            on_deny: OnDeny::Refuse,
            max_wait_ms: None,
            record: Recording::Sample,
            record_checks: None,
            rules: domain.rules(),
            overrides: Vec::new(),
            envoy: Some(domain),
            managed_by: None,
        })
    }

    /// Sets how this policy, when it is an Envoy domain, counts a request over its limit: as
    /// the domain says, or else `default` (the server's). Its rules then count denied hits
    /// (every hit counts) or not (all or nothing).
    pub fn resolve_envoy_counting(&mut self, default: super::envoy::Counting) {
        let Some(domain) = &mut self.envoy else {
            return;
        };
        domain.counts = domain.counting.unwrap_or(default);
        let every_hit = domain.counts == super::envoy::Counting::EveryHit;
        for rule in &mut self.rules {
            rule.count_denied = every_hit;
        }
    }

    /// Puts every limit of this policy, when it is an Envoy domain, in quota mode or not
    /// (the server's `SPILLWAY_ENVOY_QUOTA_MODE`).
    pub fn resolve_envoy_quota(&mut self, quota_all: bool) {
        if let Some(domain) = &mut self.envoy {
            domain.quota_all = quota_all;
        }
    }

    /// Every rule that can hold state for this policy: its own and those of its overrides.
    pub fn all_rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules
            .iter()
            .chain(self.overrides.iter().flat_map(|o| match &o.action {
                super::overrides::Action::Rules(rules) => rules.as_slice(),
                _ => &[],
            }))
    }

    /// Refuses overrides this version adds (those `before` lacks, each of its overrides
    /// standing for one equal override here) that could never apply: see
    /// [`Override::refuse_unmatchable`], or one listed after another of the same match that
    /// lasts as long or longer (ties go to the first listed), where either of the two is
    /// added. A pair `before` already held passes as it is, so a policy read and saved back
    /// is never refused for what it held. Expiries are not compared with the clock here (see
    /// [`Override::refuse_past_expiry`]).
    pub fn refuse_dead_overrides(&self, before: Option<&Policy>) -> Result<(), PolicyError> {
        let mut unclaimed: Vec<&Override> =
            before.map_or_else(Vec::new, |b| b.overrides.iter().collect());
        let added: Vec<bool> = self
            .overrides
            .iter()
            .map(|o| match unclaimed.iter().position(|b| *b == o) {
                Some(at) => {
                    unclaimed.swap_remove(at);
                    false
                }
                None => true,
            })
            .collect();
        for (i, o) in self.overrides.iter().enumerate() {
            let path = format!("overrides[{i}]");
            if added[i] {
                o.refuse_unmatchable(&path)?;
            }
            if let Some(j) =
                (0..i).find(|&j| (added[i] || added[j]) && o.shadowed_by(&self.overrides[j]))
            {
                return Err(PolicyError::field(format!("{path}.match"), shadowed(j)));
            }
        }
        Ok(())
    }

    /// Refuses `added`, found at `path`, as the next override of this policy when one of
    /// the same match already here lasts as long or longer: it would never apply. The
    /// overrides resource and the dashboard's form add one override at a time this way.
    pub fn refuse_shadowed(&self, added: &Override, path: &str) -> Result<(), PolicyError> {
        match self.overrides.iter().position(|e| added.shadowed_by(e)) {
            Some(j) => Err(PolicyError::field(format!("{path}.match"), shadowed(j))),
            None => Ok(()),
        }
    }

    /// Settles whether this policy is strict when its document did not say: as the
    /// version it replaces was, and a new policy is strict (a typo in a dimension is then
    /// a 400 the caller sees at once, not limiting silently off).
    pub fn settle_strict(&mut self, before: Option<&Policy>) {
        if self.strict.is_none() {
            self.strict = Some(before.is_none_or(Policy::is_strict));
        }
    }

    /// Whether a check that meets no rule is refused.
    pub fn is_strict(&self) -> bool {
        self.strict.unwrap_or(false)
    }

    /// The dimensions this policy's rules count, sorted; `None` when a rule counts every
    /// dimension (then every identifier meets it).
    pub fn dimensions(&self) -> Option<Vec<&str>> {
        let mut out: Vec<&str> = Vec::new();
        for rule in &self.rules {
            for d in rule.dimensions.as_ref()? {
                if !out.contains(&d.as_str()) {
                    out.push(d.as_str());
                }
            }
        }
        out.sort_unstable();
        Some(out)
    }

    /// The rules that apply to `identifier` at `now_ms`: the policy's, or the ones of the
    /// override that matches best (exact beats wildcard beats CIDR). `None` means unlimited;
    /// `Some(Err(()))` means blocked.
    pub fn rules_for(&self, identifier: &Identifier, now_ms: i64) -> RulesFor<'_> {
        match super::overrides::best_match(&self.overrides, identifier, now_ms) {
            None => RulesFor::Rules(&self.rules),
            Some(o) => match &o.action {
                super::overrides::Action::Unlimited => RulesFor::Unlimited,
                super::overrides::Action::Block => RulesFor::Blocked,
                super::overrides::Action::Rules(rules) => RulesFor::Rules(rules),
            },
        }
    }
}

impl Policy {
    /// Of `rules` (what [`Policy::rules_for`] gave `identifier`), the ones that count it:
    /// those of its dimension; for an Envoy domain's descriptor (the `envoy` dimension) under
    /// the domain's own rules, only the one limit its entries find, as over gRPC, not every
    /// limit of the domain.
    pub fn counting<'a>(
        &'a self,
        rules: &'a [Rule],
        identifier: &'a Identifier,
    ) -> impl Iterator<Item = &'a Rule> + 'a {
        let only = self
            .envoy
            .as_ref()
            .filter(|_| std::ptr::eq(rules.as_ptr(), self.rules.as_ptr()))
            .filter(|_| identifier.dimension().as_str() == super::envoy::DIMENSION)
            .map(|domain| domain.rule_for(identifier));
        rules
            .iter()
            .enumerate()
            .filter(move |(i, _)| only.is_none_or(|rule| rule == Some(*i)))
            .map(|(_, rule)| rule)
            .filter(|r| r.applies_to(identifier.dimension().as_str()))
    }
}

/// What applies to one identifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RulesFor<'a> {
    Rules(&'a [Rule]),
    Unlimited,
    Blocked,
}

#[cfg(test)]
mod tests;
