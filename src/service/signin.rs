//! Limiting password guesses with Spillway's own engine: every attempt is charged to three
//! sliding logs (5 per 15 minutes for the user name and address together, 50 per 15 minutes
//! for the address alone, 20 per 15 minutes for the user name from anywhere) before the
//! password is checked, and given back when it was right, so only failures count. An IPv6
//! address counts as its /64 (one host is usually given a whole /64 to pick from). Signing
//! in and changing one's own password both use it.
//!
//! The per-account budget is a trade-off: guesses spread over many addresses are slowed to
//! 20 per quarter-hour for an account, and someone who knows a user name can keep that user
//! waiting for up to 15 minutes (a reset of `login-user=<name>` in the inspector lifts it).

use std::sync::LazyLock;

use super::Service;
use crate::{
    domain::{Algorithm, Identifier, Name, Rule},
    store::{CheckEntry, Now, StoreError},
};

/// The internal policy name the sign-in limits are kept under (its prefix is reserved:
/// `domain::policy::RESERVED_PREFIX`).
pub const LOGIN_POLICY: &str = "spillway-login";

struct LoginLimits {
    policy: Name,
    per_user_and_ip: Rule,
    per_ip: Rule,
    per_user: Rule,
}

static LIMITS: LazyLock<LoginLimits> = LazyLock::new(|| {
    let window_ms = 15 * 60 * 1000;
    let rule = |name: &str, limit| {
        Rule::new(
            0,
            name,
            Algorithm::SlidingLog { limit, window_ms },
            None,
            false,
        )
        .expect("the sign-in rules are valid")
    };
    LoginLimits {
        policy: Name::parse(LOGIN_POLICY).expect("a valid name"),
        per_user_and_ip: rule("failures", 5),
        per_ip: rule("failures-per-address", 50),
        per_user: rule("failures-per-account", 20),
    }
});

/// The sign-in limits as a policy (never stored): what a reset of a `login`, `login-ip` or
/// `login-user` identifier clears, so support can lift a lock-out.
pub fn login_policy() -> crate::domain::Policy {
    let limits = &*LIMITS;
    crate::domain::Policy {
        name: limits.policy.clone(),
        version: 0,
        overrides_rev: 0,
        description: "the sign-in limits".into(),
        mode: Default::default(),
        failure_mode: Default::default(),
        strict: Some(false),
        optional: Vec::new(),
        on_deny: Default::default(),
        max_wait_ms: None,
        record: crate::domain::policy::Recording::Off,
        record_checks: None,
        rules: vec![
            limits.per_user_and_ip.clone(),
            limits.per_ip.clone(),
            limits.per_user.clone(),
        ],
        overrides: Vec::new(),
        envoy: None,
        managed_by: None,
    }
}

/// Whether `dimension` is one the sign-in limits count by.
pub fn is_login_dimension(dimension: &str) -> bool {
    matches!(dimension, "login" | "login-ip" | "login-user")
}

/// One attempt at a password, charged to the sign-in limits before the password is looked
/// at; [`Attempt::forgive`] gives it back when the password was right, so only failures
/// count. Signing in and changing one's own password both go through here.
pub struct Attempt {
    pair: Identifier,
    addr: Identifier,
    user: Identifier,
    at_us: i64,
}

/// What charging an attempt came to.
pub enum Charged {
    /// Within the limits: go on and check the password.
    Allowed(Attempt),
    /// Too many failures: try again in this many seconds.
    Limited(u64),
    /// The user name cannot be an identifier (it is wrong anyway).
    Invalid,
}

impl Attempt {
    fn entries(&self) -> [CheckEntry<'_>; 3] {
        let limits = &*LIMITS;
        [
            CheckEntry::new(&limits.per_user_and_ip, &self.pair),
            CheckEntry::new(&limits.per_ip, &self.addr),
            CheckEntry::new(&limits.per_user, &self.user),
        ]
    }

    /// Charges one attempt of `user` from `ip` (5 per 15 minutes for the pair, 50 for the
    /// address alone, 20 for the account).
    pub async fn charge(service: &Service, user: &str, ip: &str) -> Result<Charged, StoreError> {
        let ip = &network_of(ip);
        let pair = Identifier::new("login", &format!("{ip} {user}"));
        let addr = Identifier::new("login-ip", if ip.is_empty() { "unknown" } else { ip });
        let account = Identifier::new("login-user", user);
        let (Ok(pair), Ok(addr), Ok(user)) = (pair, addr, account) else {
            return Ok(Charged::Invalid);
        };
        let mut attempt = Attempt {
            pair,
            addr,
            user,
            at_us: 0,
        };
        // On Redis's clock, as every other limit (the refund names the time it used).
        let decision = service
            .store
            .check_and_consume(&LIMITS.policy, &attempt.entries(), 1, Now::Redis)
            .await?;
        if decision.allowed {
            attempt.at_us = decision.at_us;
            return Ok(Charged::Allowed(attempt));
        }
        Ok(Charged::Limited(
            decision
                .binding()
                .and_then(|b| b.outcome.retry_after_ms)
                .map_or(900, |ms| ms.div_ceil(1000)),
        ))
    }

    /// Gives the attempt back: the password was right.
    pub async fn forgive(&self, service: &Service) {
        if let Err(error) = service
            .store
            .refund(&LIMITS.policy, &self.entries(), 1, self.at_us)
            .await
        {
            tracing::warn!(%error, "could not refund a password attempt");
        }
    }
}

/// What the sign-in limits count an address as: an IPv4 address itself, an IPv6 address
/// its /64 (`2001:db8:1:2::/64`); anything else as written.
fn network_of(ip: &str) -> String {
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let net = ipnet::Ipv6Net::new(v6, 64).expect("64 is a valid prefix");
                net.trunc().to_string()
            }
        },
        _ => ip.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_ipv6_address_counts_as_its_64() {
        assert_eq!(
            super::network_of("2001:db8:1:2:aaaa::1"),
            super::network_of("2001:db8:1:2:ffff::9")
        );
        assert_eq!(super::network_of("2001:db8:1:2::7"), "2001:db8:1:2::/64");
        assert_ne!(
            super::network_of("2001:db8:1:2::1"),
            super::network_of("2001:db8:1:3::1")
        );
        assert_eq!(super::network_of("203.0.113.7"), "203.0.113.7");
        assert_eq!(super::network_of("::ffff:203.0.113.7"), "203.0.113.7");
        assert_eq!(super::network_of(""), "");
    }
}
