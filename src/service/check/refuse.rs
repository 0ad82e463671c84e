//! Refusals of a strict policy: a check that sent a dimension none of its rules counts, or
//! that met none of them; each counted as unmatched and said with what the rules count.

use super::*;

impl Service {
    /// The dimensions `request` sent that no rule of `policy` counts, counted for its page
    /// and the metrics. A strict policy that enforces refuses them where a dimension its
    /// rules count is missing beside them (`usr` where `user` was meant); sent with every
    /// counted one (a `user` an ip-only policy does not count), they are only said.
    pub(super) fn account_unused(
        &self,
        policy: &Policy,
        request: &CheckRequest,
        started: std::time::Instant,
    ) -> Result<Vec<crate::domain::Name>, CheckError> {
        let unused = policy.unused_dimensions(&request.identifiers);
        if unused.is_empty() {
            return Ok(unused);
        }
        self.live.unused(policy.name.as_str(), &unused);
        crate::telemetry::metrics::unused_dimensions(policy.name.as_str());
        let missing = policy.missing_dimensions(&request.identifiers);
        if !policy.is_strict() || policy.mode != Mode::Enforce || missing.is_empty() {
            return Ok(unused);
        }
        // Beside a dimension it counts, a typo is named; alone, nothing was met.
        let met_some = (request.identifiers.iter()).any(|i| !unused.contains(i.dimension()));
        Err(if met_some {
            self.refuse_unknown(policy, request, &unused, &missing, started)
        } else {
            self.refuse_unmatched(policy, request, started)
        })
    }

    /// Counts a refused check as unmatched in the history and the metrics: a misconfigured
    /// caller is the admin's to see.
    fn count_refused(&self, policy: &Policy, request: &CheckRequest, started: std::time::Instant) {
        self.answered(
            policy,
            history::Outcome::Unmatched,
            &request.identifiers,
            None,
            started,
        );
    }

    /// Refuses a check of a strict policy that sent dimensions none of its rules counts:
    /// counted as unmatched in the history and the metrics, as a check that met no rule.
    pub(super) fn refuse_unknown(
        &self,
        policy: &Policy,
        request: &CheckRequest,
        unknown: &[crate::domain::Name],
        missing: &[&str],
        started: std::time::Instant,
    ) -> CheckError {
        self.count_refused(policy, request, started);
        CheckError::UnknownDimensions {
            policy: policy.name.to_string(),
            unknown: unknown.iter().map(ToString::to_string).collect(),
            missing: missing.iter().map(|d| (*d).to_owned()).collect(),
            expects: expected(policy),
        }
    }

    /// Refuses a check of a strict policy that met no rule: counted as such in the
    /// history and the metrics (a misconfigured caller is the admin's to see).
    pub(super) fn refuse_unmatched(
        &self,
        policy: &Policy,
        request: &CheckRequest,
        started: std::time::Instant,
    ) -> CheckError {
        self.count_refused(policy, request, started);
        let given: Vec<String> = request
            .identifiers
            .iter()
            .map(|i| i.dimension().to_string())
            .collect();
        CheckError::Unmatched {
            policy: policy.name.to_string(),
            given: given.join(", "),
            expects: expected(policy),
        }
    }
}

/// Why a strict policy refused a check that met none of its rules, and how a caller that
/// may leave its dimensions out is let through.
pub(super) fn unmatched_words(policy: &str, expects: &[String]) -> String {
    match expects {
        [] => format!("match no rule of {policy}, {}", counted(expects)),
        _ => format!(
            "match no rule of {policy}, {} (a policy lets a check leave out the dimensions it lists in `optional`)",
            counted(expects)
        ),
    }
}

/// The dimensions `policy`'s rules count, as a refusal names them.
fn expected(policy: &Policy) -> Vec<String> {
    policy
        .dimensions()
        .unwrap_or_default()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// What a policy's rules count, said to a caller whose identifiers met none of them.
pub(super) fn counted(expects: &[String]) -> String {
    match expects {
        [] => {
            "which has no rule for them (strict: refused rather than let through uncounted)".into()
        }
        _ => format!("whose rules count {}", expects.join(" or ")),
    }
}
