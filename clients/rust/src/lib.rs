//! The official Rust client of [Spillway](https://github.com/spillway-rs/spillway), a rate
//! limiter service backed by Redis.
//!
//! What every service calling `POST /api/v1/check` otherwise writes by hand:
//!
//! - a timeout on every call ([`DEFAULT_TIMEOUT`], 100 ms);
//! - an explicit choice, fail open or fail closed, for an unreachable Spillway (network
//!   errors, timeouts, 5xx) and for a configuration error (401 wrong key, 404 unknown
//!   policy, 400 a strict policy's unmatched identifiers): [`Failure`];
//! - a circuit breaker: after a run of unavailable calls, none for a while
//!   ([`Client::with_breaker`]), so a hung Spillway costs one timeout per period, not one per
//!   request; failures that name their cause (`timed out after 100 ms calling …`);
//! - the `RateLimit-Policy`, `RateLimit` and `Retry-After` headers to pass on
//!   ([`Decision::headers`]) and an RFC 9457 problem for the end user ([`Decision::problem`]);
//! - a local cache of denials until their `Retry-After`, at most [`MAX_CACHED`] (never for
//!   a `concurrency` rule, whose slot frees at any moment);
//! - limits sent with a check ([`Check`]), batches ([`Client::check_batch`]), peeks
//!   ([`Client::peek`]) and a bounded wait ([`Client::wait_until_allowed`]);
//! - leases: [`Client::with_lease`] checks, runs the work, renews the leases while it runs
//!   and releases them however it ends;
//! - reserve, then report: [`Client::reserve`] checks an estimate, then reports the
//!   difference, or gives the whole estimate back when the work fails;
//! - a [`tower`](layer) layer for axum and tonic services;
//! - [`Admin`]: resets and overrides with an admin key;
//! - [`testing::Fake`]: an in-memory Spillway for a service's own tests, behind the same
//!   [`Checker`] trait as [`Client`].
//!
//! ```no_run
//! use spillway_client::{Client, Failure, FailMode, Identifiers};
//! # async fn run() -> Result<(), spillway_client::Error> {
//! let spillway = Client::new("http://spillway:3000", "sk_live_…", Failure {
//!     unavailable: FailMode::Open,
//!     misconfigured: FailMode::Closed,
//! })?;
//! let decision = spillway.check("api", &Identifiers::from([("user".into(), "42".into())]), 1).await;
//! if !decision.allowed() {
//!     let (status, problem) = decision.problem();
//!     // answer `status` with `problem` and `decision.headers()`
//! }
//! # Ok(()) }
//! ```

#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod admin;
mod batch;
mod breaker;
mod cache;
mod cause;
mod checker;
mod client;
mod decision;
#[cfg(feature = "tower")]
pub mod layer;
mod leases;
pub mod testing;

use std::collections::BTreeMap;
use std::time::Duration;

use http::StatusCode;

pub use admin::{Admin, Override, OverrideAction, Overrides, Reset, ResetDone, ResetUndone, Undo};
pub use batch::{BatchCheck, MAX_BATCH};
pub use cache::MAX_CACHED;
pub use checker::{Check, Checker, Limits};
pub use client::{Client, DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_PERIOD};
pub use decision::{Answer, Decision, Outcome, RuleResult};
#[cfg(feature = "tower")]
pub use layer::{Grpc, Head, HeldBody, Problem, SpillwayLayer};

/// A check's identifiers: dimension → value (`{"user": "42", "ip": "10.0.0.7"}`).
pub type Identifiers = BTreeMap<String, String>;

/// How long a call to Spillway may take before it counts as unavailable. Spillway answers
/// from one Redis round trip (typically under 2 ms on the same network); keep this well under
/// your own request's budget.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// What a check that could not be decided means for the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailMode {
    /// Let the request through (and log it): the usual choice for an API.
    Open,
    /// Refuse the request: for a limit that guards money or abuse.
    Closed,
}

/// The two choices a caller must make, explicitly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Spillway unreachable: a network error, a timeout, a 5xx (Redis down with a policy that
    /// fails closed, shutting down).
    pub unavailable: FailMode,
    /// A configuration error: 401 or 403 (the key), 404 (the policy does not exist), 400 (a
    /// strict policy met identifiers none of its rules count, or another bad request).
    pub misconfigured: FailMode,
}

/// An error of a call that is not a check (report, release, renew, the admin's), or of
/// building a client. Its message names the cause: the URL called and what failed
/// (`timed out after 100 ms calling http://…/api/v1/report`, a refused connection, a
/// problem's `detail`).
#[derive(Debug)]
pub enum Error {
    /// The call did not reach Spillway or timed out, or Spillway answered 5xx, or the
    /// circuit breaker is open.
    Unavailable(String),
    /// Spillway refused the call: its status and the problem's `detail`.
    Refused { status: StatusCode, detail: String },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unavailable(why) => write!(f, "Spillway is unavailable: {why}"),
            Self::Refused { status, detail } => write!(f, "Spillway refused ({status}): {detail}"),
        }
    }
}

impl std::error::Error for Error {}
