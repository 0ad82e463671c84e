//! Every Redis key Spillway uses is built here, and nowhere else.
//!
//! Rule state lives at `<ns>:{<policy>|<dimension>|<value>}:<rule>:<algorithm code>`. The
//! braces are a Redis Cluster hash tag, so every rule of one policy for one identifier shares
//! a slot and a check needs one script call per identifier at most. `{`, `}`, `|` and `%` in
//! any part are percent-encoded, so no value can close the tag early, move its slot, or make
//! two different (policy, identifier) pairs share a key. The algorithm code in the key keeps
//! a rule whose algorithm changed from reading the old algorithm's state.

use crate::domain::{
    Algorithm, Identifier, Name, Rule,
    history::{Step, TopKind},
    people::Username,
};

/// Builds keys under one namespace (`spw` in production; tests use their own).
#[derive(Clone, Debug)]
pub struct Keys {
    namespace: String,
}

impl Default for Keys {
    fn default() -> Self {
        Self::new("spw")
    }
}

impl Keys {
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
        }
    }

    /// The hash tag, braces included, shared by every rule of `policy` for `identifier`.
    pub fn tag(&self, policy: &Name, identifier: &Identifier) -> String {
        let mut out = String::with_capacity(8 + policy.as_str().len() + identifier.value().len());
        self.push_tag(&mut out, policy, identifier);
        out
    }

    fn push_tag(&self, out: &mut String, policy: &Name, identifier: &Identifier) {
        out.push('{');
        escape_into(out, policy.as_str());
        out.push('|');
        escape_into(out, identifier.dimension().as_str());
        out.push('|');
        escape_into(out, identifier.value());
        out.push('}');
    }

    /// Where a reset keeps `identifier`'s state under `policy` for an undo (the state's
    /// slot): a hash, `lua/reset.lua`.
    pub fn reset_stash(&self, policy: &Name, identifier: &Identifier, token: &str) -> String {
        let mut out = format!("{}:", self.namespace);
        self.push_tag(&mut out, policy, identifier);
        out.push_str(":undo:");
        escape_into(&mut out, token);
        out
    }

    /// When `identifier` was last reset under `policy` (µs, Redis's clock; the state's
    /// slot): `lua/reset.lua` writes it, a local rule's flush reads it.
    pub fn reset_epoch(&self, policy: &Name, identifier: &Identifier) -> String {
        let mut out = format!("{}:", self.namespace);
        self.push_tag(&mut out, policy, identifier);
        out.push_str(":reset");
        out
    }

    /// What an undo of the reset `token` must put back (the service's record), for a minute.
    pub fn reset_record(&self, token: &str) -> String {
        let mut out = format!("{}:{{resets}}:", self.namespace);
        escape_into(&mut out, token);
        out
    }

    /// Where `rule` keeps its state for `identifier` under `policy`. On the check path:
    /// built in one allocation.
    pub fn rule_state(
        &self,
        policy: &Name,
        identifier: &Identifier,
        rule: &Name,
        algorithm: &Algorithm,
    ) -> String {
        self.state_key(policy, identifier, "", rule, algorithm)
    }

    /// The state key of `rule` (a policy's or an override's) for `identifier`: an
    /// override's own rules are under `o.<name>` (a rule name has no `.`), so a policy rule
    /// of the same name never shares their counter. A concurrency rule's leases are
    /// addressed by its name from the lease ids callers hold, so an override's stays under
    /// its plain name.
    pub fn rule_key(&self, policy: &Name, identifier: &Identifier, rule: &Rule) -> String {
        let space = if rule.of_override && !matches!(rule.algorithm, Algorithm::Concurrency { .. })
        {
            "o."
        } else {
            ""
        };
        self.state_key(policy, identifier, space, &rule.name, &rule.algorithm)
    }

    fn state_key(
        &self,
        policy: &Name,
        identifier: &Identifier,
        space: &str,
        rule: &Name,
        algorithm: &Algorithm,
    ) -> String {
        let mut out = String::with_capacity(
            self.namespace.len()
                + policy.as_str().len()
                + identifier.dimension().as_str().len()
                + identifier.value().len()
                + rule.as_str().len()
                + 14,
        );
        out.push_str(&self.namespace);
        out.push(':');
        self.push_tag(&mut out, policy, identifier);
        out.push(':');
        out.push_str(space);
        escape_into(&mut out, rule.as_str());
        out.push(':');
        out.push_str(algorithm.kind().code);
        out
    }
}

