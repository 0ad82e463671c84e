//! The tests of a domain's file read into its tree and of finding limits in it.

use super::lookup::glob;
use super::*;
use serde_json::json;

fn domain(v: serde_json::Value) -> Result<EnvoyDomain, PolicyError> {
    EnvoyDomain::from_value(&v)
}

fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn found(d: &EnvoyDomain, pairs: &[(&str, &str)]) -> Option<String> {
    d.find(&entries(pairs)).map(|l| l.name.clone())
}

#[test]
fn key_and_value_beat_a_prefix_which_beats_the_key_alone() {
    let d = domain(json!({"domain": "d", "descriptors": [
        {"key": "path", "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "any"}},
        {"key": "path", "value": "/api*", "rate_limit": {"unit": "second", "requests_per_unit": 2, "name": "prefix"}},
        {"key": "path", "value": "/api/login", "rate_limit": {"unit": "second", "requests_per_unit": 3, "name": "exact"}},
    ]}))
    .unwrap();
    assert_eq!(
        found(&d, &[("path", "/api/login")]).as_deref(),
        Some("exact")
    );
    assert_eq!(
        found(&d, &[("path", "/api/users")]).as_deref(),
        Some("prefix")
    );
    assert_eq!(found(&d, &[("path", "/other")]).as_deref(), Some("any"));
    assert_eq!(found(&d, &[("host", "x")]), None);
}

#[test]
fn a_limit_applies_only_where_the_last_entry_lands() {
    let d = domain(json!({"domain": "d", "descriptors": [
        {"key": "remote_address", "descriptors": [
            {"key": "path", "value": "/a", "rate_limit": {"unit": "minute", "requests_per_unit": 5, "name": "nested"}},
        ]},
        {"key": "user", "rate_limit": {"unit": "hour", "requests_per_unit": 5, "name": "top"}, "descriptors": [
            {"key": "plan", "value": "free"},
        ]},
    ]}))
    .unwrap();
    assert_eq!(
        found(&d, &[("remote_address", "1.2.3.4"), ("path", "/a")]).as_deref(),
        Some("nested")
    );
    // Stopping halfway finds nothing; so does going past a leaf or a node without a limit.
    assert_eq!(found(&d, &[("remote_address", "1.2.3.4")]), None);
    assert_eq!(found(&d, &[("remote_address", "1"), ("path", "/b")]), None);
    assert_eq!(found(&d, &[("user", "u"), ("plan", "free")]), None);
    assert_eq!(found(&d, &[("user", "u")]).as_deref(), Some("top"));
    assert_eq!(found(&d, &[]), None);
}

#[test]
fn invalid_files_name_their_field() {
    let cases = [
        (json!({"descriptors": []}), "domain"),
        (
            json!({"domain": "d", "descriptors": [{"value": "x"}]}),
            "descriptors[0].key",
        ),
        (
            json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unit": "fortnight", "requests_per_unit": 1}}]}),
            "descriptors[0].rate_limit.unit",
        ),
        (
            json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"requests_per_unit": 1}}]}),
            "descriptors[0].rate_limit.unit",
        ),
        (
            json!({"domain": "d", "descriptors": [{"key": "k", "value": "v"}, {"key": "k", "value": "v"}]}),
            "descriptors[1]",
        ),
        (
            json!({"domain": "d", "descriptors": [{"key": "k", "descriptors": [{"key": "a"}, {"key": "a"}]}]}),
            "descriptors[0].descriptors[1]",
        ),
        (
            json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unlimited": true, "unit": "second"}}]}),
            "descriptors[0].rate_limit.unit",
        ),
        (
            json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unlimited": true, "requests_per_unit": 5}}]}),
            "descriptors[0].rate_limit.requests_per_unit",
        ),
        (
            json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "a"}, "replaces": [{}]}]}),
            "descriptors[0].replaces[0].name",
        ),
        (
            json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "a"}, "replaces": [{"name": "a"}]}]}),
            "descriptors[0].replaces[0].name",
        ),
        (
            json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": -1}}]}),
            "descriptors[0].rate_limit.requests_per_unit",
        ),
        (
            json!({"domain": "d", "descriptors": [{"key": "k", "ratelimit": {}}]}),
            "descriptors[0].ratelimit",
        ),
    ];
    for (doc, field) in cases {
        let e = domain(doc.clone()).expect_err(&doc.to_string());
        assert_eq!(e.field, field, "{doc}: {}", e.message);
        assert!(!e.message.is_empty());
    }
}

