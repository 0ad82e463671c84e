//! Lease ids: what the holder of a `concurrency` lease releases or renews it by.
//!
//! An id names everything needed to find the lease without a lookup: the policy, rule and
//! identifier whose state holds it, and the lease's own member there (the random token of
//! the check that took it, its cost, and when it was taken). Written as
//! `<token hex>.<cost>.<taken µs>.<policy>.<rule>.<dimension>.<value>`, the value
//! percent-encoded, so the id is plain ASCII that needs no escaping in JSON, a header or a
//! form. The token is 53 random bits: an id cannot be guessed from the policy and the
//! identifier. Releasing by id takes a service key; the dashboard shows ids to people
//! signed in (the inspector), and support staff release there with a reason.

use std::{fmt, str::FromStr};

use super::{Identifier, Name};

/// One lease, as its id names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseId {
    pub policy: Name,
    pub rule: Name,
    pub identifier: Identifier,
    /// The random number of the check that took it (below 2^53).
    pub token: u64,
    /// How much of the rule's limit it holds.
    pub cost: u64,
    /// When it was taken, µs on Redis's clock.
    pub taken_us: i64,
}

/// The largest token: Lua's numbers are doubles, exact up to 2^53.
pub const MAX_TOKEN: u64 = (1 << 53) - 1;

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:x}.{}.{}.{}.{}.{}.",
            self.token,
            self.cost,
            self.taken_us,
            self.policy,
            self.rule,
            self.identifier.dimension()
        )?;
        for b in self.identifier.value().bytes() {
            if b.is_ascii_alphanumeric() || b"-_~:@!".contains(&b) {
                write!(f, "{}", b as char)?;
            } else {
                write!(f, "%{b:02X}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for LeaseId {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        let bad = || format!("{raw:?} is not a lease id");
        let mut parts = raw.splitn(7, '.');
        let mut next = || parts.next().ok_or_else(bad);
        let token = u64::from_str_radix(next()?, 16)
            .ok()
            .filter(|t| *t <= MAX_TOKEN)
            .ok_or_else(bad)?;
        let cost: u64 = next()?.parse().map_err(|_| bad())?;
        let taken_us: i64 = next()?.parse().map_err(|_| bad())?;
        let policy = Name::parse(next()?).map_err(|_| bad())?;
        let rule = Name::parse(next()?).map_err(|_| bad())?;
        let dimension = next()?;
        let value = unescape(next()?).ok_or_else(bad)?;
        let identifier = Identifier::new(dimension, &value).map_err(|_| bad())?;
        Ok(Self {
            policy,
            rule,
            identifier,
            token,
            cost,
            taken_us,
        })
    }
}

fn unescape(raw: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(raw.len());
    let mut it = raw.bytes();
    while let Some(b) = it.next() {
        if b == b'%' {
            let hex = [it.next()?, it.next()?];
            bytes.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else if b.is_ascii_alphanumeric() || b"-_~:@!".contains(&b) {
            bytes.push(b);
        } else {
            return None;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Every lease id reads back as itself, whatever the identifier's value holds
        /// (dots, percent signs, spaces, any Unicode), and is plain ASCII without spaces.
        #[test]
        fn ids_read_back(
            token in 0u64..=MAX_TOKEN,
            cost in proptest::prop_oneof![proptest::strategy::Just(1u64), 0u64..=1_000_000_000],
            taken_us in 0i64..=4_102_444_800_000_000,
            value in "[^\\p{Cc}]{1,64}",
        ) {
            let id = LeaseId {
                policy: Name::parse("exports").unwrap(),
                rule: Name::parse("running").unwrap(),
                identifier: Identifier::new("customer", &value).unwrap(),
                token,
                cost,
                taken_us,
            };
            let text = id.to_string();
            proptest::prop_assert!(text.bytes().all(|b| b.is_ascii_graphic()), "{}", text);
            proptest::prop_assert_eq!(text.parse::<LeaseId>(), Ok(id));
        }
    }

    #[test]
    fn malformed_ids_are_refused() {
        for bad in [
            "",
            "zz.1.2.p.r.d.v",
            "1.1.2.p.r.d",
            "1.x.2.p.r.d.v",
            "1.1.2.P.r.d.v",
            "1.1.2.p.r.d.%zz",
            "1.1.2.p.r.d.a b",
            "40000000000000.1.2.p.r.d.v",
        ] {
            assert!(bad.parse::<LeaseId>().is_err(), "{bad:?}");
        }
        assert!("1f.1.2.p.r.d.v%2Ew".parse::<LeaseId>().is_ok());
    }
}
