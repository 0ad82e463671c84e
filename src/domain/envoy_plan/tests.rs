//! The unit tests of `src/domain/envoy_plan.rs`.

use serde_json::json;

use super::*;
use crate::domain::{FailureMode, Name, Outcome, RuleResult, overrides::Override};

/// The policy of a domain whose descriptors are `descriptors`, with `overrides`,
/// counting all or nothing.
fn policy(descriptors: serde_json::Value, overrides: &[serde_json::Value]) -> Arc<Policy> {
    counting_policy(descriptors, overrides, envoy::Counting::AllOrNothing)
}

fn counting_policy(
    descriptors: serde_json::Value,
    overrides: &[serde_json::Value],
    counting: envoy::Counting,
) -> Arc<Policy> {
    let domain = EnvoyDomain::from_value(&json!({"domain": "d", "descriptors": descriptors}))
        .expect("a valid domain");
    let mut policy = Policy::from_envoy(domain, FailureMode::Open).expect("a valid policy");
    policy.overrides = overrides
        .iter()
        .map(|o| Override::from_document(o, "overrides[0]").expect("a valid override"))
        .collect();
    policy.resolve_envoy_counting(counting);
    Arc::new(policy)
}

fn descriptor(pairs: &[(&str, &str)]) -> EnvoyDescriptor {
    EnvoyDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..EnvoyDescriptor::default()
    }
}

fn planned(policy: &Arc<Policy>, descriptors: Vec<EnvoyDescriptor>) -> Result<Plan, PlanError> {
    let request = EnvoyRequest {
        domain: "d".into(),
        descriptors,
        ..EnvoyRequest::default()
    };
    plan(policy, policy.envoy.as_ref().unwrap(), &request, 1_000)
}

/// A decision of `allowed` outcomes (remaining 5 when allowed), one per entry.
fn decision(allowed: &[bool]) -> Decision {
    let result = |allowed: bool| RuleResult {
        rule: Name::parse("r").unwrap(),
        identifier: crate::domain::Identifier::parse("envoy=x").unwrap(),
        algorithm: None,
        outcome: Outcome {
            allowed,
            limit: 10,
            remaining: if allowed { 5 } else { 0 },
            reset_ms: 0,
            retry_after_ms: None,
            delay_ms: 0,
            penalty: false,
        },
        binding: false,
        lease: None,
    };
    Decision::new(allowed.iter().map(|&a| result(a)).collect())
}

fn limits() -> serde_json::Value {
    json!([
        {"key": "path", "value": "/a", "rate_limit": {"unit": "second", "requests_per_unit": 10, "name": "a"}},
        {"key": "path", "value": "/b", "rate_limit": {"unit": "second", "requests_per_unit": 5, "name": "b"}, "replaces": [{"name": "a"}]},
        {"key": "path", "value": "/zero", "rate_limit": {"unit": "minute", "requests_per_unit": 0}},
        {"key": "path", "value": "/free", "rate_limit": {"unlimited": true}},
        {"key": "path", "value": "/shadow", "shadow_mode": true, "rate_limit": {"unit": "hour", "requests_per_unit": 1}},
    ])
}

#[test]
fn each_descriptor_finds_its_target() {
    // (the descriptors' paths, enforced, shadows, peeks, over without Redis)
    type Row = (
        &'static [&'static str],
        &'static [usize],
        &'static [usize],
        &'static [usize],
        Option<usize>,
    );
    let table: &[Row] = &[
        (&["/a"], &[0], &[], &[], None),
        (&["/nowhere"], &[], &[], &[], None),
        (&["/free"], &[], &[], &[], None),
        (&["/shadow"], &[], &[0], &[], None),
        (&["/a", "/shadow"], &[0], &[1], &[], None),
        // `b` replaces `a` when both apply.
        (&["/a", "/b"], &[1], &[], &[], None),
        // 0 a unit is over without Redis; the rest is only read.
        (&["/a", "/zero"], &[], &[], &[0], Some(1)),
    ];
    let policy = policy(limits(), &[]);
    for (paths, enforced, shadows, peeks, over) in table {
        let plan = planned(
            &policy,
            paths.iter().map(|p| descriptor(&[("path", p)])).collect(),
        )
        .unwrap();
        let what = format!("{paths:?}");
        assert_eq!(plan.enforced, *enforced, "enforced of {what}");
        assert_eq!(plan.shadows, *shadows, "shadows of {what}");
        assert_eq!(plan.peeks, *peeks, "peeks of {what}");
        assert_eq!(plan.over_already, *over, "over of {what}");
    }
}