proptest::proptest! {
    /// Every count the file format can hold, in every unit: accepted and made a rule up
    /// to 10^9, refused naming the field above, never a panic.
    #[test]
    fn every_count_and_unit_is_a_rule_or_a_named_refusal(
        rpu in proptest::prop_oneof![
            proptest::strategy::Just(0u32),
            proptest::strategy::Just(1u32),
            proptest::strategy::Just(1_000_000_000u32),
            proptest::strategy::Just(1_000_000_001u32),
            proptest::strategy::Just(u32::MAX),
            proptest::prelude::any::<u32>(),
        ],
        unit in proptest::sample::select(Unit::ALL.to_vec()),
    ) {
        let doc = json!({"domain": "d", "descriptors": [
            {"key": "k", "rate_limit": {"unit": unit.as_str(), "requests_per_unit": rpu}}]});
        match domain(doc) {
            Ok(mut d) => {
                proptest::prop_assert!(u64::from(rpu) <= super::super::rule::MAX_AMOUNT);
                let rules = d.rules();
                proptest::prop_assert_eq!(rules.len(), usize::from(rpu > 0));
                if rpu > 0 {
                    proptest::prop_assert_eq!(rules[0].algorithm, Algorithm::FixedWindow {
                        limit: u64::from(rpu),
                        window_ms: unit.seconds() * 1000,
                    });
                }
            }
            Err(e) => {
                proptest::prop_assert!(u64::from(rpu) > super::super::rule::MAX_AMOUNT);
                proptest::prop_assert_eq!(e.field, "descriptors[0].rate_limit.requests_per_unit");
            }
        }
    }
}