/// Where a rule's penalty box holds an identifier (until when, µs), beside the rule's state
/// key and in its slot; the check script gets it in KEYS (`held_until` in
/// `lua/check.lua`).
/// The reset epoch ([`Keys::reset_epoch`]) of the identifier whose state key is
/// `state_key`: the key up to its hash tag, then `:reset`.
pub fn reset_epoch_of(state_key: &str) -> String {
    let tag_end = state_key.find('}').map_or(state_key.len(), |i| i + 1);
    format!("{}:reset", &state_key[..tag_end])
}

pub fn penalty_box(state_key: &str) -> String {
    format!("{state_key}:pb")
}

impl Keys {
    /// The sorted set of leases `rule` (a concurrency rule) of `policy` holds for
    /// `identifier`: its state key, as a check builds it.
    pub fn leases(&self, policy: &Name, identifier: &Identifier, rule: &Name) -> String {
        const CONCURRENCY: Algorithm = Algorithm::Concurrency {
            limit: 1,
            lease_ms: 1,
        };
        self.rule_state(policy, identifier, rule, &CONCURRENCY)
    }
}

impl Keys {
    /// Hash of every policy's current version. Policies share the `{policies}` hash tag so
    /// a save is one script on one slot; none of these keys has a TTL.
    pub fn policies(&self) -> String {
        format!("{}:{{policies}}:current", self.namespace)
    }

    /// List of `policy`'s previous versions, newest first.
    pub fn policy_history(&self, policy: &Name) -> String {
        format!("{}:{{policies}}:history:{}", self.namespace, policy)
    }

    /// Counter bumped on every policy change; instances compare it to notice changes.
    pub fn policy_generation(&self) -> String {
        format!("{}:{{policies}}:generation", self.namespace)
    }

    /// Hash of the last version number given to each policy name.
    pub fn policy_versions(&self) -> String {
        format!("{}:{{policies}}:versions", self.namespace)
    }

    /// Pub/sub channel that carries every reset: `<policy>[,<policy>...]|*` and the
    /// identifier, on two lines.
    pub fn reset_channel(&self) -> String {
        format!("{}:resets", self.namespace)
    }

    /// Pub/sub channel that carries the name of every changed policy.
    pub fn policy_channel(&self) -> String {
        format!("{}:policy-changes", self.namespace)
    }
}

impl Keys {
    /// Hash of every user: name -> JSON record. No TTL: users are kept.
    pub fn users(&self) -> String {
        format!("{}:{{people}}:users", self.namespace)
    }

    /// Hash of every API key made in the dashboard or CLI: id -> JSON record (digest only).
    pub fn api_keys(&self) -> String {
        format!("{}:{{people}}:api-keys", self.namespace)
    }

    /// Hash of API key id -> last time it was used (ms), written at most every few seconds.
    pub fn api_key_last_used(&self) -> String {
        format!("{}:{{people}}:api-keys:last-used", self.namespace)
    }

    /// Counter bumped whenever a user or API key changes; instances poll it.
    pub fn people_generation(&self) -> String {
        format!("{}:{{people}}:generation", self.namespace)
    }

    /// One session, by the hex SHA-256 of its id (the id itself is never stored).
    pub fn session(&self, digest_hex: &str) -> String {
        format!("{}:{{sessions}}:s:{digest_hex}", self.namespace)
    }

