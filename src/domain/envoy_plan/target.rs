//! Each descriptor's target in the plan: the limit it counts under, over already (a limit
//! of 0, an override's block), or nothing; and `replaces` applied between them.

use super::*;

/// Descriptor `i`'s target: the caller's own limit, or the one its entries found in the
/// domain's file (`limit`).
pub(super) fn target_of(
    i: usize,
    d: &EnvoyDescriptor,
    (cost, every_hit, quota_all): (u64, bool, bool),
    limit: Option<&Limit>,
    caller_rules: &mut Vec<Rule>,
) -> Target {
    if let Some((rpu, unit)) = d.limit {
        let current = CurrentLimit {
            name: String::new(),
            requests_per_unit: rpu,
            unit,
        };
        return match (rpu, cost) {
            (0, 0) => Target::Free,
            (0, _) => Target::Over(Some(current)),
            _ => {
                caller_rules.push(caller_rule(i, rpu, unit, every_hit));
                Target::Count {
                    rule: RuleRef::Caller(caller_rules.len() - 1),
                    current,
                    shadow: false,
                    quota: quota_all,
                }
            }
        };
    }
    let Some(limit) = limit else {
        return Target::Free;
    };
    match limit.allowance {
        Allowance::Unlimited => Target::Unlimited,
        Allowance::Count {
            requests_per_unit,
            unit,
            rule,
        } => {
            let current = CurrentLimit {
                name: limit.name.clone(),
                requests_per_unit,
                unit,
            };
            match rule {
                // 0 a unit: over for any hit (a peek passes; a shadow limit answers OK).
                None if limit.shadow || cost == 0 => Target::Free,
                None => Target::Over(Some(current)),
                Some(r) => Target::Count {
                    rule: RuleRef::Policy(r),
                    current,
                    shadow: limit.shadow,
                    quota: limit.quota || quota_all,
                },
            }
        }
    }
}

/// Frees every descriptor whose limit another limit of this request `replaces`.
pub(super) fn apply_replaces(targets: &mut [Target], limits: &[Option<&Limit>]) {
    let replaced: HashSet<&str> = limits
        .iter()
        .flatten()
        .flat_map(|l| l.replaces.iter().map(String::as_str))
        .collect();
    for (target, limit) in targets.iter_mut().zip(limits) {
        if limit.is_some_and(|l| !l.name.is_empty() && replaced.contains(l.name.as_str())) {
            *target = Target::Free;
        }
    }
}