/// N4 of the second probe: 10,000 limits of one name took 10,000 tries each to name
/// (4 s of a request thread). Each still gets its own name, in order.
#[test]
fn many_limits_of_one_name_get_distinct_names() {
    let descriptors: Vec<_> = (0..MAX_NODES)
        .map(|i| json!({"key": format!("k{i}"), "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "same"}}))
        .collect();
    let mut d = domain(json!({"domain": "d", "descriptors": descriptors})).unwrap();
    let rules = d.rules();
    assert_eq!(rules.len(), MAX_NODES);
    assert_eq!(rules[0].name.as_str(), "same");
    assert_eq!(rules[1].name.as_str(), "same-2");
    assert_eq!(
        rules[MAX_NODES - 1].name.as_str(),
        format!("same-{MAX_NODES}")
    );
    let names: std::collections::HashSet<&str> = rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names.len(), MAX_NODES);
}

#[test]
fn counted_limits_become_fixed_window_rules_with_unique_names() {
    let mut d = domain(json!({"domain": "d", "descriptors": [
        {"key": "a", "rate_limit": {"unit": "MINUTE", "requests_per_unit": 10, "name": "Same Name"}},
        {"key": "b", "rate_limit": {"unit": "day", "requests_per_unit": 3, "name": "same name"}},
        {"key": "c", "rate_limit": {"unlimited": true}},
        {"key": "z", "rate_limit": {"unit": "second", "requests_per_unit": 0}},
        {"key": "e", "value": "/x*", "rate_limit": {"unit": "year", "requests_per_unit": 1}},
    ]}))
    .unwrap();
    let rules = d.rules();
    let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["same-name", "same-name-2", "e--x-"]);
    assert_eq!(
        rules[1].algorithm,
        Algorithm::FixedWindow {
            limit: 3,
            window_ms: 86_400_000
        }
    );
    assert_eq!(
        d.limits[3].allowance,
        Allowance::Count {
            requests_per_unit: 0,
            unit: Unit::Second,
            rule: None
        }
    );
    assert!(matches!(
        d.limits[4].allowance,
        Allowance::Count { rule: Some(2), .. }
    ));
}

#[test]
fn long_or_odd_descriptors_still_make_distinct_valid_identifiers() {
    let long = |tail: &str| RequestDescriptor {
        entries: vec![("path".into(), format!("{}{tail}", "x".repeat(400)))],
    };
    let (a, b) = (long("a").identifier(), long("b").identifier());
    assert_ne!(a, b);
    assert!(a.value().len() <= MAX_VALUE_BYTES);
    let odd = RequestDescriptor {
        entries: vec![("k".into(), "a\nb".into()), ("é".into(), "ü".repeat(200))],
    };
    assert!(odd.identifier().value().starts_with("k=a%0Ab · é="));
    assert_eq!(
        RequestDescriptor {
            entries: vec![
                ("remote_address".into(), "10.0.0.1".into()),
                ("path".into(), "/api".into())
            ]
        }
        .identifier()
        .to_string(),
        "envoy=remote_address=10.0.0.1 · path=/api"
    );
}

/// The collision a probe found: a value holding the separator made two descriptors
/// one counter.
#[test]
fn a_value_holding_the_separator_is_not_two_entries() {
    let victim = RequestDescriptor {
        entries: vec![
            ("user".into(), "v".into()),
            ("method".into(), "b · method=c".into()),
        ],
    };
    let attacker = RequestDescriptor {
        entries: vec![
            ("user".into(), "v · method=b".into()),
            ("method".into(), "c".into()),
        ],
    };
    assert_ne!(victim.identifier(), attacker.identifier());
    assert_eq!(
        victim.identifier().value(),
        "user=v · method=b %C2%B7 method=c"
    );
    // A cut identifier against a short descriptor that spells it out (a reviewer's
    // pair: the cut one used to end in ` #<digest>`, which a value could hold).
    let long = RequestDescriptor {
        entries: vec![("path".into(), format!("/{}", "a".repeat(300)))],
    };
    let cut = long.identifier();
    let spelled = RequestDescriptor {
        entries: vec![(
            "path".into(),
            cut.value().strip_prefix("path=").unwrap().to_owned(),
        )],
    };
    assert_ne!(spelled.identifier(), cut);
    assert!(cut.value().len() <= MAX_VALUE_BYTES);
    // A key's `=`, a `%`, and a control character against what it once became.
    for (a, b) in [
        (("a=b", "c"), ("a", "b=c")),
        (("k", "50%25"), ("k", "50%")),
        (("k", "a\tb"), ("k", "a?b")),
    ] {
        let one = |(k, v): (&str, &str)| {
            RequestDescriptor {
                entries: vec![(k.into(), v.into())],
            }
            .identifier()
        };
        assert_ne!(one(a), one(b), "{a:?} / {b:?}");
    }
}

proptest::proptest! {
    /// Every descriptor that fits an identifier reads back from it exactly, so no two
    /// share one; longer ones still get distinct valid identifiers. The characters are
    /// those that matter to the encoding, with plain ones between them.
    #[test]
    fn a_descriptor_reads_back_from_its_identifier(
        entries in proptest::collection::vec(
            ("[a= %·\t\x00é:]{0,12}", "[a= %·\t\x00é:]{0,40}"),
            1..6,
        ),
        other in proptest::collection::vec(
            ("[a= %·\t\x00é:]{0,12}", "[a= %·\t\x00é:]{0,300}"),
            1..6,
        ),
    ) {
        let id = RequestDescriptor { entries: entries.clone() }.identifier();
        proptest::prop_assert!(id.value().len() <= MAX_VALUE_BYTES);
        if id.value().len() < MAX_VALUE_BYTES - 20 {
            proptest::prop_assert_eq!(RequestDescriptor::entries_of(id.value()), entries.clone());
        }
        let id2 = RequestDescriptor { entries: other.clone() }.identifier();
        proptest::prop_assert!(id2.value().len() <= MAX_VALUE_BYTES);
        if other != entries {
            proptest::prop_assert_ne!(id, id2);
        }
    }
}

#[test]
fn a_star_stands_for_any_run_of_characters_anywhere() {
    for (pattern, value, matches) in [
        ("/api/*", "/api/users", true),
        ("/api/*", "/api/", true),
        ("/api/*", "/ap", false),
        ("bar*b", "barab", true),
        ("bar*b", "bar123b", true),
        ("bar*b", "barb", true),
        ("bar*b", "bara", false),
        ("bar*b", "xbarb", false),
        ("foo*bar*baz", "foobarbaz", true),
        ("foo*bar*baz", "foo1bar2baz", true),
        ("foo*bar*baz", "foo123baz", false),
        ("*", "", true),
        ("a*a", "a", false),
    ] {
        assert_eq!(glob(pattern, value), matches, "{pattern} ~ {value}");
    }
}

#[test]
fn descriptors_read_as_their_entries() {
    assert_eq!(
        readable("envoy=remote_address=10.0.0.1 · path=/api"),
        "remote_address=10.0.0.1 · path=/api"
    );
    assert_eq!(readable("user=42"), "user=42");
    assert_eq!(readable("envoyx=1"), "envoyx=1");
}

#[test]
fn domains_map_to_policy_names() {
    assert_eq!(policy_name("edge_proxy").unwrap().as_str(), "edge_proxy");
    assert_eq!(
        policy_name("Istio.Example").unwrap().as_str(),
        "istio-example"
    );
    assert_eq!(policy_name("_x").unwrap().as_str(), "dx");
    // Envoy Gateway's domains run past a name's 64 characters, and start alike: each keeps
    // its first 55 and a hash of the whole, so they stay apart (cut, they were one).
    let long = |tail: &str| {
        format!("httproute/envoy-gateway-system/eg-with-a-long-name/rule/0/match/0/{tail}")
    };
    let (a, b) = (
        policy_name(&long("a")).unwrap(),
        policy_name(&long("b")).unwrap(),
    );
    assert_ne!(a, b);
    assert_eq!(
        (a.as_str().len(), &a.as_str()[..55]),
        (64, &name_chars(&long("a"))[..55])
    );
    assert_eq!(policy_name(&long("a")).unwrap(), a);
    // One saved before, under the cut name, is still found there.
    assert_eq!(
        cut_policy_name(&long("a")).unwrap().as_str(),
        &name_chars(&long("a"))[..64]
    );
    assert_eq!(cut_policy_name("edge_proxy"), None);
    let exactly = "d".repeat(64);
    assert_eq!(policy_name(&exactly).unwrap().as_str(), exactly);
}

#[test]
fn upstreams_fields_are_read_with_their_meaning() {
    // `replaces` where envoyproxy/ratelimit writes it, inside `rate_limit`.
    let d = domain(json!({"domain": "d", "descriptors": [
        {"key": "a", "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "a"}},
        {"key": "b", "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "b",
            "replaces": [{"name": "a"}]}, "quota_mode": true, "metadata": {"team": ["x"]}},
    ]}))
    .unwrap();
    let b = d.find(&entries(&[("b", "v")])).unwrap();
    assert_eq!((b.replaces.clone(), b.quota), (vec!["a".to_owned()], true));
    // Refused as upstream refuses them, the field named.
    let refused = |v: serde_json::Value| domain(v).unwrap_err().field;
    assert_eq!(
        refused(json!({"domain": "d", "descriptors": [
            {"key": "a", "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "a",
                "replaces": [{"name": "a"}]}}]})),
        "descriptors[0].rate_limit.replaces[0].name"
    );
    assert_eq!(
        refused(json!({"domain": "d", "descriptors": [
            {"key": "a", "value": "exact", "share_threshold": true,
                "rate_limit": {"unit": "second", "requests_per_unit": 1}}]})),
        "descriptors[0].share_threshold"
    );
    assert_eq!(
        refused(json!({"domain": "d", "descriptors": [{"key": "a", "metadata": 5}]})),
        "descriptors[0].metadata"
    );
    // A domain with no descriptors loads, `descriptors:` left empty too: every request
    // is OK.
    let empty = domain(json!({"domain": "d", "descriptors": []})).unwrap();
    assert_eq!(empty.find(&entries(&[("a", "b")])), None);
    assert_eq!(
        domain(json!({"domain": "d", "descriptors": null})).unwrap(),
        empty
    );
}

