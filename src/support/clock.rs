//! The host's clock, in one place: milliseconds since the epoch, for what is not decided
//! in Redis (sessions, audit times, override expiries, alert deliveries). Limits themselves
//! run on Redis's clock, in the scripts.

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Microseconds since the Unix epoch (0 if the clock is before it): when a check answered
/// without Redis is recorded, beside those Redis timed in µs.
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}
