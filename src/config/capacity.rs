//! What one instance may hold at once, derived from the memory it is given and the file
//! descriptors it has: connections per port, calls waiting for their message per port, and
//! requests held by policies that wait. Each has its own setting; unset, it follows from
//! the memory budget, and a connection cap is always clamped to the descriptors left after
//! Redis, files and the other port.
//!
//! The worst case, every connection as full as a hostile client can make it:
//!
//! ```text
//! memory ≤ BASE + 2 × connections × PER_CONNECTION + 2 × pending × PER_PENDING_CALL
//!                + waiting × PER_WAITING
//! ```
//!
//! The defaults spend 3/4 of the budget on connections and 1/16 on pending calls; the rest
//! (about 3/16) is the process itself (BASE) and its caches. `tests/it/memory_bound.rs`
//! measures the figures below against the built binary.

use super::ConfigError;

/// What one connection can make the server hold at worst: the HTTP/2 connection window
/// (256 KiB, what a client may send before the server reads it), the codec's buffers and its
/// table of streams (128 a connection, each refused or answered at once past the budgets).
/// Measured: 400 gRPC connections each opening every stream they may (with 5 bytes of a
/// message each) grew the process by about 250 KiB a connection (`tests/it/memory_bound.rs`);
/// a client that also fills the window adds up to 256 KiB more. The socket's buffers in the
/// kernel are not counted (they are not the process's).
pub const PER_CONNECTION: u64 = 512 * 1024;

/// What one call the server has started but whose message or body it has not read yet may
/// hold: its task and future, and the bytes of its message read so far.
pub const PER_PENDING_CALL: u64 = 48 * 1024;

/// What one request held by a policy that waits holds (its task and the decision it waits
/// to turn).
pub const PER_WAITING: u64 = 16 * 1024;

/// The memory budget when neither `SPILLWAY_MEMORY_BUDGET_MB` nor a cgroup limit says one.
pub const DEFAULT_BUDGET_MB: u64 = 1024;

/// Descriptors kept back from the connection caps: Redis connections (one per instance,
/// Sentinel's and the subscriptions), the domains folder, TLS files, the log, the
/// listeners themselves.
pub const RESERVED_DESCRIPTORS: u64 = 64;

/// The caps in force, and what was clamped on the way (said once at start).
#[derive(Clone, Debug)]
pub struct Capacity {
    /// Where the memory budget came from, and its size in MiB.
    pub budget_mb: u64,
    pub budget_source: &'static str,
    /// Connections each port (HTTP, gRPC) holds open at most.
    pub max_connections: usize,
    /// Calls (HTTP requests, gRPC streams) each port has started and not yet read the
    /// message of; past it a new call is refused at once.
    pub max_pending: usize,
    /// Denied requests held at once by policies that wait.
    pub max_waiting: usize,
    /// A setting lowered to fit the descriptors there are.
    pub clamped: Option<String>,
}

impl Capacity {
    /// From the settings (`SPILLWAY_MEMORY_BUDGET_MB`, `SPILLWAY_MAX_CONNECTIONS`,
    /// `SPILLWAY_MAX_PENDING_CALLS`, `SPILLWAY_MAX_WAITING`), the cgroup's memory limit
    /// (`cgroup_limit`, bytes) and the soft descriptor limit (`nofile`).
    pub fn derive(
        lookup: &impl Fn(&str) -> Option<String>,
        cgroup_limit: Option<u64>,
        nofile: u64,
    ) -> Result<Self, ConfigError> {
        let (budget_mb, budget_source) = match count(lookup, "SPILLWAY_MEMORY_BUDGET_MB")? {
            Some(mb) => (mb, "SPILLWAY_MEMORY_BUDGET_MB"),
            None => match cgroup_limit {
                Some(bytes) => ((bytes >> 20).max(64), "the cgroup's memory limit"),
                None => (DEFAULT_BUDGET_MB, "the default"),
            },
        };
        let budget = budget_mb << 20;
        let derived_connections = (budget * 3 / 4 / 2 / PER_CONNECTION).clamp(16, 10_000);
        let derived_pending = (budget / 16 / 2 / PER_PENDING_CALL).clamp(16, 4_096);
        let mut max_connections =
            count(lookup, "SPILLWAY_MAX_CONNECTIONS")?.unwrap_or(derived_connections);
        let max_pending = count(lookup, "SPILLWAY_MAX_PENDING_CALLS")?.unwrap_or(derived_pending);
        // Both ports' connections, within what the process may open.
        let for_connections = nofile.saturating_sub(RESERVED_DESCRIPTORS) / 2;
        let mut clamped = None;
        if max_connections > for_connections {
            clamped = Some(format!(
                "connections per port lowered from {max_connections} to {} to fit the \
                 open-file limit ({nofile} descriptors, {RESERVED_DESCRIPTORS} kept back); \
                 raise `ulimit -n` for more",
                for_connections.max(1)
            ));
            max_connections = for_connections.max(1);
        }
        // Waiting holds a connection (HTTP/1.1) or a stream: a quarter of the connections at
        // most, so waiting requests never take the port from other callers.
        let max_waiting = count(lookup, "SPILLWAY_MAX_WAITING")?
            .unwrap_or((max_connections / 4).max(1))
            .min((max_connections / 2).max(1));
        Ok(Self {
            budget_mb,
            budget_source,
            max_connections: max_connections as usize,
            max_pending: max_pending as usize,
            max_waiting: max_waiting as usize,
            clamped,
        })
    }