#[test]
fn answers_before_and_after_the_checks() {
    let policy = policy(limits(), &[]);
    let paths = ["/nowhere", "/free", "/zero", "/a"];
    let mut plan = planned(
        &policy,
        paths.iter().map(|p| descriptor(&[("path", p)])).collect(),
    )
    .unwrap();
    plan.fill(&[3], &decision(&[true]), Group::Peek, 1_000);
    let answers = plan.answers();
    assert_eq!(answers[0], DescriptorAnswer::unlimited());
    assert_eq!(answers[1].remaining, envoy::UNLIMITED_REMAINING);
    assert!(answers[1].ok);
    assert!(!answers[2].ok);
    assert_eq!(answers[2].limit.as_ref().unwrap().requests_per_unit, 0);
    // 59 s left of the minute at 1 s past it.
    assert_eq!(answers[2].reset_ms, Some(59_000));
    // Only read: left OK, with what remains.
    assert!(answers[3].ok);
    assert_eq!(
        (answers[3].remaining, answers[3].reset_ms),
        (5, Some(1_000))
    );
}

#[test]
fn an_enforced_denial_answers_zero_left_and_turns_shadows_into_reads() {
    let policy = policy(limits(), &[]);
    let mut plan = planned(
        &policy,
        vec![
            descriptor(&[("path", "/a")]),
            descriptor(&[("path", "/shadow")]),
        ],
    )
    .unwrap();
    plan.fill(&[0], &decision(&[false]), Group::Enforced, 1_000);
    plan.enforced_denied();
    assert_eq!((plan.shadows.len(), plan.peeks.clone()), (0, vec![1]));
    plan.fill(&[1], &decision(&[false]), Group::Peek, 1_000);
    let answers = plan.answers();
    assert!(!answers[0].ok);
    assert_eq!(answers[0].remaining, 0);
    // A read never marks a shadow denial.
    assert!(answers[1].ok && !answers[1].shadow_denied);
}

#[test]
fn a_shadow_limit_over_answers_ok_and_is_marked() {
    let policy = policy(limits(), &[]);
    let mut plan = planned(&policy, vec![descriptor(&[("path", "/shadow")])]).unwrap();
    assert_eq!(plan.shadow_checks(), vec![(1, vec![0])]);
    plan.fill(&[0], &decision(&[false]), Group::Shadow, 1_000);
    let answer = &plan.answers()[0];
    assert!(answer.ok && answer.shadow_denied);
}

#[test]
fn a_repeated_descriptor_is_counted_once_and_answers_as_its_twin() {
    let policy = policy(limits(), &[]);
    let mut plan = planned(
        &policy,
        vec![descriptor(&[("path", "/a")]), descriptor(&[("path", "/a")])],
    )
    .unwrap();
    assert_eq!(plan.enforced, vec![0]);
    plan.fill(&[0], &decision(&[false]), Group::Enforced, 1_000);
    let answers = plan.answers();
    assert_eq!(answers[0], answers[1]);
    assert!(!answers[1].ok);
}

#[test]
fn each_counted_descriptor_keeps_its_own_hits() {
    let policy = policy(limits(), &[]);
    let mut heavy = descriptor(&[("path", "/b")]);
    heavy.hits_addend = Some(3);
    let mut own = descriptor(&[("path", "/other")]);
    own.limit = Some((7, Unit::Second));
    own.hits_addend = Some(2);
    // A shadow limit is its own check; `/a` is replaced by `/b`; the rest is one check,
    // each at its own hits.
    let plan = planned(
        &policy,
        vec![
            descriptor(&[("path", "/shadow")]),
            descriptor(&[("path", "/a")]),
            heavy,
            own,
        ],
    )
    .unwrap();
    assert_eq!(plan.enforced, vec![2, 3]);
    let hits: Vec<u64> = plan.entries(&plan.enforced).iter().map(|e| e.2).collect();
    assert_eq!(hits, vec![3, 2]);
    assert_eq!(plan.shadow_checks(), vec![(1, vec![0])]);
}

