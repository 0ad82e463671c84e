//! How a request descriptor finds its limit in the tree, as envoyproxy/ratelimit matches
//! it (key and value beat a value with `*` wildcards, which beats the key alone; a limit
//! applies only where the descriptor's last entry lands), and the name it is measured under.

use super::*;

/// Finding a request descriptor's limit.
impl EnvoyDomain {
    /// The limit a request descriptor finds, if any (none: the descriptor is OK and
    /// consumes nothing).
    pub fn find(&self, entries: &[(String, String)]) -> Option<&Limit> {
        self.lookup(entries).map(|found| found.limit)
    }

    /// The limit a request descriptor finds, with what it is counted and measured under.
    pub fn lookup(&self, entries: &[(String, String)]) -> Option<Found<'_>> {
        let mut level = &self.root;
        let mut shared: Option<Vec<(String, String)>> = None;
        let mut metric = vec![self.doc.domain.clone()];
        for (i, (key, value)) in entries.iter().enumerate() {
            let (n, matched) = level.matching(key, value)?;
            let node = &self.nodes[n];
            if node.shares
                && let Matched::Wildcard(pattern) = matched
            {
                shared.get_or_insert_with(|| entries.to_vec())[i].1 = pattern.to_owned();
            }
            metric.push(metric_segment(key, value, matched, node));
            if i + 1 == entries.len() {
                let limit = &self.limits[node.limit?];
                if limit.detailed_metric {
                    metric = detailed_key(&self.doc.domain, entries, shared.as_deref());
                }
                return Some(Found {
                    limit,
                    shared,
                    metric_key: metric.join("."),
                });
            }
            level = &node.children;
        }
        None
    }
}

/// What a request descriptor finds in a domain: the limit; when an entry matched a wildcard
/// with `share_threshold`, the entries it is counted under (that entry's value is the
/// pattern, so every value it matches shares one counter); and its metric key, as
/// envoyproxy/ratelimit names its statistics (`domain.key_value.key`: configured values,
/// request values only for `value_to_metric` or `detailed_metric`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found<'a> {
    pub limit: &'a Limit,
    pub shared: Option<Vec<(String, String)>>,
    pub metric_key: String,
}

/// How an entry of a request found its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Matched<'a> {
    /// Its key and value, as configured.
    Exact,
    /// A configured wildcard value (the pattern).
    Wildcard(&'a str),
    /// Its key alone (the configuration has no value).
    Key,
}

impl Level {
    /// The node an entry lands on: key and value beat a wildcard, which beats the key
    /// alone.
    fn matching(&self, key: &str, value: &str) -> Option<(usize, Matched<'_>)> {
        if let Some(&n) = self.exact.get(key).and_then(|values| values.get(value)) {
            return Some((n, Matched::Exact));
        }
        if let Some((pattern, n)) = self
            .wildcards
            .get(key)
            .and_then(|ws| ws.iter().find(|(pattern, _)| glob(pattern, value)))
        {
            return Some((*n, Matched::Wildcard(pattern)));
        }
        self.any.get(key).map(|&n| (n, Matched::Key))
    }
}

/// An entry's part of a metric key: `key_value` for a configured value (a shared wildcard's
/// part before its first `*`), the request's value with `value_to_metric`, else `key`.
fn metric_segment(key: &str, value: &str, matched: Matched<'_>, node: &Node) -> String {
    match matched {
        Matched::Exact => format!("{key}_{value}"),
        Matched::Wildcard(pattern) if node.shares => {
            format!("{key}_{}", pattern.split('*').next().unwrap_or_default())
        }
        Matched::Wildcard(_) | Matched::Key if node.value_to_metric => format!("{key}_{value}"),
        Matched::Wildcard(pattern) => format!("{key}_{pattern}"),
        Matched::Key => key.to_owned(),
    }
}

/// The metric key of `detailed_metric`: every entry's key and value as the request sent
/// them (a shared wildcard's part before its `*`).
fn detailed_key(
    domain: &str,
    entries: &[(String, String)],
    shared: Option<&[(String, String)]>,
) -> Vec<String> {
    let mut key = vec![domain.to_owned()];
    for (i, (k, v)) in entries.iter().enumerate() {
        let v = match shared.map(|s| s[i].1.as_str()) {
            Some(pattern) if pattern != v => pattern.split('*').next().unwrap_or_default(),
            _ => v.as_str(),
        };
        key.push(format!("{k}_{v}"));
    }
    key
}

/// Whether `value` matches `pattern`, where each `*` stands for any run of characters
/// (none included): the literal parts must appear in order, the first at the start and the
/// last at the end.
pub(super) fn glob(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}