    /// The worst case of the formula above for these caps, in MiB (without BASE).
    pub fn worst_case_mb(&self) -> u64 {
        (2 * self.max_connections as u64 * PER_CONNECTION
            + 2 * self.max_pending as u64 * PER_PENDING_CALL
            + self.max_waiting as u64 * PER_WAITING)
            >> 20
    }
}

/// The memory limit of the cgroup this process runs in (cgroup v2 `memory.max`, then v1's
/// `memory.limit_in_bytes`), when it has one.
pub fn cgroup_memory_limit() -> Option<u64> {
    [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|path| std::fs::read_to_string(path).ok())
    .and_then(|text| text.trim().parse::<u64>().ok())
    // v1 says "no limit" with a number near 2^63.
    .filter(|&bytes| bytes < 1 << 50)
}

/// The soft limit on open files, raised to the hard limit first (a process may do so
/// without privileges; the usual soft default, 1024, is far below what a server needs).
pub fn raise_open_files() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(_) => rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft),
    }
}

/// A count setting: a whole number above 0, or unset.
fn count(
    lookup: &impl Fn(&str) -> Option<String>,
    name: &'static str,
) -> Result<Option<u64>, ConfigError> {
    match lookup(name).filter(|v| !v.trim().is_empty()) {
        None => Ok(None),
        Some(raw) => match raw.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(ConfigError::Invalid {
                name,
                problem: format!("expected a whole number above 0, got {raw:?}"),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn derive(vars: &[(&str, &str)], cgroup: Option<u64>, nofile: u64) -> Capacity {
        let lookup = |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        };
        Capacity::derive(&lookup, cgroup, nofile).unwrap()
    }

    #[test]
    fn caps_follow_the_memory_budget() {
        // 512 MiB (the shipped Deployment's limit): 3/4 of it over two ports.
        let c = derive(&[], Some(512 << 20), 1 << 20);
        assert_eq!(
            (c.budget_mb, c.budget_source),
            (512, "the cgroup's memory limit")
        );
        assert_eq!(c.max_connections, 384);
        assert_eq!(c.max_pending, 341);
        assert_eq!(c.max_waiting, 96);
        assert!(c.worst_case_mb() <= 512 * 7 / 8, "{}", c.worst_case_mb());
        assert!(c.clamped.is_none());
        let c = derive(
            &[("SPILLWAY_MEMORY_BUDGET_MB", "2048")],
            Some(512 << 20),
            1 << 20,
        );
        assert_eq!((c.budget_mb, c.max_connections), (2048, 1536));
        let c = derive(&[], None, 1 << 20);
        assert_eq!((c.budget_mb, c.budget_source), (1024, "the default"));
    }

    #[test]
    fn connections_fit_the_descriptors() {
        let c = derive(&[("SPILLWAY_MAX_CONNECTIONS", "10000")], None, 1024);
        assert_eq!(c.max_connections, 480);
        assert!(c.clamped.unwrap().contains("lowered from 10000 to 480"));
        // Waiting never takes more than half of the connections.
        let c = derive(
            &[
                ("SPILLWAY_MAX_CONNECTIONS", "300"),
                ("SPILLWAY_MAX_WAITING", "300"),
            ],
            None,
            1 << 20,
        );
        assert_eq!(c.max_waiting, 150);
        let c = derive(&[("SPILLWAY_MAX_CONNECTIONS", "300")], None, 1 << 20);
        assert_eq!(c.max_waiting, 75);
    }

    #[test]
    fn a_bad_count_names_its_setting() {
        let lookup = |name: &str| (name == "SPILLWAY_MAX_PENDING_CALLS").then(|| "0".to_owned());
        let error = Capacity::derive(&lookup, None, 4096).unwrap_err();
        assert!(
            error.to_string().contains("SPILLWAY_MAX_PENDING_CALLS"),
            "{error}"
        );
    }
}
