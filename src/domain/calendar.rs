//! Calendar periods of a `quota` rule: a day, week, month or year in an IANA time zone,
//! optionally starting on an anniversary (the day a customer signed up). A period starts at
//! local midnight of its first day and ends where the next one starts, so a day across a
//! daylight-saving change is 23 or 25 hours long and a month is as long as the calendar says.
//!
//! The server resolves zones with chrono-tz; the browser build (which only previews bursts
//! of a few seconds) works in UTC.

use std::fmt;

use chrono::{DateTime, Datelike, Days, Months, NaiveDate, NaiveTime, Utc};
use serde::{Deserialize, Serialize};

/// How long a quota's period is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    Day,
    Week,
    Month,
    Year,
}

impl Period {
    pub const ALL: [Period; 4] = [Period::Day, Period::Week, Period::Month, Period::Year];

    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
            Period::Year => "year",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == raw)
    }

    /// Its usual length in seconds (a month of 30 days, a year of 365): what the
    /// `RateLimit-Policy` header advertises as its window. `reset_ms` is the real time to
    /// the next boundary.
    pub fn nominal_seconds(self) -> u64 {
        match self {
            Period::Day => 24 * 3600,
            Period::Week => 7 * 24 * 3600,
            Period::Month => 30 * 24 * 3600,
            Period::Year => 365 * 24 * 3600,
        }
    }
}

/// Longest IANA zone name kept (the longest in the database is 32 bytes).
const ZONE_BYTES: usize = 40;

/// An IANA time zone name such as `Europe/Berlin`, held inline so rules stay `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ZoneName {
    len: u8,
    bytes: [u8; ZONE_BYTES],
}

impl ZoneName {
    pub const UTC: ZoneName = {
        let mut bytes = [0u8; ZONE_BYTES];
        bytes[0] = b'U';
        bytes[1] = b'T';
        bytes[2] = b'C';
        ZoneName { len: 3, bytes }
    };

    /// A zone the server knows (the browser build checks the spelling only).
    pub fn new(raw: &str) -> Result<Self, String> {
        let ok_chars = raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_-+".contains(&b));
        if raw.is_empty() || raw.len() > ZONE_BYTES || !ok_chars {
            return Err(format!(
                "{raw:?} is not an IANA time zone name (such as Europe/Berlin or UTC)"
            ));
        }
        #[cfg(feature = "ssr")]
        if raw.parse::<chrono_tz::Tz>().is_err() {
            return Err(format!(
                "{raw:?} is not an IANA time zone name (such as Europe/Berlin or UTC)"
            ));
        }
        let mut bytes = [0u8; ZONE_BYTES];
        bytes[..raw.len()].copy_from_slice(raw.as_bytes());
        Ok(Self {
            len: raw.len() as u8,
            bytes,
        })
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len as usize]).expect("built from a str")
    }
}

impl fmt::Debug for ZoneName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl fmt::Display for ZoneName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ZoneName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ZoneName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        ZoneName::new(&raw).map_err(serde::de::Error::custom)
    }
}

/// Where a quota's periods fall: their length, their zone, and the anniversary they start
/// on (`start_day`: ISO weekday 1–7 for a week, day of the month 1–31 for a month or a
/// year, clamped to the month's last day; `start_month` 1–12 for a year). 0 is the
/// default: Monday, the 1st, January.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Calendar {
    pub period: Period,
    pub zone: ZoneName,
    pub start_day: u8,
    pub start_month: u8,
}

/// The period around `at_us` (µs since the epoch): its start and its end.
pub fn period_at(calendar: &Calendar, at_us: i64) -> (i64, i64) {
    let zone = Zone::of(calendar.zone);
    let date = zone.local_date(at_us);
    let start = first_day(calendar, date);
    let next = shift(calendar, start, 1);
    (zone.midnight(start), zone.midnight(next))
}

/// The previous period's start, this period's start and end, and the next one's end:
/// what the check script needs to place Redis's clock, which may differ a little from ours.
pub fn periods_around(calendar: &Calendar, at_us: i64) -> [i64; 4] {
    let (start, end) = period_at(calendar, at_us);
    let (previous, _) = period_at(calendar, start - 1);
    let (_, next) = period_at(calendar, end);
    [previous, start, end, next]
}

