//! What-if replay speed for `make bench`: a day of recorded checks (`<checks>`, from
//! `<users>` users on 2,000 addresses), replayed in the reference model under a policy of two
//! rules (an hourly fixed window per user, a sliding minute per address) at half the limit
//! the heaviest users met, on this thread, as `service::record` replays on a blocking one.
//!
//! `replay <checks> <users>` prints one line: `checks=N seconds=S checks_per_s=R
//! newly_denied=D`.

use std::time::Instant;

use serde_json::json;
use spillway::domain::whatif::{Recorded, replay};
use spillway::domain::{Identifier, Policy};

fn main() {
    let mut args = std::env::args().skip(1);
    let checks: i64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let users: i64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(50_000);
    let start_us = 1_700_000_000_000_000i64;
    let step_us = 86_400_000_000 / checks.max(1);
    let record: Vec<Recorded> = (0..checks)
        .map(|n| {
            // A few users far busier than the rest: every 7th check is one of ten.
            let user = if n % 7 == 0 {
                n % 10
            } else {
                (n * 7_919) % users
            };
            Recorded {
                at_us: start_us + n * step_us,
                cost: 1,
                allowed: true,
                identifiers: vec![
                    Identifier::new("user", &format!("u{user}")).expect("a user"),
                    Identifier::new("ip", &format!("10.0.{}.{}", (user / 250) % 8, user % 250))
                        .expect("an address"),
                ],
                ..Recorded::default()
            }
        })
        .collect();
    let policy = Policy::from_document(
        "bench",
        &json!({"rules": [
            {"name": "per-user", "algorithm": "fixed_window", "limit": 300, "window_ms": 3_600_000, "dimensions": ["user"]},
            {"name": "per-ip", "algorithm": "sliding_window", "limit": 60, "window_ms": 60_000, "dimensions": ["ip"]}
        ]}),
    )
    .expect("the bench's policy");
    let started = Instant::now();
    let answer = replay(&policy, &record, || false);
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "checks={} seconds={seconds:.3} checks_per_s={:.0} newly_denied={}",
        answer.checks,
        answer.checks as f64 / seconds,
        answer.newly_denied
    );
}
