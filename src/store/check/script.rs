//! The check script: one Lua script assembled from the prelude, the algorithms a check
//! uses and the check's own part, loaded once.

use std::sync::OnceLock;

use redis::Script;

use crate::domain::Algorithm;

/// The algorithm files the check script is assembled from, by their codes in `keys.rs`.
pub(in crate::store) const ALGORITHM_FILES: [(&str, &str); 9] = [
    ("fw", include_str!("../../../lua/fixed_window.lua")),
    ("lw", include_str!("../../../lua/sliding_log.lua")),
    ("sw", include_str!("../../../lua/sliding_window.lua")),
    ("tb", include_str!("../../../lua/token_bucket.lua")),
    ("lb", include_str!("../../../lua/leaky_bucket.lua")),
    ("gc", include_str!("../../../lua/gcra.lua")),
    ("bw", include_str!("../../../lua/bucketed_window.lua")),
    ("cc", include_str!("../../../lua/concurrency.lua")),
    ("qt", include_str!("../../../lua/quota.lua")),
];

/// The check script for each mix of algorithms, built on first use: the shared prelude, the
/// files of just the algorithms the check uses, the live counters, then the driver that reads
/// KEYS and ARGV. Still one script and one round trip per check, whatever the mix; leaving
/// out the algorithms a check does not use spares Redis defining them on every call
/// (benches/DESIGN.md).
pub(in crate::store) struct CheckScripts([OnceLock<Script>; 1 << ALGORITHM_FILES.len()]);

impl CheckScripts {
    pub(in crate::store) fn new() -> Self {
        Self(std::array::from_fn(|_| OnceLock::new()))
    }

    /// The script for checks of these algorithms.
    pub(in crate::store) fn for_algorithms<'a>(
        &self,
        algorithms: impl Iterator<Item = &'a Algorithm>,
    ) -> &Script {
        let mask = algorithms.fold(0usize, |mask, a| {
            let code = a.kind().code;
            mask | 1
                << ALGORITHM_FILES
                    .iter()
                    .position(|(c, _)| *c == code)
                    .expect("every algorithm code has a file")
        });
        self.0[mask].get_or_init(|| Script::new(&check_source(mask)))
    }
}

/// The source of the check script for the algorithms in `mask` (bits in ALGORITHM_FILES order).
pub(super) fn check_source(mask: usize) -> String {
    let mut parts = vec![include_str!("../../../lua/prelude.lua")];
    parts.extend(
        ALGORITHM_FILES
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & 1 << i != 0)
            .map(|(_, (_, source))| *source),
    );
    parts.push(include_str!("../../../lua/stats.lua"));
    parts.push(include_str!("../../../lua/check.lua"));
    parts.join("\n")
}