/// The first day of the period holding `date`.
fn first_day(calendar: &Calendar, date: NaiveDate) -> NaiveDate {
    match calendar.period {
        Period::Day => date,
        Period::Week => {
            let start = u32::from(calendar.start_day.max(1));
            let back = (date.weekday().number_from_monday() + 7 - start) % 7;
            date - Days::new(u64::from(back))
        }
        Period::Month => {
            let this = anniversary_in(calendar, date.year(), date.month());
            if date >= this {
                this
            } else {
                let before = date.with_day(1).expect("day 1") - Months::new(1);
                anniversary_in(calendar, before.year(), before.month())
            }
        }
        Period::Year => {
            let month = u32::from(calendar.start_month.max(1));
            let this = anniversary_in(calendar, date.year(), month);
            if date >= this {
                this
            } else {
                anniversary_in(calendar, date.year() - 1, month)
            }
        }
    }
}

/// The period `n` periods after the one starting on `first` (a first day), by its first day.
fn shift(calendar: &Calendar, first: NaiveDate, n: u32) -> NaiveDate {
    match calendar.period {
        Period::Day => first + Days::new(u64::from(n)),
        Period::Week => first + Days::new(7 * u64::from(n)),
        Period::Month => {
            let later = first.with_day(1).expect("day 1") + Months::new(n);
            anniversary_in(calendar, later.year(), later.month())
        }
        Period::Year => anniversary_in(
            calendar,
            first.year() + n as i32,
            u32::from(calendar.start_month.max(1)),
        ),
    }
}

/// The anniversary day in a month: `start_day`, or the month's last day if it is shorter.
fn anniversary_in(calendar: &Calendar, year: i32, month: u32) -> NaiveDate {
    let day = u32::from(calendar.start_day.max(1));
    let first = NaiveDate::from_ymd_opt(year, month, 1).expect("a valid month");
    let last = (first + Months::new(1) - Days::new(1)).day();
    first.with_day(day.min(last)).expect("clamped to the month")
}

/// A resolved zone: chrono-tz's on the server, UTC in the browser.
struct Zone {
    #[cfg(feature = "ssr")]
    tz: chrono_tz::Tz,
}

impl Zone {
    #[cfg_attr(not(feature = "ssr"), allow(unused_variables))]
    fn of(name: ZoneName) -> Self {
        Self {
            #[cfg(feature = "ssr")]
            tz: name.as_str().parse().unwrap_or(chrono_tz::UTC),
        }
    }

    fn local_date(&self, at_us: i64) -> NaiveDate {
        let utc = DateTime::<Utc>::from_timestamp_micros(at_us).unwrap_or_default();
        #[cfg(feature = "ssr")]
        {
            utc.with_timezone(&self.tz).date_naive()
        }
        #[cfg(not(feature = "ssr"))]
        {
            utc.date_naive()
        }
    }

