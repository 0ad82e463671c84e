//! Showing times: UTC dates from epoch milliseconds, the same on the server and in the
//! browser (no time-zone database in either).

/// `2026-11-22 10:58 UTC`, or `never` for `None`.
pub fn utc_minutes(ms: Option<i64>) -> String {
    ms.map_or("never".into(), |ms| {
        let (y, m, d, h, min, _) = parts(ms);
        format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02} UTC")
    })
}

/// `2026-11-22 10:58:03 UTC`.
pub fn utc_seconds(ms: i64) -> String {
    let (y, m, d, h, min, s) = parts(ms);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02}:{s:02} UTC")
}

fn parts(ms: i64) -> (i64, u32, u32, i64, i64, i64) {
    let secs = ms.div_euclid(1000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let t = secs.rem_euclid(86_400);
    (y, m, d, t / 3600, t / 60 % 60, t % 60)
}

/// Days since 1970-01-01 to a (year, month, day) date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil() {
        assert_eq!(utc_minutes(Some(0)), "1970-01-01 00:00 UTC");
        assert_eq!(utc_minutes(Some(1_795_000_000_000)), "2026-11-18 11:06 UTC");
        assert_eq!(
            utc_seconds(951_782_400_000 + 61_000),
            "2000-02-29 00:01:01 UTC"
        );
        assert_eq!(utc_minutes(None), "never");
    }
}
