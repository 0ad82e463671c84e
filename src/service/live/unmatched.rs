//! What a policy's checks sent that nothing of it counts, by shape: Envoy descriptors that
//! found no limit in their domain's file, by their keys in order (`remote_address › PATH`),
//! and dimensions of JSON checks no rule counts (`usr`). Bounded: `MAX_SHAPES` shapes per
//! policy between two flushes; the rest are counted as "other".

use std::collections::HashMap;

/// Distinct key shapes one domain keeps between two flushes; more go to `OTHER`.
const MAX_SHAPES: usize = 50;
/// Where shapes past `MAX_SHAPES` are counted.
pub const OTHER: &str = "(other keys)";

#[derive(Default)]
pub(super) struct Unmatched {
    policies: HashMap<String, HashMap<String, u64>>,
}

impl Unmatched {
    /// Counts one descriptor of `policy`'s domain with `entries` that found no limit.
    pub(super) fn count(&mut self, policy: &str, entries: &[(String, String)]) {
        let shape: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        self.count_shape(policy, shape.join(" › "));
    }

    /// Counts one check of `policy` of `shape`.
    pub(super) fn count_shape(&mut self, policy: &str, shape: String) {
        if !self.policies.contains_key(policy) {
            self.policies.insert(policy.to_owned(), HashMap::new());
        }
        let shapes = self.policies.get_mut(policy).expect("inserted above");
        let key = if shapes.contains_key(&shape) || shapes.len() < MAX_SHAPES {
            shape
        } else {
            OTHER.to_owned()
        };
        *shapes.entry(key).or_default() += 1;
    }

    /// What was counted since the last drain, per policy.
    pub(super) fn drain(&mut self) -> Vec<(String, Vec<(String, u64)>)> {
        self.policies
            .drain()
            .map(|(p, shapes)| (p, shapes.into_iter().collect()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_keys_in_order_and_bounded() {
        let mut u = Unmatched::default();
        let e = |keys: &[&str]| -> Vec<(String, String)> {
            keys.iter()
                .map(|k| ((*k).to_owned(), "v".to_owned()))
                .collect()
        };
        u.count("gw", &e(&["remote_address", "PATH"]));
        u.count("gw", &e(&["remote_address", "PATH"]));
        for i in 0..60 {
            u.count("gw", &e(&[&format!("k{i}")]));
        }
        let drained = u.drain();
        let shapes: HashMap<String, u64> = drained[0].1.iter().cloned().collect();
        assert_eq!(shapes["remote_address › PATH"], 2);
        assert_eq!(shapes.len(), MAX_SHAPES + 1);
        assert_eq!(shapes[OTHER], 11);
        assert!(u.drain().is_empty());
    }
}