    /// The instant (µs) local midnight of `date` begins. When a daylight-saving change
    /// repeats midnight, the first; when it skips midnight, the first local time after it.
    fn midnight(&self, date: NaiveDate) -> i64 {
        let local = date.and_time(NaiveTime::MIN);
        #[cfg(feature = "ssr")]
        {
            use chrono::TimeZone;
            let mut at = local;
            // Step through a gap a minute at a time (Samoa skipped a whole day in 2011).
            for _ in 0..(2 * 24 * 60) {
                if let Some(t) = self.tz.from_local_datetime(&at).earliest() {
                    return t.timestamp_micros();
                }
                at += chrono::Duration::minutes(1);
            }
            local.and_utc().timestamp_micros()
        }
        #[cfg(not(feature = "ssr"))]
        {
            local.and_utc().timestamp_micros()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(rfc3339: &str) -> i64 {
        DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .timestamp_micros()
    }

    fn cal(period: Period, zone: &str, start_day: u8, start_month: u8) -> Calendar {
        Calendar {
            period,
            zone: ZoneName::new(zone).unwrap(),
            start_day,
            start_month,
        }
    }

    /// Boundaries worked out by hand from the calendar and the zones' published rules
    /// (US Eastern: DST from 2026-03-08 02:00 to 2026-11-01 02:00; Central Europe: from
    /// 2026-03-29 02:00 UTC+1 to 2026-10-25 03:00 UTC+2).
    #[test]
    fn periods_match_dates_worked_out_by_hand() {
        let cases: &[(Calendar, &str, &str, &str)] = &[
            // UTC days, months of 31, 28 and 29 days, years.
            (
                cal(Period::Day, "UTC", 0, 0),
                "2026-01-31T23:59:59.999999Z",
                "2026-01-31T00:00:00Z",
                "2026-02-01T00:00:00Z",
            ),
            (
                cal(Period::Month, "UTC", 0, 0),
                "2026-01-15T12:00:00Z",
                "2026-01-01T00:00:00Z",
                "2026-02-01T00:00:00Z",
            ),
            (
                cal(Period::Month, "UTC", 0, 0),
                "2026-02-28T23:59:59Z",
                "2026-02-01T00:00:00Z",
                "2026-03-01T00:00:00Z",
            ),
            (
                cal(Period::Month, "UTC", 0, 0),
                "2028-02-29T12:00:00Z",
                "2028-02-01T00:00:00Z",
                "2028-03-01T00:00:00Z",
            ),
            (
                cal(Period::Year, "UTC", 0, 0),
                "2026-12-31T23:59:59Z",
                "2026-01-01T00:00:00Z",
                "2027-01-01T00:00:00Z",
            ),
            (
                cal(Period::Year, "UTC", 0, 0),
                "2028-07-01T00:00:00Z",
                "2028-01-01T00:00:00Z",
                "2029-01-01T00:00:00Z",
            ),
            // A 23-hour and a 25-hour day in New York.
            (
                cal(Period::Day, "America/New_York", 0, 0),
                "2026-03-08T12:00:00Z",
                "2026-03-08T05:00:00Z",
                "2026-03-09T04:00:00Z",
            ),
            (
                cal(Period::Day, "America/New_York", 0, 0),
                "2026-11-01T12:00:00Z",
                "2026-11-01T04:00:00Z",
                "2026-11-02T05:00:00Z",
            ),
            // A month across the change, in Berlin: March has 31 days minus an hour.
            (
                cal(Period::Month, "Europe/Berlin", 0, 0),
                "2026-03-30T00:00:00Z",
                "2026-02-28T23:00:00Z",
                "2026-03-31T22:00:00Z",
            ),
            (
                cal(Period::Month, "Europe/Berlin", 0, 0),
                "2026-03-31T22:00:00Z",
                "2026-03-31T22:00:00Z",
                "2026-04-30T22:00:00Z",
            ),
            // Local midnight is not UTC midnight: 23:30 UTC on Jan 31 is Feb 1 in Berlin.
            (
                cal(Period::Month, "Europe/Berlin", 0, 0),
                "2026-01-31T23:30:00Z",
                "2026-01-31T23:00:00Z",
                "2026-02-28T23:00:00Z",
            ),
            (
                cal(Period::Year, "Europe/Berlin", 0, 0),
                "2026-06-01T00:00:00Z",
                "2025-12-31T23:00:00Z",
                "2026-12-31T23:00:00Z",
            ),
            // Anniversaries: the 31st falls on Feb 28 (29 in a leap year), then on Mar 31.
            (
                cal(Period::Month, "UTC", 31, 0),
                "2026-02-28T00:00:00Z",
                "2026-02-28T00:00:00Z",
                "2026-03-31T00:00:00Z",
            ),
            (
                cal(Period::Month, "UTC", 31, 0),
                "2026-02-27T00:00:00Z",
                "2026-01-31T00:00:00Z",
                "2026-02-28T00:00:00Z",
            ),
            (
                cal(Period::Month, "UTC", 31, 0),
                "2028-02-28T00:00:00Z",
                "2028-01-31T00:00:00Z",
                "2028-02-29T00:00:00Z",
            ),
            (
                cal(Period::Month, "UTC", 15, 0),
                "2026-03-14T23:59:59Z",
                "2026-02-15T00:00:00Z",
                "2026-03-15T00:00:00Z",
            ),
            (
                cal(Period::Year, "UTC", 29, 2),
                "2027-03-01T00:00:00Z",
                "2027-02-28T00:00:00Z",
                "2028-02-29T00:00:00Z",
            ),
            (
                cal(Period::Year, "UTC", 1, 4),
                "2026-03-31T23:00:00Z",
                "2025-04-01T00:00:00Z",
                "2026-04-01T00:00:00Z",
            ),
            // Weeks: Monday by default, Sunday on request (2026-11-24 is a Tuesday).
            (
                cal(Period::Week, "UTC", 0, 0),
                "2026-11-24T10:00:00Z",
                "2026-11-23T00:00:00Z",
                "2026-11-30T00:00:00Z",
            ),
            (
                cal(Period::Week, "UTC", 7, 0),
                "2026-11-24T10:00:00Z",
                "2026-11-22T00:00:00Z",
                "2026-11-29T00:00:00Z",
            ),
            // A week across the autumn change in New York is 169 hours.
            (
                cal(Period::Week, "America/New_York", 0, 0),
                "2026-11-01T12:00:00Z",
                "2026-10-26T04:00:00Z",
                "2026-11-02T05:00:00Z",
            ),
            // Asia/Kathmandu is UTC+5:45.
            (
                cal(Period::Day, "Asia/Kathmandu", 0, 0),
                "2026-06-01T00:00:00Z",
                "2026-05-31T18:15:00Z",
                "2026-06-01T18:15:00Z",
            ),
        ];
        for (calendar, at, start, end) in cases {
            assert_eq!(
                period_at(calendar, us(at)),
                (us(start), us(end)),
                "{calendar:?} at {at}"
            );
        }
    }

    /// Where midnight does not exist (Santiago skips from 24:00 to 01:00 on the first
    /// Sunday of September 2026), the day starts at the first local time there is.
    #[test]
    fn a_skipped_midnight_starts_the_day_at_one() {
        let santiago = cal(Period::Day, "America/Santiago", 0, 0);
        assert_eq!(
            period_at(&santiago, us("2026-09-06T12:00:00Z")),
            (us("2026-09-06T04:00:00Z"), us("2026-09-07T03:00:00Z"))
        );
    }

    proptest::proptest! {
        /// For any instant and calendar, the period holds the instant, the next period
        /// starts where it ends, and the four boundaries increase.
        #[test]
        fn periods_tile_time(
            at in 0i64..4_102_444_800_000_000,
            period in proptest::sample::select(Period::ALL.to_vec()),
            zone in proptest::sample::select(vec!["UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kathmandu", "America/Santiago", "Pacific/Apia"]),
            start_day in 0u8..=31,
            start_month in 0u8..=12,
        ) {
            let start_day = if period == Period::Week { start_day % 8 } else { start_day };
            let calendar = cal(period, zone, start_day, start_month);
            let (start, end) = period_at(&calendar, at);
            proptest::prop_assert!(start <= at && at < end, "{:?}: {} not in [{}, {})", calendar, at, start, end);
            proptest::prop_assert_eq!(period_at(&calendar, end).0, end);
            proptest::prop_assert_eq!(period_at(&calendar, start).0, start);
            let [p, s, e, n] = periods_around(&calendar, at);
            proptest::prop_assert!(p < s && s < e && e < n);
            let hours = (end - start) as f64 / 3.6e9;
            let (low, high) = match period {
                Period::Day => (22.0, 26.0),
                Period::Week => (166.0, 170.0),
                Period::Month => (27.0 * 24.0, 32.0 * 24.0),
                Period::Year => (364.0 * 24.0, 367.0 * 24.0),
            };
            proptest::prop_assert!(low <= hours && hours <= high, "{:?}: {} hours", calendar, hours);
        }
    }
}