    /// Set of the session digests of one user, so removing the user ends them all.
    pub fn user_sessions(&self, user: &Username) -> String {
        format!("{}:{{sessions}}:u:{user}", self.namespace)
    }

    /// Live counters (see `lua/stats.lua`), all under `{stats}` with TTLs: the circle of
    /// per-second buckets of `policy`.
    pub fn stats_rate(&self, policy: &str) -> String {
        format!("{}:{{stats}}:persec:{}", self.namespace, escape(policy))
    }

    /// Denials per identifier in minute `minute` (ms since the epoch / 60 000).
    pub fn stats_denied(&self, minute: i64) -> String {
        format!("{}:{{stats}}:denied:{minute}", self.namespace)
    }

    /// Identifiers near their limit in minute `minute`.
    pub fn stats_near(&self, minute: i64) -> String {
        format!("{}:{{stats}}:near:{minute}", self.namespace)
    }

    /// What `policy`'s denials of minute `minute` were (see `lua/stats_detail.lua`).
    pub fn stats_denial_details(&self, policy: &str, minute: i64) -> String {
        format!(
            "{}:{{stats}}:ddetail:{}:{minute}",
            self.namespace,
            escape(policy)
        )
    }

    /// `policy`'s Envoy descriptors that found no limit in ten minutes `slot`, by key shape.
    pub fn stats_unmatched(&self, policy: &str, slot: i64) -> String {
        format!(
            "{}:{{stats}}:unmatched:{}:{slot}",
            self.namespace,
            escape(policy)
        )
    }

    /// `policy`'s checks in ten minutes `slot` that sent dimensions none of its rules
    /// counts, by those dimensions (`usr`, `usr, team`).
    pub fn stats_unused(&self, policy: &str, slot: i64) -> String {
        format!(
            "{}:{{stats}}:unused:{}:{slot}",
            self.namespace,
            escape(policy)
        )
    }

    /// Every policy's checks in ten minutes `slot` that sent dimensions no rule counts, by
    /// policy: what the overview totals.
    pub fn stats_unused_all(&self, slot: i64) -> String {
        format!("{}:{{stats}}:unused-all:{slot}", self.namespace)
    }

    /// `policy`'s recorded checks, for what-if replays: a stream, one entry a check (see
    /// `store/record.rs`).
    pub fn record(&self, policy: &str) -> String {
        format!("{}:{{record:{}}}", self.namespace, escape(policy))
    }

    /// How many checks of `policy` the instances saw in the ten seconds from `bucket_ms`
    /// (recorded or not), which set the level its record samples at
    /// (`domain::whatif::sample`): a number, gone half a minute later.
    /// It shares the record's hash tag: one write of both is one slot on a Cluster.
    pub fn record_rate(&self, policy: &str, bucket_ms: i64) -> String {
        format!(
            "{}:{{record:{}}}:rate:{bucket_ms}",
            self.namespace,
            escape(policy)
        )
    }

    /// `policy`'s streaks of denials of hour `hour` (see `lua/streaks.lua`).
    pub fn stats_streaks(&self, policy: &str, hour: i64) -> String {
        format!(
            "{}:{{stats}}:streak:{}:{hour}",
            self.namespace,
            escape(policy)
        )
    }

    /// `policy`'s own most denied of minute `minute`.
    pub fn stats_policy_denied(&self, policy: &str, minute: i64) -> String {
        format!(
            "{}:{{stats}}:pdenied:{}:{minute}",
            self.namespace,
            escape(policy)
        )
    }

    /// The identifiers checked together in ten minutes `slot` (ms / 600 000).
    pub fn stats_companions(&self, slot: i64) -> String {
        format!("{}:{{stats}}:together:{slot}", self.namespace)
    }