#[test]
fn metric_keys_are_named_as_upstream_names_its_statistics() {
    let d = domain(json!({"domain": "d", "descriptors": [
        {"key": "k", "value": "v", "rate_limit": {"unit": "second", "requests_per_unit": 1}},
        {"key": "any", "rate_limit": {"unit": "second", "requests_per_unit": 1}},
        {"key": "vtm", "value_to_metric": true, "rate_limit": {"unit": "second", "requests_per_unit": 1}},
        {"key": "w", "value": "p*", "rate_limit": {"unit": "second", "requests_per_unit": 1}},
        {"key": "s", "value": "p*", "share_threshold": true, "rate_limit": {"unit": "second", "requests_per_unit": 1}},
        {"key": "det", "detailed_metric": true, "rate_limit": {"unit": "second", "requests_per_unit": 1}},
        {"key": "outer", "descriptors": [
            {"key": "inner", "rate_limit": {"unit": "second", "requests_per_unit": 1}}]},
    ]}))
    .unwrap();
    let key = |pairs: &[(&str, &str)]| d.lookup(&entries(pairs)).unwrap().metric_key;
    assert_eq!(key(&[("k", "v")]), "d.k_v");
    assert_eq!(key(&[("any", "x")]), "d.any");
    assert_eq!(key(&[("vtm", "x")]), "d.vtm_x");
    assert_eq!(key(&[("w", "pq")]), "d.w_p*");
    assert_eq!(key(&[("s", "pq")]), "d.s_p");
    assert_eq!(key(&[("det", "x")]), "d.det_x");
    assert_eq!(key(&[("outer", "o"), ("inner", "i")]), "d.outer.inner");
    let shared = d.lookup(&entries(&[("s", "pq")])).unwrap().shared;
    assert_eq!(shared, Some(vec![("s".to_owned(), "p*".to_owned())]));
}

#[test]
fn a_domains_counting_is_kept_beside_its_file() {
    let d =
        domain(json!({"domain": "d", "counting": "all_or_nothing", "descriptors": []})).unwrap();
    assert_eq!(
        (d.counting, d.counts),
        (Some(Counting::AllOrNothing), Counting::AllOrNothing)
    );
    let written = serde_json::to_value(&d).unwrap();
    assert_eq!(written["counting"], "all_or_nothing");
    assert_eq!(domain(written).unwrap(), d);
    assert_eq!(
        domain(json!({"domain": "d", "counting": "sometimes"}))
            .unwrap_err()
            .field,
        "counting"
    );
    let plain = domain(json!({"domain": "d"})).unwrap();
    assert_eq!((plain.counting, plain.counts), (None, Counting::EveryHit));
    assert!(
        serde_json::to_value(&plain)
            .unwrap()
            .get("counting")
            .is_none()
    );
}