#[test]
fn when_every_hit_counts_nothing_is_only_read_and_an_empty_counter_is_over() {
    let policy = counting_policy(limits(), &[], envoy::Counting::EveryHit);
    assert!(policy.rules.iter().all(|r| r.count_denied));
    // Over without Redis (`/zero`): `/a` is still counted, and so is the shadow limit.
    let plan = planned(
        &policy,
        vec![
            descriptor(&[("path", "/a")]),
            descriptor(&[("path", "/zero")]),
            descriptor(&[("path", "/shadow")]),
        ],
    )
    .unwrap();
    assert_eq!(
        (plan.enforced.clone(), plan.shadows.clone()),
        (vec![0], vec![2])
    );
    assert!(plan.over());
    // A denied enforced check leaves the shadow limit counted.
    let mut plan = planned(
        &policy,
        vec![
            descriptor(&[("path", "/a")]),
            descriptor(&[("path", "/shadow")]),
        ],
    )
    .unwrap();
    plan.fill(&[0], &decision(&[false]), Group::Enforced, 1_000);
    plan.enforced_denied();
    assert_eq!(plan.shadows, vec![1]);
    // A peek (0 hits) at a counter with nothing left is over; with some left, OK.
    let mut peek = descriptor(&[("path", "/a")]);
    peek.hits_addend = Some(0);
    let mut plan = planned(&policy, vec![peek.clone()]).unwrap();
    plan.fill(&[0], &decision(&[false]), Group::Peek, 1_000);
    assert!(plan.over());
    assert!(!plan.answers()[0].ok);
    let mut plan = planned(&policy, vec![peek]).unwrap();
    plan.fill(&[0], &decision(&[true]), Group::Peek, 1_000);
    assert!(!plan.over());
}

#[test]
fn a_quota_descriptor_over_fails_the_request_only_with_every_other_quota() {
    let policy = policy(
        json!([
            {"key": "q1", "quota_mode": true, "rate_limit": {"unit": "day", "requests_per_unit": 5}},
            {"key": "q2", "quota_mode": true, "rate_limit": {"unit": "day", "requests_per_unit": 5}},
        ]),
        &[],
    );
    let both = || vec![descriptor(&[("q1", "x")]), descriptor(&[("q2", "x")])];
    let mut plan = planned(&policy, both()).unwrap();
    assert_eq!((plan.enforced.len(), plan.quotas.clone()), (0, vec![0, 1]));
    plan.fill(&[0, 1], &decision(&[false, true]), Group::Quota, 1_000);
    assert!(!plan.over(), "one quota of two over: OK");
    assert!(!plan.answers()[0].ok, "but that descriptor says it is over");
    let mut plan = planned(&policy, both()).unwrap();
    plan.fill(&[0, 1], &decision(&[false, false]), Group::Quota, 1_000);
    assert!(plan.over());
}

#[test]
fn with_every_limit_in_quota_mode_a_request_is_over_only_when_each_descriptor_is() {
    // The server's QUOTA_MODE: no descriptor says quota_mode, every one is a quota.
    let mut quota_all = Arc::unwrap_or_clone(policy(
        json!([
            {"key": "a", "rate_limit": {"unit": "day", "requests_per_unit": 5}},
            {"key": "b", "rate_limit": {"unit": "day", "requests_per_unit": 5}},
            {"key": "free", "rate_limit": {"unlimited": true}},
        ]),
        &[],
    ));
    quota_all.resolve_envoy_quota(true);
    let quota_all = Arc::new(quota_all);
    let ab = || vec![descriptor(&[("a", "x")]), descriptor(&[("b", "x")])];
    let mut plan = planned(&quota_all, ab()).unwrap();
    assert_eq!((plan.enforced.len(), plan.quotas.clone()), (0, vec![0, 1]));
    plan.fill(&[0], &decision(&[false]), Group::Quota, 1_000);
    plan.fill(&[1], &decision(&[true]), Group::Quota, 1_000);
    assert!(!plan.over(), "one of two over: OK");
    assert!(!plan.answers()[0].ok, "that descriptor still says over");
    let mut plan = planned(&quota_all, ab()).unwrap();
    plan.fill(&[0, 1], &decision(&[false, false]), Group::Quota, 1_000);
    assert!(plan.over(), "every one over: over");
    // One that found no limit counts as a quota within its limit; an unlimited one, not at all.
    let with = |extra: &[(&str, &str)]| {
        let mut descriptors = ab();
        descriptors.push(descriptor(extra));
        let mut plan = planned(&quota_all, descriptors).unwrap();
        plan.fill(&[0, 1], &decision(&[false, false]), Group::Quota, 1_000);
        plan.over()
    };
    assert!(!with(&[("unknown", "x")]));
    assert!(with(&[("free", "x")]));
    // An identifier the overrides block fails the request, quotas or not.
    let mut blocking = Arc::unwrap_or_clone(policy(
        json!([{"key": "a", "rate_limit": {"unit": "day", "requests_per_unit": 5}}]),
        &[json!({"match": "envoy=b=x", "action": "block"})],
    ));
    blocking.resolve_envoy_quota(true);
    let blocked = planned(&Arc::new(blocking), ab()).unwrap();
    assert!(blocked.over(), "a blocked identifier passed as a quota");
    // Without it, the same answers make the request over.
    let mut plan = planned(
        &policy(
            json!([
                {"key": "a", "rate_limit": {"unit": "day", "requests_per_unit": 5}},
                {"key": "b", "rate_limit": {"unit": "day", "requests_per_unit": 5}},
            ]),
            &[],
        ),
        ab(),
    )
    .unwrap();
    plan.fill(&[0, 1], &decision(&[false, true]), Group::Enforced, 1_000);
    assert!(plan.over());
}