    /// The distinct companions of a shared identifier (one with more than the companions
    /// hash keeps) in ten minutes `slot`: a HyperLogLog.
    pub fn stats_companion_count(&self, identifier: &str, slot: i64) -> String {
        format!(
            "{}:{{stats}}:together-n:{}:{slot}",
            self.namespace,
            escape(identifier)
        )
    }

    /// History (see `store/history.rs`): one block of `step` counts of `scope` (a policy,
    /// or `*` for every policy together), a hash with a TTL past its retention.
    pub fn history_counts(&self, scope: &str, step: Step, block: i64) -> String {
        format!(
            "{}:hist:{{{}}}:{}:{block}",
            self.namespace,
            escape(scope),
            step.as_str()
        )
    }

    /// History: the top list of `kind` of `scope` in one period of `step` (hour or day), a
    /// sorted set with a TTL.
    pub fn history_top(&self, scope: &str, kind: TopKind, step: Step, period: i64) -> String {
        format!(
            "{}:hist:{{{}}}:top:{}:{}:{period}",
            self.namespace,
            escape(scope),
            kind.as_str(),
            step.as_str()
        )
    }

    /// Alert rules: a hash of name → rule document, without a TTL (configuration, like the
    /// policies). The other alert keys share the `{alerts}` tag and have TTLs.
    pub fn alert_rules(&self) -> String {
        format!("{}:{{alerts}}:rules", self.namespace)
    }

    /// Which instance evaluates the alerts now (see `lua/alerts_lease.lua`).
    pub fn alert_lease(&self) -> String {
        format!("{}:{{alerts}}:lease", self.namespace)
    }

    /// What fires now: `<rule>|<subject>` → the firing's record.
    pub fn alert_firing(&self) -> String {
        format!("{}:{{alerts}}:firing", self.namespace)
    }

    /// Deliveries waiting to be sent (or retried): id → delivery.
    pub fn alert_outbox(&self) -> String {
        format!("{}:{{alerts}}:outbox", self.namespace)
    }

    /// The latest deliveries and failures, newest first.
    pub fn alert_deliveries(&self) -> String {
        format!("{}:{{alerts}}:deliveries", self.namespace)
    }

    /// The audit log: a stream nothing in the app trims or edits.
    pub fn audit_log(&self) -> String {
        format!("{}:{{audit}}:log", self.namespace)
    }
}

/// Percent-encodes the characters that could steer or collide keys.
fn escape(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    escape_into(&mut out, part);
    out
}

fn escape_into(out: &mut String, part: &str) {
    for c in part.chars() {
        match c {
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            '|' => out.push_str("%7C"),
            '%' => out.push_str("%25"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(raw: &str) -> Identifier {
        Identifier::parse(raw).unwrap()
    }

    fn name(raw: &str) -> Name {
        Name::parse(raw).unwrap()
    }

    const FW: Algorithm = Algorithm::FixedWindow {
        limit: 1,
        window_ms: 1000,
    };

    #[test]
    fn layout_matches_the_spec() {
        let keys = Keys::default();
        assert_eq!(
            keys.rule_state(
                &name("api"),
                &id("ip=203.0.113.7"),
                &name("per-second"),
                &FW
            ),
            "spw:{api|ip|203.0.113.7}:per-second:fw"
        );
    }

    #[test]
    fn braces_bars_and_percents_are_encoded() {
        let keys = Keys::default();
        let key = keys.rule_state(&name("a"), &id("user=}{x|y%"), &name("r"), &FW);
        assert_eq!(key, "spw:{a|user|%7D%7Bx%7Cy%25}:r:fw");
        assert_eq!(key.matches('{').count(), 1);
        assert_eq!(key.matches('}').count(), 1);
    }

    #[test]
    fn an_encoded_value_cannot_pose_as_another() {
        let keys = Keys::default();
        let a = keys.rule_state(&name("a"), &id("user=%7C"), &name("r"), &FW);
        let b = keys.rule_state(&name("a"), &id("user=|"), &name("r"), &FW);
        assert_ne!(a, b);
    }
}
