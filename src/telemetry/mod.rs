//! What the server tells its operators: Prometheus metrics (labels bounded by policies,
//! never identifiers) and OpenTelemetry traces with the logs that carry their ids.

pub mod metrics;
#[cfg(feature = "profile")]
pub mod profile;
pub mod traces;
