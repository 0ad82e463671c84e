//! [`Admin`]: what support does from code with an admin key (or a support one): reset an
//! identifier's counters (and undo it), read an identifier's state, add and remove a
//! policy's overrides. Every change is audited by Spillway under the key's name.

use std::time::Duration;

use http::StatusCode;
use reqwest::Method;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::Value;

use crate::client::problem_detail;
use crate::{Error, cause};

/// Admin calls write policies and audit records: a longer budget than a check's.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Spillway's admin API with an admin key. Cheap to clone.
///
/// ```no_run
/// # use spillway_client::{Admin, Override, Reset};
/// # async fn run() -> Result<(), spillway_client::Error> {
/// let admin = Admin::new("http://spillway:3000", "spw_adm_…")?;
/// let done = admin.reset("user", "42", &Reset::reason("ticket 1234").policy("api")).await?;
/// if let Some(undo) = done.undo { admin.undo_reset(&undo.token).await?; }
/// let list = admin.add_override("api", &Override::unlimited("user=vip-*").reason("partners")).await?;
/// admin.remove_override("api", list.index_of("user=vip-*").unwrap()).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Admin {
    http: reqwest::Client,
    base: String,
    key: String,
    timeout: Duration,
}

/// Which counters a reset deletes, and why (kept in the audit log).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reset {
    /// Only this policy's; all policies' when `None`.
    pub policy: Option<String>,
    /// Only this rule's (needs `policy`).
    pub rule: Option<String>,
    /// Why, at most 500 characters.
    pub reason: String,
}

impl Reset {
    /// Every policy's counters, for this reason.
    pub fn reason(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            ..Self::default()
        }
    }

    /// Only this policy's.
    pub fn policy(mut self, policy: impl Into<String>) -> Self {
        self.policy = Some(policy.into());
        self
    }

    /// Only this rule's of the policy.
    pub fn rule(mut self, rule: impl Into<String>) -> Self {
        self.rule = Some(rule.into());
        self
    }
}

/// What a reset did.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct ResetDone {
    /// `dimension=value`, canonical (an IP address as Spillway counts it).
    pub identifier: String,
    /// The policies whose counters were reset.
    pub policies: Vec<String>,
    pub deleted_keys: u64,
    /// Present when counters were deleted: [`Admin::undo_reset`] puts them back within a
    /// minute.
    pub undo: Option<Undo>,
}

/// How to undo a reset.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Undo {
    pub token: String,
    /// Until when (Unix ms).
    pub until_ms: i64,
}

/// What an undo put back.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct ResetUndone {
    pub identifiers: Vec<String>,
    pub restored_keys: u64,
}

/// What an override does.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OverrideAction {
    Unlimited,
    Block,
    /// Its `rules` instead of the policy's.
    Limit,
}

/// One override of a policy (`POST /api/v1/policies/{name}/overrides`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Override {
    /// `user=42`, `user=vip-*`, `ip=10.0.0.0/8`.
    #[serde(rename = "match")]
    pub matches: String,
    pub action: OverrideAction,
    /// With [`OverrideAction::Limit`]: rule documents, as a policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<Value>>,
    /// Unix ms after which it no longer applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Override {
    fn new(matches: impl Into<String>, action: OverrideAction, rules: Option<Vec<Value>>) -> Self {
        Self {
            matches: matches.into(),
            action,
            rules,
            expires_at_ms: None,
            reason: None,
        }
    }

    /// No limit for what `matches` names.
    pub fn unlimited(matches: impl Into<String>) -> Self {
        Self::new(matches, OverrideAction::Unlimited, None)
    }

    /// Every check of what `matches` names denied.
    pub fn block(matches: impl Into<String>) -> Self {
        Self::new(matches, OverrideAction::Block, None)
    }

    /// These rules (documents as a policy's) instead of the policy's.
    pub fn limit(matches: impl Into<String>, rules: Vec<Value>) -> Self {
        Self::new(matches, OverrideAction::Limit, Some(rules))
    }

    /// Ends at this time (Unix ms).
    pub fn expires_at_ms(mut self, at: i64) -> Self {
        self.expires_at_ms = Some(at);
        self
    }

    /// Why (kept with it and in the audit log).
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }
}

/// A policy's overrides after a change, in the order that breaks ties.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Overrides {
    pub policy: String,
    pub version: u64,
    pub overrides: Vec<Override>,
}

impl Overrides {
    /// The place of the first override matching `matches` (as Spillway wrote it), for
    /// [`Admin::remove_override`].
    pub fn index_of(&self, matches: &str) -> Option<usize> {
        self.overrides.iter().position(|o| o.matches == matches)
    }
}