#[test]
fn values_a_shared_wildcard_matches_count_under_the_wildcard() {
    let policy = policy(
        json!([
            {"key": "files", "value": "f/*", "share_threshold": true, "rate_limit": {"unit": "minute", "requests_per_unit": 5}},
            {"key": "own", "value": "o/*", "rate_limit": {"unit": "minute", "requests_per_unit": 5}},
        ]),
        &[],
    );
    let plan = planned(
        &policy,
        vec![
            descriptor(&[("files", "f/a.pdf")]),
            descriptor(&[("files", "f/b.csv")]),
            descriptor(&[("own", "o/a")]),
            descriptor(&[("own", "o/b")]),
        ],
    )
    .unwrap();
    let ids: Vec<String> = plan.identifiers.iter().map(|i| i.to_string()).collect();
    assert_eq!(ids[0], "envoy=files=f/*");
    assert_eq!(ids[0], ids[1]);
    assert_ne!(ids[2], ids[3]);
    // Shared: counted once, as a repeated descriptor is.
    assert_eq!(plan.enforced, vec![0, 2, 3]);
}

#[test]
fn a_callers_own_limit_counts_under_its_unit_and_zero_denies() {
    let policy = policy(limits(), &[]);
    let mut own = descriptor(&[("path", "/nowhere")]);
    own.limit = Some((3, Unit::Minute));
    let mut zero = descriptor(&[("path", "/nowhere")]);
    zero.limit = Some((0, Unit::Minute));
    let mut peek_at_zero = zero.clone();
    peek_at_zero.hits_addend = Some(0);
    let plan = planned(&policy, vec![own.clone()]).unwrap();
    assert_eq!(plan.enforced, vec![0]);
    assert_eq!(plan.entries(&[0])[0].0.name.as_str(), "caller-minute");
    assert_eq!(planned(&policy, vec![zero]).unwrap().over_already, Some(0));
    let peek = planned(&policy, vec![peek_at_zero]).unwrap();
    assert_eq!((peek.over_already, peek.enforced.len()), (None, 0));
}

#[test]
fn overrides_make_a_descriptor_unlimited_or_block_it() {
    let policy = policy(
        limits(),
        &[
            json!({"match": "envoy=path=/a", "action": "block"}),
            json!({"match": "envoy=path=/shadow", "action": "unlimited"}),
        ],
    );
    let mut plan = planned(
        &policy,
        vec![
            descriptor(&[("path", "/a")]),
            descriptor(&[("path", "/shadow")]),
        ],
    )
    .unwrap();
    assert_eq!(plan.over_already, Some(0));
    assert!(plan.enforced.is_empty() && plan.shadows.is_empty());
    let answers = plan.answers();
    assert_eq!((answers[0].ok, answers[0].limit.clone()), (false, None));
    assert_eq!(answers[1].remaining, envoy::UNLIMITED_REMAINING);
    assert_eq!(plan.limited().count(), 1);
}
