//! Changes every instance must hear about at once, over Redis pub/sub: a policy changed,
//! or an identifier was reset (so over-limit caches forget it).

use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::{Store, StoreError};
use crate::domain::{Identifier, Name, Policy};

/// Something another instance (or this one) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    PolicyChanged(String),
    /// `policies: None` means every policy.
    Reset {
        policies: Option<Vec<String>>,
        identifier: Identifier,
    },
}

/// How long a reset's epoch is kept: longer than any local rule's flush can be on its way
/// (a flush period, then retries within the rule's grace).
const RESET_EPOCH_MS: u64 = 3_600_000;

impl Store {
    /// Events as they are published. The receiver ends when the subscription breaks; the
    /// caller subscribes again (and polls the policy generation meanwhile).
    pub async fn subscribe(&self) -> Result<mpsc::Receiver<Event>, StoreError> {
        let client = self
            .pubsub_client()
            .ok_or_else(|| StoreError::Unsupported("pub/sub needs a single Redis"))?;
        let mut pubsub = client.get_async_pubsub().await?;
        let (policies, resets) = (self.keys.policy_channel(), self.keys.reset_channel());
        pubsub
            .subscribe(&[policies.as_str(), resets.as_str()])
            .await?;
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            let mut messages = pubsub.on_message();
            // Ends when the subscriber goes away, even while no message comes.
            while let Some(msg) = tokio::select! {
                msg = messages.next() => msg,
                () = tx.closed() => None,
            } {
                let payload: String = msg.get_payload().unwrap_or_default();
                let event = if msg.get_channel_name() == policies {
                    Some(Event::PolicyChanged(payload))
                } else {
                    parse_reset(&payload)
                };
                if let Some(event) = event
                    && tx.send(event).await.is_err()
                {
                    break;
                }
            }
        });
        Ok(rx)
    }

    /// Deletes the state `identifier` has under `policies` (every rule, or only `rule`), and
    /// tells every instance. The keys are kept for `undo.1` in a stash named by `undo.0`
    /// (`lua/reset.lua`), for [`Store::undo_reset`]. Returns how many keys were deleted.
    pub async fn reset_identifier(
        &self,
        policies: &[&Policy],
        identifier: &Identifier,
        rule: Option<&Name>,
        all_policies: bool,
        undo: (&str, std::time::Duration),
    ) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for policy in policies {
            let (mut keys, leases) = self.state_keys(policy, identifier, rule);
            keys.extend(self.caller_limit_keys(policy, identifier, rule).await?);
            if !leases.is_empty() {
                let n: u64 = self.query_for_write(redis::cmd("DEL").arg(&leases)).await?;
                deleted += n;
            }
            // One identifier's keys under one policy share a slot (the stash's and the
            // epoch's too). Run even with no state: the epoch stops a local rule's flush
            // on its way from writing what the reset meant to clear.
            let mut invocation = self.scripts.reset.prepare_invoke();
            invocation
                .key(self.keys.reset_stash(&policy.name, identifier, undo.0))
                .key(self.keys.reset_epoch(&policy.name, identifier))
                .arg(undo.1.as_millis() as u64)
                .arg(RESET_EPOCH_MS);
            for key in &keys {
                invocation.key(key);
            }
            let n: u64 = self.invoke_write(&invocation).await?;
            deleted += n;
        }
        let scope = if all_policies {
            "*".to_owned()
        } else {
            policies
                .iter()
                .map(|p| p.name.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        self.forget_denials(&scope, identifier).await?;
        Ok(deleted)
    }

    /// Puts back the state a reset stashed under `token` (`lua/reset_undo.lua`), each key
    /// with the time it had left; the stash goes. Returns how many keys came back.
    pub async fn undo_reset(
        &self,
        policies: &[&Policy],
        identifier: &Identifier,
        rule: Option<&Name>,
        token: &str,
    ) -> Result<u64, StoreError> {
        let mut restored = 0;
        for policy in policies {
            let (mut keys, _) = self.state_keys(policy, identifier, rule);
            let stash = self.keys.reset_stash(&policy.name, identifier, token);
            // The counters under numbers callers sent, as the reset found them.
            let fields: Vec<String> = self
                .query_for_write(redis::cmd("HKEYS").arg(&stash))
                .await?;
            for field in fields {
                if let Some(key) = field.strip_prefix("d:")
                    && !keys.iter().any(|k| k == key)
                {
                    keys.push(key.to_owned());
                }
            }
            let mut invocation = self.scripts.reset_undo.prepare_invoke();
            invocation.key(stash);
            for key in &keys {
                invocation.key(key);
            }
            let n: u64 = self.invoke_write(&invocation).await?;
            restored += n;
        }
        Ok(restored)
    }

    /// The counters (and penalty boxes) `identifier` has under numbers callers sent for the
    /// rules of `policy` that take them (`limits`; `~` after the rule's state key), found
    /// with SCAN. One Redis at a time only: on a Cluster they run out with their windows.
    async fn caller_limit_keys(
        &self,
        policy: &Policy,
        identifier: &Identifier,
        rule: Option<&Name>,
    ) -> Result<Vec<String>, StoreError> {
        let mut found = Vec::new();
        if self.is_cluster() {
            return Ok(found);
        }
        for r in policy
            .rules
            .iter()
            .filter(|r| r.caller_max.is_some() && rule.is_none_or(|name| &r.name == name))
        {
            let key = self
                .keys
                .rule_state(&policy.name, identifier, &r.name, &r.algorithm);
            let pattern = format!("{}~*", glob_escaped(&key));
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) = self
                    .query_for_write(
                        redis::cmd("SCAN")
                            .arg(cursor)
                            .arg("MATCH")
                            .arg(&pattern)
                            .arg("COUNT")
                            .arg(1000),
                    )
                    .await?;
                found.extend(keys);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(found)
    }

    /// The state keys of `identifier` under `policy` (every rule's, or only `rule`'s): those
    /// an undo may put back, and the leases of concurrency rules, which it may not (a lease
    /// released since would come back and hold its slot with no one to release it; one
    /// taken since would be dropped, letting more run than the limit).
    fn state_keys(
        &self,
        policy: &Policy,
        identifier: &Identifier,
        rule: Option<&Name>,
    ) -> (Vec<String>, Vec<String>) {
        let mut kept = Vec::new();
        let mut leases = Vec::new();
        for r in policy
            .all_rules()
            .filter(|r| rule.is_none_or(|name| &r.name == name))
        {
            let key = self.keys.rule_key(&policy.name, identifier, r);
            // Its penalty box, if it holds one: a reset lifts it, an undo puts it back.
            kept.push(super::keys::penalty_box(&key));
            match r.algorithm {
                crate::domain::Algorithm::Concurrency { .. } => leases.push(key),
                _ => kept.push(key),
            }
        }
        (kept, leases)
    }

    /// Keeps what an undo needs to know of a reset (`record`, the service's) under `token`
    /// for `ttl`.
    pub async fn put_reset_record(
        &self,
        token: &str,
        record: &str,
        ttl: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.query_for_write(
            redis::cmd("SET")
                .arg(self.keys.reset_record(token))
                .arg(record)
                .arg("PX")
                .arg(ttl.as_millis() as u64),
        )
        .await
    }

    /// The record of the reset `token` names, while it can be undone.
    pub async fn reset_record(&self, token: &str) -> Result<Option<String>, StoreError> {
        self.query_for_write(redis::cmd("GET").arg(self.keys.reset_record(token)))
            .await
    }

    /// Takes the record of the reset `token` names, once: a second undo finds nothing.
    pub async fn take_reset_record(&self, token: &str) -> Result<Option<String>, StoreError> {
        self.query_for_write(redis::cmd("GETDEL").arg(self.keys.reset_record(token)))
            .await
    }

    /// Tells every instance to forget its cached denials of `identifier` under `scope`
    /// (`*`, or policy names joined by `,`): its state changed other than by a check.
    pub async fn forget_denials(
        &self,
        scope: &str,
        identifier: &Identifier,
    ) -> Result<(), StoreError> {
        let _: i64 = self
            .query(
                redis::cmd("PUBLISH")
                    .arg(self.keys.reset_channel())
                    .arg(format!("{scope}\n{identifier}")),
            )
            .await?;
        Ok(())
    }
}

fn parse_reset(payload: &str) -> Option<Event> {
    let (scope, identifier) = payload.split_once('\n')?;
    let identifier = Identifier::parse(identifier).ok()?;
    let policies = (scope != "*").then(|| scope.split(',').map(str::to_owned).collect());
    Some(Event::Reset {
        policies,
        identifier,
    })
}

/// `raw` as a SCAN pattern that matches it literally.
fn glob_escaped(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