impl Admin {
    /// The admin API of the Spillway at `base_url`, with an admin (or support) key, a
    /// timeout of 5 s.
    pub fn new(base_url: impl Into<String>, key: impl Into<String>) -> Result<Self, Error> {
        let http = reqwest::Client::builder().build().map_err(|e| {
            Error::Unavailable(format!("building the HTTP client: {}", cause::chain(&e)))
        })?;
        Ok(Self {
            http,
            base: base_url.into().trim_end_matches('/').to_owned(),
            key: key.into(),
            timeout: ADMIN_TIMEOUT,
        })
    }

    /// Another timeout for every call.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Resets the counters of `dimension=value` (`DELETE /api/v1/identifiers/{dimension}/{value}`):
    /// every instance of Spillway forgets its cached denials of it at once (a
    /// [`Client`](crate::Client)'s own denial cache keeps one at most
    /// [`MAX_CACHED`](crate::MAX_CACHED)).
    pub async fn reset(
        &self,
        dimension: &str,
        value: &str,
        reset: &Reset,
    ) -> Result<ResetDone, Error> {
        let mut query: Vec<(&str, &str)> = vec![("reason", reset.reason.as_str())];
        query.extend(reset.policy.as_deref().map(|p| ("policy", p)));
        query.extend(reset.rule.as_deref().map(|r| ("rule", r)));
        let path = format!(
            "/api/v1/identifiers/{}/{}",
            segment(dimension),
            segment(value)
        );
        self.call(Method::DELETE, &path, &query, None).await
    }

    /// Puts back what a reset deleted (its [`Undo::token`]), within a minute, once.
    pub async fn undo_reset(&self, token: &str) -> Result<ResetUndone, Error> {
        let path = format!("/api/v1/resets/{}/undo", segment(token));
        self.call(Method::POST, &path, &[], None).await
    }

    /// The live state of every rule of every policy for `dimension=value` (a peek), as
    /// Spillway's JSON (`{"identifier", "policies": [{"policy", "rules": [...]}]}`).
    pub async fn inspect(&self, dimension: &str, value: &str) -> Result<Value, Error> {
        let path = format!(
            "/api/v1/identifiers/{}/{}",
            segment(dimension),
            segment(value)
        );
        self.call(Method::GET, &path, &[], None).await
    }

    /// A policy's overrides.
    pub async fn overrides(&self, policy: &str) -> Result<Overrides, Error> {
        let path = format!("/api/v1/policies/{}/overrides", segment(policy));
        self.call(Method::GET, &path, &[], None).await
    }

    /// Adds an override, last in the list: in effect on every instance at once. Answers the
    /// list as it now is.
    pub async fn add_override(&self, policy: &str, added: &Override) -> Result<Overrides, Error> {
        let path = format!("/api/v1/policies/{}/overrides", segment(policy));
        let body = serde_json::to_value(added).expect("an override is JSON");
        self.call(Method::POST, &path, &[], Some(body)).await
    }

    /// Removes the override at `index` (from 0; [`Overrides::index_of`] finds it). Answers
    /// the list as it now is.
    pub async fn remove_override(&self, policy: &str, index: usize) -> Result<Overrides, Error> {
        let path = format!("/api/v1/policies/{}/overrides/{index}", segment(policy));
        self.call(Method::DELETE, &path, &[], None).await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Value>,
    ) -> Result<T, Error> {
        let url = format!("{}{path}", self.base);
        let mut request = (self.http.request(method, &url))
            .bearer_auth(&self.key)
            .timeout(self.timeout)
            .query(query);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let unavailable =
            |e: reqwest::Error| Error::Unavailable(cause::describe(&e, &url, self.timeout));
        let response = request.send().await.map_err(unavailable)?;
        let status = response.status();
        if status.is_success() {
            return response.json::<T>().await.map_err(unavailable);
        }
        let detail = problem_detail(response).await;
        Err(
            if status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT {
                Error::Unavailable(format!("{status} from {url}: {detail}"))
            } else {
                Error::Refused { status, detail }
            },
        )
    }
}

/// A path segment, percent-encoded: an identifier's value may hold `/`, `?`, `%` or spaces.
fn segment(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for byte in raw.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_path_segment_is_percent_encoded() {
        assert_eq!(super::segment("vip-1.a_b~"), "vip-1.a_b~");
        assert_eq!(super::segment("10.0.0.0/8"), "10.0.0.0%2F8");
        assert_eq!(super::segment("a b?%é"), "a%20b%3F%25%C3%A9");
    }
}
