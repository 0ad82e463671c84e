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

/// A length of time as a person says it: "40 s", "18 min", "2 h 5 min", "3 days".
pub fn spoken_duration(ms: i64) -> String {
    let s = (ms.max(0) + 500) / 1000;
    match s {
        0..90 => format!("{s} s"),
        90..5_400 => format!("{} min", (s + 30) / 60),
        5_400..172_800 => {
            let min = (s + 30) / 60;
            match min % 60 {
                0 => format!("{} h", min / 60),
                m => format!("{} h {m} min", min / 60),
            }
        }
        _ => format!("{} days", (s + 43_200) / 86_400),
    }
}

/// Parses `YYYY-MM-DD`, `YYYY-MM-DD HH:MM` or `YYYY-MM-DDTHH:MM[:SS]` (UTC, as a
/// `datetime-local` input sends it) to epoch milliseconds.
pub fn parse_utc(raw: &str) -> Result<i64, String> {
    let raw = raw.trim();
    let bad = || format!("expected a UTC time such as 2026-11-22 10:58, got {raw:?}");
    let (date, time) = match raw.split_once(['T', ' ']) {
        Some((d, t)) => (d, t),
        None => (raw, "00:00"),
    };
    let d: Vec<i64> = date
        .split('-')
        .map(|p| p.parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let t: Vec<i64> = time
        .split(':')
        .map(|p| p.parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let (&[y, m, day], 2..=3) = (d.as_slice(), t.len()) else {
        return Err(bad());
    };
    let (h, min, sec) = (t[0], t[1], t.get(2).copied().unwrap_or(0));
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || min > 59 || sec > 59 {
        return Err(bad());
    }
    // Four-digit years from the epoch on: a year of 10^15 overflowed the milliseconds and
    // came back as some time long past.
    if !(1970..=9999).contains(&y) || h < 0 || min < 0 || sec < 0 {
        return Err(format!(
            "expected a UTC time from 1970 to 9999 such as 2026-11-22 10:58, got {raw:?}"
        ));
    }
    let days = days_from_civil(y, m as u32, day as u32);
    Ok(((days * 86_400) + h * 3600 + min * 60 + sec) * 1000)
}

/// (year, month, day) to days since 1970-01-01 (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
    fn durations_read_as_spoken() {
        assert_eq!(spoken_duration(40_400), "40 s");
        assert_eq!(spoken_duration(1_080_000), "18 min");
        assert_eq!(spoken_duration(7_500_000), "2 h 5 min");
        assert_eq!(spoken_duration(7_200_000), "2 h");
        assert_eq!(spoken_duration(3 * 86_400_000), "3 days");
    }

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

    #[test]
    fn times_parse_back() {
        for ms in [0, 951_782_400_000 + 61_000, 1_795_000_000_000] {
            let shown = utc_seconds(ms);
            let raw = shown.trim_end_matches(" UTC");
            assert_eq!(parse_utc(raw), Ok(ms - ms % 1000), "{raw}");
        }
        assert_eq!(parse_utc("2026-11-22T10:58"), parse_utc("2026-11-22 10:58"));
        assert_eq!(parse_utc("1970-01-02"), Ok(86_400_000));
        assert!(parse_utc("yesterday").is_err());
        assert!(parse_utc("2026-13-01").is_err());
        // A year past 9999 overflowed (the probe's since=1000000000000000-01-01 returned
        // every record); before the epoch is no audit time either.
        assert!(parse_utc("1000000000000000-01-01").is_err());
        assert!(parse_utc("10000-01-01").is_err());
        assert!(parse_utc("1969-12-31 23:59").is_err());
        assert!(parse_utc("2026-11-22 -1:00").is_err());
        assert!(parse_utc("9999-12-31 23:59").is_ok());
    }
}
