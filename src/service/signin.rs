//! Limiting password guesses with Spillway's own engine: every attempt is charged to two
//! sliding logs (5 per 15 minutes for the user name and address together, 50 per 15 minutes
//! for the address alone) before the password is checked, and given back when it was right,
//! so only failures count. Signing in and changing one's own password both use it.

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
    }
});

/// One attempt at a password, charged to the sign-in limits before the password is looked
/// at; [`Attempt::forgive`] gives it back when the password was right, so only failures
/// count. Signing in and changing one's own password both go through here.
pub struct Attempt {
    pair: Identifier,
    addr: Identifier,
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
    fn entries(&self) -> [CheckEntry<'_>; 2] {
        let limits = &*LIMITS;
        [
            CheckEntry {
                rule: &limits.per_user_and_ip,
                identifier: &self.pair,
            },
            CheckEntry {
                rule: &limits.per_ip,
                identifier: &self.addr,
            },
        ]
    }

    /// Charges one attempt of `user` from `ip` (5 per 15 minutes for the pair, 50 for the
    /// address alone).
    pub async fn charge(service: &Service, user: &str, ip: &str) -> Result<Charged, StoreError> {
        let pair = Identifier::new("login", &format!("{ip} {user}"));
        let addr = Identifier::new("login-ip", if ip.is_empty() { "unknown" } else { ip });
        let (Ok(pair), Ok(addr)) = (pair, addr) else {
            return Ok(Charged::Invalid);
        };
        let mut attempt = Attempt {
            pair,
            addr,
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
