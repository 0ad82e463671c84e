//! The dashboard's pages and server functions against a real Redis: the overview (who is
//! throttled, by which rule, since and until when; filtered; 200 policies kept light; and on
//! demand its server time with a million tracked identifiers), validation beside the field,
//! resets that need a reason, the editor's round trip (a failed save without JavaScript
//! keeps what was typed; a delete takes the policy's name typed), Envoy domains pasted all
//! or none, and the dashboard's files compressed and cached by their hashed names.

use std::time::{Duration, Instant};

use reqwest::{StatusCode, header};
use serde_json::{Value, json};
use spillway::domain::people::{AuditFilter, Role};

use crate::{
    auth::{Visitor, add_user, admin, store},
    helpers::{
        PATIENCE, RedisServer, app_state, clear_of_window_turn, eventually, serve, spawn_app,
    },
};

/// Building a router renders the app once with resource loading suppressed process-wide
/// (leptos-rs/leptos#4773): before the route list was made once per process, a page whose
/// data started loading meanwhile never finished, and the suite saw 504s now and then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_render_while_other_routers_are_built() {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    };
    let redis = RedisServer::start();
    let state = app_state(&redis, &[]).await;
    let app = serve(state.clone()).await;
    let building = Arc::new(AtomicBool::new(true));
    let built = Arc::new(AtomicU32::new(0));
    let builder = tokio::task::spawn_blocking({
        let (building, built) = (building.clone(), built.clone());
        move || {
            while building.load(Ordering::Relaxed) {
                drop(spillway::server::router(state.clone()));
                built.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    // Longer than the server's request timeout: a hung page shows as its 504.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let mut failures = Vec::new();
    let mut pages = 0;
    // At least 40 pages, and at least 40 routers built while they were asked for.
    while pages < 40 || (built.load(Ordering::Relaxed) < 40 && pages < 2000) {
        pages += 1;
        match client
            .get(format!("http://{}/login", app.addr))
            .send()
            .await
        {
            Ok(r) if r.status() == StatusCode::OK => {
                let page = r.text().await.unwrap_or_default();
                // The form is inside a Suspense: it is there once the session resource loaded.
                if !page.contains(r#"name="csrf""#) {
                    failures.push(format!("{pages}: no form"));
                }
            }
            Ok(r) => failures.push(format!("{pages}: {}", r.status())),
            Err(e) => failures.push(format!("{pages}: {e}")),
        }
    }
    building.store(false, Ordering::Relaxed);
    builder.await.unwrap();
    let built = built.load(Ordering::Relaxed);
    assert!(built >= 40, "only {built} routers were built meanwhile");
    assert!(
        failures.is_empty(),
        "{} of {pages} pages failed: {failures:?}",
        failures.len()
    );
}

#[tokio::test]
async fn the_policy_editor_names_the_bad_field_and_saves_good_input() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "root", Role::Admin).await;
    let mut v = Visitor::signed_in(&app, "root").await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let mut form = vec![
        ("csrf", csrf.as_str()),
        ("name", "checkout"),
        ("version", "0"),
        ("shadow", "on"),
        ("rules[0][name]", "per-second"),
        ("rules[0][algorithm]", "token_bucket"),
        ("rules[0][capacity]", "0"),
        ("rules[0][tokens]", "5"),
        ("rules[0][period_ms]", "1000"),
        ("rules[1][name]", ""),
        ("rules[1][algorithm]", "fixed_window"),
    ];
    let r = v.post_form("/fn/policy_save", &form, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // The error is typed on the wire: the field and its message apart, nothing to split.
    let error: serde_json::Value = r.json().await.unwrap();
    assert_eq!(error["Field"]["field"], "rules[0].capacity", "{error}");
    let message = error["Field"]["message"].as_str().unwrap();
    assert!(
        !message.is_empty() && !message.contains("rules[0]"),
        "{error}"
    );
    form[6] = ("rules[0][capacity]", "20");
    let r = v.post_form("/fn/policy_save", &form, Some(&origin)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = v
        .post_form("/fn/policy", &[("name", "checkout")], Some(&origin))
        .await;
    let detail: serde_json::Value = r.json().await.unwrap();
    assert_eq!(detail["version"], 1);
    assert_eq!(detail["shadow"], true);
    assert_eq!(detail["rules"][0]["capacity"], "20");
    assert_eq!(detail["rules"][0]["tokens"], "5");
    // Saving from a stale form is refused, not lost silently.
    let r = v.post_form("/fn/policy_save", &form, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let error: serde_json::Value = r.json().await.unwrap();
    assert_eq!(error["Field"]["field"], "version", "{error}");
}

#[tokio::test]
async fn a_reset_needs_a_reason_and_is_audited() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let s = store(&redis).await;
    add_user(&s, "sam", Role::Support).await;
    // An hour's window: the state must still be there when the reset comes, however slow
    // the machine (the demo's one-second window could end before it, and there is nothing
    // left to reset).
    app.put_policy(
        "support",
        json!({"rules": [{"name": "per-hour", "algorithm": "fixed_window", "limit": 10, "window_ms": 3600000}]}),
    )
    .await;
    for _ in 0..15 {
        app.check(json!({"policy": "support", "identifiers": {"user": "7"}}))
            .await;
    }
    let mut v = Visitor::signed_in(&app, "sam").await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let r = v
        .post_form(
            "/fn/reset",
            &[
                ("csrf", &csrf),
                ("id", "user=7"),
                ("scope", "support"),
                ("reason", "  "),
            ],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("reason"));
    let r = v
        .post_form(
            "/fn/reset",
            &[
                ("csrf", &csrf),
                ("id", "user=7"),
                ("scope", "support/per-hour"),
                ("reason", "ticket 12"),
            ],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), 200);
    let answer: serde_json::Value = r.json().await.unwrap();
    assert_eq!(answer["deleted"], 1, "{answer}");
    let inspect: serde_json::Value = v
        .post_form("/fn/inspect", &[("id", "user=7")], Some(&origin))
        .await
        .json()
        .await
        .unwrap();
    let policy = inspect["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == "support")
        .unwrap();
    let per_hour = &policy["rules"][0];
    assert_eq!(per_hour["rule"], "per-hour", "{inspect}");
    assert_eq!(per_hour["remaining"], 10, "{inspect}");
    assert_eq!(per_hour["ttl_ms"], json!(null));
    let audit = s
        .read_audit(
            &AuditFilter {
                action: "identifier.reset".into(),
                ..Default::default()
            },
            10,
            None,
        )
        .await
        .unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].actor, "user:sam");
    assert_eq!(audit[0].reason, "ticket 12");
    assert_eq!(audit[0].target, "user=7");
}

/// `cargo test --features ssr --test it -- --ignored --nocapture overview_with_a_million`
#[tokio::test]
#[ignore = "a measurement: fills Redis with a million identifiers (about a minute)"]
async fn overview_with_a_million_identifiers() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    // 200 policies (the demo policy and 199 more), as issue 19 measures it.
    for i in 0..199 {
        app.put_policy(
            &format!("policy-{i:03}"),
            json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 3600000}]}),
        )
        .await;
    }
    let mut conn = redis.connection();
    // A million identifiers with fixed-window state under the demo policy, with TTLs, as
    // the check script writes them.
    let fill = r#"
        for i = ARGV[1], ARGV[2] do
          redis.call('SET', 'spw:{demo|user|' .. i .. '}:per-second:fw', '1:1', 'PX', 600000)
        end
        return 1"#;
    for start in (0..1_000_000).step_by(50_000) {
        let _: i64 = redis::cmd("EVAL")
            .arg(fill)
            .arg(0)
            .arg(start)
            .arg(start + 49_999)
            .query(&mut conn)
            .unwrap();
    }
    // Live counters with many throttled identifiers, through the real check path.
    for i in 0..2000 {
        for _ in 0..12 {
            app.check(json!({"policy": "demo", "identifiers": {"user": format!("hot{i}")}}))
                .await;
        }
    }
    let keys: u64 = redis::cmd("DBSIZE").query(&mut conn).unwrap();
    assert!(keys >= 1_000_000);
    add_user(&store(&redis).await, "root", Role::Viewer).await;
    let mut v = Visitor::signed_in(&app, "root").await;
    let mut server_us = Vec::new();
    let mut page_ms = Vec::new();
    for _ in 0..21 {
        let r = v.post_form("/fn/overview", &[], None).await;
        let data: serde_json::Value = r.json().await.unwrap();
        server_us.push(data["gathered_us"].as_u64().unwrap());
        let t = Instant::now();
        let page = v.get("/").await;
        assert_eq!(page.status(), 200);
        let bytes = page.text().await.unwrap().len();
        page_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        assert!(bytes < 200_000, "{bytes} bytes of HTML");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server_us.sort();
    page_ms.sort_by(f64::total_cmp);
    println!(
        "overview of 200 policies with {keys} keys: gathering median {} µs (max {} µs); whole page median {:.1} ms (max {:.1} ms)",
        server_us[10], server_us[20], page_ms[10], page_ms[20]
    );
    assert!(server_us[10] < 100_000);
}

/// Every key Spillway writes expires, except policies, users, API keys, the audit log and
/// the alert rules.
#[tokio::test]
async fn every_key_but_policies_people_and_audit_expires() {
    let redis = RedisServer::start();
    let app = crate::helpers::spawn_app_with(
        &redis,
        &[
            ("SPILLWAY_ALERT_EVAL_MS", "300"),
            ("SPILLWAY_WEBHOOK_ALLOWED_TARGETS", "127.0.0.1"),
        ],
    )
    .await;
    let s = store(&redis).await;
    add_user(&s, "root", Role::Admin).await;
    let mut v = Visitor::signed_in(&app, "root").await;
    // A failed sign-in (the limiter's keys), checks (state and counters), a key, a reset.
    let mut other = Visitor::new(&app);
    other.get("/login").await;
    let csrf = other.csrf().await;
    let origin = other.origin();
    other
        .post_form(
            "/auth/login",
            &[
                ("username", "root"),
                ("password", "wrong password!"),
                ("csrf", &csrf),
            ],
            Some(&origin),
        )
        .await;
    // The alert rule below fires on denials in the current minute: its first evaluation
    // (about 7 s from here, more on a slow machine) must fall in the checks' minute.
    crate::helpers::at_least_before_window_turn(Duration::from_secs(60), Duration::from_secs(25))
        .await;
    for i in 0..30 {
        app.check(json!({"policy": "demo", "identifiers": {"user": (i % 3).to_string(), "ip": "203.0.113.9"}}))
            .await;
    }
    let csrf = v.csrf().await;
    let origin = v.origin();
    for (path, form) in [
        ("/fn/key_create", vec![("name", "k"), ("role", "service")]),
        (
            "/fn/reset",
            vec![("id", "user=1"), ("scope", ""), ("reason", "ttl test")],
        ),
    ] {
        let mut form = form;
        form.push(("csrf", &csrf));
        assert_eq!(v.post_form(path, &form, Some(&origin)).await.status(), 200);
    }
    // An alert rule (configuration, kept like the policies) that fires, so the alert keys
    // that come and go are written too.
    let rule = app
        .client
        .put(app.url("/api/v1/alerts/any-denials"))
        .bearer_auth(crate::helpers::ADMIN_KEY)
        .json(
            &json!({"condition": {"kind": "identifier_throttled", "minutes": 1},
            "webhook_url": "http://127.0.0.1:9/unreachable", "secret": "0123456789abcdef"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(rule.status(), 200);
    // Every kind of key written: the cached denials flushed to the live counters (every
    // second), the history's flush (every 5 s) and the alert's keys.
    let mut conn = redis.connection();
    let alert_keys = [
        "spw:{alerts}:firing",
        "spw:{alerts}:outbox",
        "spw:{alerts}:deliveries",
        "spw:{alerts}:lease",
    ];
    let (keys, _): (Vec<String>, u64) = eventually(
        "the 30 checks counted, the history's and the alert's keys",
        PATIENCE,
        async || {
            let (_, rates) = s.policy_rates(&["demo".into()], 60).await.unwrap();
            let counted = rates[0].iter().map(|r| r.allowed + r.denied).sum::<u64>();
            let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
            keys.sort();
            (keys, counted)
        },
        |(keys, counted)| {
            *counted >= 30
                && keys.iter().any(|k| k.starts_with("spw:hist:"))
                && alert_keys.iter().all(|a| keys.iter().any(|k| k == a))
        },
    )
    .await;
    let kept = [
        "spw:{policies}:",
        "spw:{people}:",
        "spw:{audit}:",
        "spw:{alerts}:rules",
    ];
    let mut without_ttl = Vec::new();
    for k in &keys {
        let ttl: i64 = redis::cmd("PTTL").arg(k).query(&mut conn).unwrap();
        if ttl < 0 && !kept.iter().any(|p| k.starts_with(p)) {
            without_ttl.push(k.clone());
        }
    }
    assert!(keys.len() > 15, "{keys:?}");
    assert!(without_ttl.is_empty(), "no TTL: {without_ttl:?}");
    for alert_key in alert_keys {
        assert!(
            keys.iter().any(|k| k == alert_key),
            "{alert_key} was written: {keys:?}"
        );
    }
}

/// Changing one's own password needs the current one, and ends every session.
#[tokio::test]
async fn people_change_their_own_password() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "vic", Role::Viewer).await;
    let mut v = Visitor::signed_in(&app, "vic").await;
    let mut elsewhere = Visitor::signed_in(&app, "vic").await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let change = |current: &'static str| {
        vec![
            ("current", current),
            ("new_password", "a brand new long password"),
        ]
    };
    let mut form = change("not my password");
    form.push(("csrf", &csrf));
    let r = v.post_form("/fn/my_password", &form, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("current"));
    let mut form = change(crate::auth::PASSWORD);
    form.push(("csrf", &csrf));
    let r = v.post_form("/fn/my_password", &form, Some(&origin)).await;
    assert!(
        r.status().is_success() || r.status().is_redirection(),
        "{}",
        r.status()
    );
    // Both sessions are over; the new password works, the old one does not.
    assert_eq!(v.get("/").await.status(), StatusCode::SEE_OTHER);
    assert_eq!(elsewhere.get("/").await.status(), StatusCode::SEE_OTHER);
    let mut again = Visitor::new(&app);
    let r = again.login("vic", crate::auth::PASSWORD).await;
    assert!(
        r.headers()["location"]
            .to_str()
            .unwrap()
            .contains("error=invalid")
    );
    let r = again.login("vic", "a brand new long password").await;
    assert_eq!(r.headers()["location"], "/people");
}

/// 200 policies, 20 of them busy: the overview orders the busy ones by denials, folds the
/// idle ones into one line, filters by name, and stays light: its HTML under 200 KB and its
/// live stream under 10 KB a second (it sends what changed), at every range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_of_200_policies_is_light_ordered_and_filtered() {
    let redis = RedisServer::start();
    let app = crate::helpers::spawn_app_with(&redis, &[("SPILLWAY_HISTORY_FLUSH_MS", "200")]).await;
    for i in 0..200 {
        app.put_policy(
            &format!("policy-{i:03}"),
            json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 3600000}]}),
        )
        .await;
    }
    // Twenty busy policies, policy-007 denying most; the 180 others and the demo policy idle.
    let traffic = async {
        for round in 0..6 {
            for i in 0..20 {
                let n = if i == 7 { 12 } else { 6 };
                for _ in 0..n {
                    app.check(json!({"policy": format!("policy-{i:03}"), "identifiers": {"user": format!("u{round}")}}))
                        .await;
                }
            }
        }
    };
    traffic.await;
    add_user(&store(&redis).await, "ann", Role::Viewer).await;
    let mut v = Visitor::signed_in(&app, "ann").await;
    // The pages once the live counters (flushed every second) and the history (every
    // 200 ms) hold all 756 checks.
    let store = store(&redis).await;
    let busy: Vec<String> = (0..20).map(|i| format!("policy-{i:03}")).collect();
    eventually(
        "the 756 checks in the live counters and the history",
        PATIENCE,
        async || {
            let (_, rates) = store.policy_rates(&busy, 60).await.unwrap();
            let live: u64 = rates.iter().flatten().map(|r| r.allowed + r.denied).sum();
            let day: serde_json::Value = app
                .as_admin(reqwest::Method::GET, "/api/v1/history?range=24h", None)
                .await
                .json()
                .await
                .unwrap();
            let history: u64 = day["points"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| p["allowed"].as_u64().unwrap_or(0) + p["denied"].as_u64().unwrap_or(0))
                .sum();
            (live, history)
        },
        |counted| *counted == (756, 756),
    )
    .await;

    let started = Instant::now();
    let page = v.get("/").await;
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    let elapsed = started.elapsed();
    assert!(
        html.len() < 200_000,
        "overview HTML is {} bytes",
        html.len()
    );
    // The busiest denier is the first chart; the idle ones are one folded line.
    let first_chart = html.find("<figure data-testid=\"rate-").unwrap() + 8;
    assert!(
        html[first_chart..].starts_with("data-testid=\"rate-policy-007\""),
        "{}",
        &html[first_chart..first_chart + 60]
    );
    let idle_at = html
        .find("idle polic")
        .map(|i| &html[i.saturating_sub(20)..i + 20]);
    assert!(
        html.contains("181 idle policies"),
        "idle policies are folded: {idle_at:?}"
    );
    // The traffic came in a burst of a second or two: a short-lived policy is a row of
    // the "more busy" table, not a chart's height (the busiest is still drawn).
    let fig = html.find("<figure").map(|i| &html[i..i + 80]);
    assert_eq!(
        html.matches("<figure data-testid=\"rate-").count(),
        1,
        "{fig:?}"
    );
    let more = &html[html
        .find("data-testid=\"more-busy\"")
        .expect("the more busy table")..];
    assert_eq!(
        more[..more.find("</table>").unwrap()]
            .matches("<tr>")
            .count(),
        1 + 19
    );
    println!(
        "overview of 200 policies: {} bytes of HTML in {elapsed:?}",
        html.len()
    );

    // The filter keeps matching policies only.
    let filtered = v.get("/?filter=policy-01").await.text().await.unwrap();
    assert!(filtered.contains("rate-policy-010"));
    assert!(!filtered.contains("rate-policy-007"));
    // policy-010 to policy-019: all busy (the first drawn, the others rows), nothing idle.
    assert_eq!(filtered.matches("<figure data-testid=\"rate-").count(), 1);
    assert!(!filtered.contains("idle polic"));

    // A past range: every policy's chart and each policy's totals, most denials first.
    let day = v.get("/?range=24h").await.text().await.unwrap();
    assert!(
        day.len() < 200_000,
        "24h overview HTML is {} bytes",
        day.len()
    );
    let table = day
        .find("data-testid=\"policy-totals\"")
        .expect("the per-policy table");
    let first_row = day[table..].find("policy=policy-").unwrap();
    assert!(
        day[table + first_row..].starts_with("policy=policy-007"),
        "{}",
        &day[table + first_row..table + first_row + 40]
    );
    assert!(day.contains("181 idle policies"));

    // The live stream: a full first event, then only what changed.
    let mut stream = v.get("/events/overview").await;
    assert_eq!(stream.status(), StatusCode::OK);
    let mut bytes = Vec::new();
    let listen = Instant::now();
    let mut events = 0;
    while listen.elapsed() < Duration::from_millis(4500) {
        match tokio::time::timeout(Duration::from_secs(2), stream.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                events += chunk.windows(5).filter(|w| w == b"data:").count();
                bytes.push(chunk.len());
            }
            _ => break,
        }
    }
    let first = bytes.first().copied().unwrap_or(0);
    let rest: usize = bytes.iter().skip(1).sum();
    assert!(events >= 4, "{events} events");
    let per_second = rest as f64 / (events - 1) as f64;
    assert!(
        per_second < 10_000.0,
        "{per_second} bytes a second after the first event"
    );
    println!("live stream: first event {first} bytes, then {per_second:.0} bytes a second");
}

/// The inspector with 20 policies: the one where `user=scraper` has state comes as a card,
/// the 19 others (and the demo policy) fold into one line; and when it was throttled over
/// the last 7 days comes from the history's hourly lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_shows_where_an_identifier_binds_and_when_it_was_throttled() {
    let redis = RedisServer::start();
    let app = crate::helpers::spawn_app_with(&redis, &[("SPILLWAY_HISTORY_FLUSH_MS", "200")]).await;
    for i in 0..20 {
        app.put_policy(
            &format!("p{i:02}"),
            json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 2, "window_ms": 3600000}]}),
        )
        .await;
    }
    for _ in 0..10 {
        app.check(json!({"policy": "p07", "identifiers": {"user": "scraper"}}))
            .await;
    }
    // The denials in the history's top lists (flushed every 200 ms).
    eventually(
        "scraper's 8 denials in the history",
        PATIENCE,
        async || {
            let day: serde_json::Value = app
                .as_admin(
                    reqwest::Method::GET,
                    "/api/v1/history?policy=p07&range=24h",
                    None,
                )
                .await
                .json()
                .await
                .unwrap();
            day["top_denied"].clone()
        },
        |top| top[0]["identifier"] == "user=scraper" && top[0]["count"] == 8,
    )
    .await;
    add_user(&store(&redis).await, "ann", Role::Viewer).await;
    let mut v = Visitor::signed_in(&app, "ann").await;
    let page = v
        .get("/identifiers?id=user%3Dscraper")
        .await
        .text()
        .await
        .unwrap();
    let card = page
        .find("aria-label=\"user=scraper in ")
        .map(|i| &page[i.saturating_sub(60)..i + 60]);
    assert_eq!(
        page.matches("aria-label=\"user=scraper in ").count(),
        1,
        "one policy card: {card:?}"
    );
    assert!(page.contains("aria-label=\"user=scraper in p07\""));
    assert!(
        page.replace("<!>", "")
            .contains("No state in 20 other policies</summary><p>demo, p00, p01"),
        "the others fold into one line: {:?}",
        page.find("No state in").map(|i| &page[i..i + 120])
    );
    let throttled = &page[page
        .find("data-testid=\"throttled-7d\"")
        .expect("the 7-day section")..];
    let table = throttled[..throttled.find("</table>").unwrap()].replace("<!>", "");
    // 10 checks against a limit of 2: 8 denials, in the current hour.
    assert!(
        table.contains("<td>p07</td><td class=\"num\">1</td><td class=\"num\">8</td>"),
        "{table}"
    );
}

pub(crate) async fn overview(v: &mut Visitor, form: &[(&str, &str)]) -> Value {
    let r = v.post_form("/fn/overview", form, None).await;
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

#[tokio::test]
async fn throttled_now_names_the_rule_since_and_until_when_and_every_identifier() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "scrape",
        json!({"rules": [
            {"name": "per-minute", "algorithm": "fixed_window", "limit": 2, "window_ms": 60000, "dimensions": ["ip"]},
            {"name": "per-hour", "algorithm": "fixed_window", "limit": 1000, "window_ms": 3600000, "dimensions": ["user"]}
        ]}),
    )
    .await;
    clear_of_window_turn(Duration::from_secs(60)).await;
    for _ in 0..5 {
        app.check(
            json!({"policy": "scrape", "identifiers": {"user": "scraper", "ip": "192.0.2.66"}}),
        )
        .await;
    }
    let mut v = admin(&app, &redis).await;
    let row = eventually(
        "the denial's details",
        PATIENCE,
        async || overview(&mut v, &[]).await["throttled"][0].clone(),
        |row| row["rule"].is_string() && row["denials"] == 3,
    )
    .await;
    assert_eq!(row["policy"], "scrape");
    assert_eq!(row["identifier"], "ip=192.0.2.66", "{row}");
    assert_eq!(row["rule"], "per-minute");
    let ids: Vec<&str> = row["identifiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"user=scraper") && ids.contains(&"ip=192.0.2.66"),
        "{ids:?}"
    );
    let (first, last, until) = (
        row["first_ms"].as_i64().unwrap(),
        row["last_ms"].as_i64().unwrap(),
        row["until_ms"].as_i64().unwrap(),
    );
    assert!(first <= last && until > last, "{row}");
    assert!(
        until - last <= 60_000,
        "blocked until the window ends: {row}"
    );
    // The page shows the same, rendered on the server.
    let page = v.get("/").await.text().await.unwrap();
    for text in [
        "user=scraper",
        "scrape › per-minute",
        "blocked",
        "data-testid=\"status-strip\"",
    ] {
        assert!(page.contains(text), "the overview shows {text:?}");
    }
}

#[tokio::test]
async fn a_filtered_overview_lists_its_policy_however_many_others_are_busier() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let rule = json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000}]});
    app.put_policy("quiet", rule.clone()).await;
    for i in 0..12 {
        app.put_policy(&format!("noisy-{i}"), rule.clone()).await;
    }
    clear_of_window_turn(Duration::from_secs(3600)).await;
    app.check(json!({"policy": "quiet", "identifiers": {"user": "bob"}}))
        .await;
    app.check(json!({"policy": "quiet", "identifiers": {"user": "bob"}}))
        .await;
    for i in 0..12 {
        for _ in 0..4 {
            app.check(json!({"policy": format!("noisy-{i}"), "identifiers": {"user": "x"}}))
                .await;
        }
    }
    let mut v = admin(&app, &redis).await;
    let listed = |o: &Value, policy: &str| {
        o["throttled"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["policy"] == policy)
    };
    let everything = eventually(
        "every noisy policy's denials",
        PATIENCE,
        async || overview(&mut v, &[]).await,
        |o| {
            let rows = o["throttled"].as_array().unwrap();
            rows.len() == 10 && rows.iter().all(|r| r["denials"] == 3)
        },
    )
    .await;
    assert!(!listed(&everything, "quiet"), "crowded out of the top 10");
    let filtered = eventually(
        "quiet's own list",
        PATIENCE,
        async || overview(&mut v, &[("filter", "quiet")]).await,
        |o| listed(o, "quiet"),
    )
    .await;
    assert_eq!(filtered["throttled"].as_array().unwrap().len(), 1);
    assert_eq!(filtered["throttled"][0]["identifier"], "user=bob");
    // "Show all" lists past the top 10.
    let all = overview(&mut v, &[("all", "true")]).await;
    assert_eq!(all["throttled"].as_array().unwrap().len(), 13);
}

#[tokio::test]
async fn a_failed_save_without_javascript_comes_back_with_what_was_typed() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut v = admin(&app, &redis).await;
    let csrf = v.csrf().await;
    // A form post as a browser without JavaScript sends it (and not following redirects).
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = client
        .post(app.url("/fn/policy_save"))
        .header(header::COOKIE, v.cookie_header().unwrap())
        .header(header::ORIGIN, v.origin())
        .header(header::ACCEPT, "text/html,application/xhtml+xml")
        .header(header::REFERER, app.url("/policy?name=typed"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("name", "typed"),
            ("version", "0"),
            ("description", "typed by hand"),
            ("rules[0][name]", ""),
            ("rules[0][algorithm]", "fixed_window"),
            ("rules[1][name]", "burst"),
            ("rules[1][algorithm]", "token_bucket"),
            ("rules[1][capacity]", "10"),
            ("rules[1][tokens]", "5"),
            ("rules[1][period_ms]", ""),
            ("rules[1][period_unit]", "s"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FOUND);
    let location = r.headers()[header::LOCATION].to_str().unwrap().to_owned();
    assert!(
        location.starts_with("/policy?name=typed&draft="),
        "{location}"
    );
    let page = v.get(&location).await.text().await.unwrap();
    for text in [
        "Not saved.",
        "Rule 2 (burst) › Period",
        r#"value="typed by hand""#,
        r#"<option value="token_bucket" selected"#,
        r#"value="10""#,
    ] {
        assert!(page.contains(text), "the page keeps {text:?}");
    }
    // Nothing was stored.
    let r = app
        .as_admin(reqwest::Method::GET, "/api/v1/policies/typed", None)
        .await;
    assert_eq!(r.status(), 404);
}

/// "What would this do?" without JavaScript: the editor's form posted with
/// `intent=what-if` saves nothing and comes back with the draft in the address, where the
/// page replays it over the recorded checks: the heavy user a halved limit would throttle.
#[tokio::test]
async fn what_would_this_do_replays_the_draft_without_javascript_and_saves_nothing() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let rule = |limit: u64| json!({"rules": [{"name": "per-hour", "algorithm": "fixed_window", "limit": limit, "window_ms": 3600000}]});
    app.put_policy("asked", rule(4)).await;
    for who in ["heavy", "heavy", "heavy", "heavy", "light"] {
        let r = app
            .check(json!({"policy": "asked", "identifiers": {"user": who}}))
            .await;
        assert_eq!(r.status(), 200);
    }
    crate::helpers::eventually(
        "the checks recorded",
        crate::helpers::PATIENCE,
        async || {
            app.as_admin(
                reqwest::Method::POST,
                "/api/v1/policies/asked/what-if",
                Some(&json!({})),
            )
            .await
            .json::<serde_json::Value>()
            .await
            .unwrap()["checks"]
                .as_u64()
        },
        |n| *n == Some(5),
    )
    .await;
    let mut v = admin(&app, &redis).await;
    let csrf = v.csrf().await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = client
        .post(app.url("/fn/policy_save"))
        .header(header::COOKIE, v.cookie_header().unwrap())
        .header(header::ORIGIN, v.origin())
        .header(header::ACCEPT, "text/html,application/xhtml+xml")
        .header(header::REFERER, app.url("/policy?name=asked"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("name", "asked"),
            ("version", "1"),
            ("description", "halved"),
            ("rules[0][name]", "per-hour"),
            ("rules[0][algorithm]", "fixed_window"),
            ("rules[0][limit]", "2"),
            ("rules[0][window_ms]", "1"),
            ("rules[0][window_unit]", "h"),
            ("intent", "what-if"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FOUND);
    let location = r.headers()[header::LOCATION].to_str().unwrap().to_owned();
    assert!(
        location.contains("whatif=1") && location.contains("draft="),
        "{location}"
    );
    let page = v.get(&location).await.text().await.unwrap();
    for text in [
        r#"data-testid="what-if""#,
        "2 that were let through would be denied",
        "user=heavy",
        r#"value="halved""#,
    ] {
        assert!(page.contains(text), "the page says {text:?}: {page}");
    }
    // A suggested limit is a link that puts it in the form and asks again: 1 an hour
    // throttles only the heavy user, 3 of its checks.
    for text in [
        "Suggested limits",
        "Use 1",
        "throttles user=heavy (3 checks newly denied)",
    ] {
        assert!(page.contains(text), "the page says {text:?}: {page}");
    }
    let at = page.find(">Use 1<").unwrap();
    let href_at = page[..at].rfind("href=\"").unwrap() + 6;
    let href = page[href_at..at - 1].replace("&amp;", "&");
    let again = v.get(&href).await.text().await.unwrap();
    for text in [
        "3 that were let through would be denied",
        r#"name="rules[0][limit]" value="1""#,
    ] {
        assert!(again.contains(text), "the page says {text:?}: {again}");
    }
    // Nothing was saved: still version 1, limit 4.
    let stored = app.get_policy("asked").await;
    assert_eq!(
        (
            stored["version"].as_u64(),
            stored["rules"][0]["limit"].as_u64()
        ),
        (Some(1), Some(4))
    );
}

/// Without JavaScript too: a version's "What would rolling back … do?" replays that version
/// under the overrides in force, the look back switches to the last day, and an Envoy
/// domain's file posted with `intent=what-if` comes back in the address and is replayed
/// (a halved limit names the client it would throttle), nothing saved.
#[tokio::test]
async fn a_rollback_and_a_domain_file_are_replayed_without_javascript() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let rule = |limit: u64| json!({"rules": [{"name": "per-hour", "algorithm": "fixed_window", "limit": limit, "window_ms": 3600000}]});
    app.put_policy("undo", rule(2)).await;
    app.put_policy("undo", rule(6)).await;
    for _ in 0..4 {
        let r = app
            .check(json!({"policy": "undo", "identifiers": {"user": "ann"}}))
            .await;
        assert_eq!(r.status(), 200);
    }
    let file = |n: u64| {
        format!(
            "domain: undo-edge\ndescriptors:\n  - key: client\n    rate_limit: {{unit: hour, requests_per_unit: {n}}}\n"
        )
    };
    crate::envoy::load(&app, "undo-edge", &file(6)).await;
    let mut grpc = crate::envoy::client(&app).await;
    for _ in 0..4 {
        let message = crate::envoy::request(
            "undo-edge",
            vec![crate::envoy::descriptor(&[("client", "bot")])],
        );
        crate::envoy::ask(&mut grpc, message).await;
    }
    for policy in ["undo", "undo-edge"] {
        crate::helpers::eventually(
            "the checks recorded",
            crate::helpers::PATIENCE,
            async || {
                let path = format!("/api/v1/policies/{policy}/what-if");
                app.as_admin(reqwest::Method::POST, &path, Some(&json!({})))
                    .await
                    .json::<serde_json::Value>()
                    .await
                    .unwrap()["checks"]
                    .as_u64()
            },
            |n| *n == Some(4),
        )
        .await;
    }
    let mut v = admin(&app, &redis).await;
    let page = v.get("/policy?name=undo").await.text().await.unwrap();
    let link = "/policy?name=undo&amp;version=1&amp;whatif=1#what-if";
    assert!(
        page.contains(link),
        "the versions list links {link}: {page}"
    );
    let page = v
        .get("/policy?name=undo&version=1&whatif=1&last=day")
        .await
        .text()
        .await
        .unwrap();
    for text in [
        "What would rolling back to version 1 do? The last day, replayed",
        "2 that were let through would be denied",
        "user=ann",
    ] {
        assert!(page.contains(text), "the page says {text:?}: {page}");
    }
    let csrf = v.csrf().await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let halved = file(3);
    let r = client
        .post(app.url("/fn/envoy_save"))
        .header(header::COOKIE, v.cookie_header().unwrap())
        .header(header::ORIGIN, v.origin())
        .header(header::ACCEPT, "text/html,application/xhtml+xml")
        .header(header::REFERER, app.url("/policy?name=undo-edge"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("name", "undo-edge"),
            ("version", "1"),
            ("file", halved.as_str()),
            ("counting", "default"),
            ("intent", "what-if"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FOUND);
    let location = r.headers()[header::LOCATION].to_str().unwrap().to_owned();
    assert!(location.contains("file="), "{location}");
    let page = v.get(&location).await.text().await.unwrap();
    for text in ["1 that were let through would be denied", "client=bot"] {
        assert!(page.contains(text), "the page says {text:?}: {page}");
    }
    assert_eq!(
        app.get_policy("undo-edge").await["version"],
        1,
        "nothing saved"
    );
}

#[tokio::test]
async fn a_delete_takes_the_policys_name_typed() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "keep-me",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000}]}),
    )
    .await;
    let mut v = admin(&app, &redis).await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    for confirm in ["", "keep", "KEEP-ME"] {
        let r = v
            .post_form(
                "/fn/policy_delete",
                &[("csrf", &csrf), ("name", "keep-me"), ("confirm", confirm)],
                Some(&origin),
            )
            .await;
        assert_eq!(r.status(), 400, "{confirm:?}");
        assert!(r.text().await.unwrap().contains("type the policy's name"));
    }
    let r = app
        .as_admin(reqwest::Method::GET, "/api/v1/policies/keep-me", None)
        .await;
    assert_eq!(r.status(), 200);
    let r = v
        .post_form(
            "/fn/policy_delete",
            &[("csrf", &csrf), ("name", "keep-me"), ("confirm", "keep-me")],
            Some(&origin),
        )
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    let r = app
        .as_admin(reqwest::Method::GET, "/api/v1/policies/keep-me", None)
        .await;
    assert_eq!(r.status(), 404);
    // Undo: it comes back as it was.
    let r = v
        .post_form(
            "/fn/policy_restore",
            &[("csrf", &csrf), ("name", "keep-me")],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let back: Value = app
        .as_admin(reqwest::Method::GET, "/api/v1/policies/keep-me", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(back["rules"][0]["limit"], 1);
    // Once there again, it cannot be restored over.
    let r = v
        .post_form(
            "/fn/policy_restore",
            &[("csrf", &csrf), ("name", "keep-me")],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn assets_go_out_compressed_and_cached_by_their_hashed_names() {
    let redis = RedisServer::start();
    let root = std::env::temp_dir().join(format!("spillway-site-{}", std::process::id()));
    let pkg = root.join("pkg");
    std::fs::create_dir_all(&pkg).unwrap();
    let wasm = "spillway.Xq3bW9zyjtv1VB1gxHiTeQ.wasm";
    std::fs::write(pkg.join(wasm), vec![0u8; 4096]).unwrap();
    std::fs::write(pkg.join(format!("{wasm}.br")), b"brotli bytes").unwrap();
    std::fs::write(pkg.join(format!("{wasm}.gz")), b"gzip bytes").unwrap();
    std::fs::write(pkg.join("spillway.css"), b"body{}").unwrap();
    let toml = root.join("Leptos.toml");
    std::fs::write(
        &toml,
        format!(
            "[package.metadata.leptos]\noutput-name = \"spillway\"\nsite-root = {:?}\nsite-pkg-dir = \"pkg\"\n",
            root.to_string_lossy()
        ),
    )
    .unwrap();
    let state = app_state(&redis, &[("SPILLWAY_LEPTOS_TOML", &toml.to_string_lossy())]).await;
    let app = serve(state).await;
    let get = |path: String, encoding: &'static str| {
        let client = reqwest::Client::builder().no_gzip().build().unwrap();
        async move {
            client
                .get(path)
                .header(header::ACCEPT_ENCODING, encoding)
                .send()
                .await
                .unwrap()
        }
    };
    let r = get(app.url(&format!("/pkg/{wasm}")), "br, gzip").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[header::CONTENT_ENCODING], "br");
    assert_eq!(
        r.headers()[header::CACHE_CONTROL],
        "public, max-age=31536000, immutable"
    );
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"brotli bytes");
    let r = get(app.url(&format!("/pkg/{wasm}")), "gzip").await;
    assert_eq!(r.headers()[header::CONTENT_ENCODING], "gzip");
    let r = get(app.url(&format!("/pkg/{wasm}")), "identity").await;
    assert!(r.headers().get(header::CONTENT_ENCODING).is_none());
    assert_eq!(r.bytes().await.unwrap().len(), 4096);
    // A name without a hash is asked for again each time.
    let r = get(app.url("/pkg/spillway.css"), "br").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[header::CACHE_CONTROL], "no-cache");
    let r = get(app.url("/pkg/missing.js"), "br").await;
    assert_eq!(r.status(), 404);
    std::fs::remove_dir_all(&root).ok();
}

/// An engineer pastes two domain files at once: both load, or, when one is wrong, neither,
/// with the document named; the list tells domains from policies, with traffic.
#[tokio::test]
async fn envoy_domains_are_loaded_from_the_dashboard_all_or_none() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut v = admin(&app, &redis).await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let two = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n---\ndomain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let broken = format!(
        "{two}---\ndomain: third\ndescriptors:\n  - key: user\n    rate_limit: {{unit: fortnight, requests_per_unit: 5}}\n"
    );
    let r = v
        .post_form(
            "/fn/envoy_import",
            &[("csrf", &csrf), ("file", &broken)],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), 400);
    let text = r.text().await.unwrap();
    assert!(text.contains("document 3"), "{text}");
    for name in ["edge", "api", "third"] {
        let r = app
            .as_admin(
                reqwest::Method::GET,
                &format!("/api/v1/policies/{name}"),
                None,
            )
            .await;
        assert_eq!(r.status(), 404, "{name}: all or none");
    }
    let r = v
        .post_form(
            "/fn/envoy_import",
            &[("csrf", &csrf), ("file", two)],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), 200);
    let names: Vec<String> = r.json().await.unwrap();
    assert_eq!(names, ["edge", "api"]);
    let list: Value = v
        .post_form("/fn/policies", &[], None)
        .await
        .json()
        .await
        .unwrap();
    let row = |name: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(row("edge")["envoy_domain"], "edge");
    assert!(row("demo")["envoy_domain"].is_null());
    assert!(
        row("edge")["changed_ms"].as_i64().is_some(),
        "the import is in the audit log"
    );
    // The domain's page says how to wire Envoy to it.
    let page = v.get("/policy?name=edge").await.text().await.unwrap();
    assert!(page.contains("Wire Envoy to this domain"));
    assert!(page.contains("envoy.filters.http.ratelimit"));
    assert!(page.contains("remote_address: {}"));
}

/// An override's expiry that would overflow is refused with its field named, not stored
/// already expired.
#[tokio::test]
async fn an_override_expiry_that_overflows_is_refused() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "root", Role::Admin).await;
    let mut v = Visitor::signed_in(&app, "root").await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    for (minutes, status) in [
        ("18446744073709551615", 400),
        ("9223372036854775807", 400),
        ("5270401", 400),
        ("60", 200),
    ] {
        let form = [
            ("csrf", csrf.as_str()),
            ("name", "demo"),
            ("matcher", "user=vip"),
            ("action", "unlimited"),
            ("expires_minutes", minutes),
        ];
        let r = v.post_form("/fn/override_add", &form, Some(&origin)).await;
        assert_eq!(r.status().as_u16(), status, "{minutes}");
        if status == 400 {
            assert!(
                r.text().await.unwrap().contains("expires_minutes"),
                "{minutes}"
            );
        }
    }
    let policy = app.get_policy("demo").await;
    let overrides = policy["overrides"].as_array().unwrap();
    assert_eq!(overrides.len(), 1, "{policy}");
    let expires = overrides[0]["expires_at_ms"].as_i64().unwrap();
    let now = spillway::support::clock::now_ms();
    assert!(
        expires > now + 59 * 60_000 && expires <= now + 60 * 60_000,
        "{expires}"
    );
}

#[tokio::test]
async fn a_domain_file_that_fails_to_load_comes_back_with_its_error_and_its_text() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut v = admin(&app, &redis).await;
    let csrf = v.csrf().await;
    let file = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: fortnight, requests_per_unit: 10}\n";
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(app.url("/fn/envoy_import"))
        .header(header::COOKIE, v.cookie_header().unwrap())
        .header(header::ORIGIN, v.origin())
        .header(header::ACCEPT, "text/html")
        .form(&[("csrf", csrf.as_str()), ("file", file)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FOUND);
    let back = r.headers()[header::LOCATION].to_str().unwrap().to_owned();
    assert!(back.starts_with("/policies?kept="), "{back}");
    assert!(!back.contains("__err"), "{back}");
    let page = v.get(&back).await.text().await.unwrap();
    let form = &page[page.find("id=\"envoy-new\"").expect("the form")..];
    assert!(form.contains("data-testid=\"envoy-new-error\""), "{form}");
    assert!(
        form.contains("fortnight"),
        "the pasted text is kept: {form}"
    );
}

#[tokio::test]
async fn the_policy_list_is_paged_with_busy_ones_first_and_idle_ones_folded() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let rule = json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 60000}]});
    for i in 0..60 {
        app.put_policy(&format!("p{i:02}"), rule.clone()).await;
    }
    // One busy policy, last by name.
    app.check(json!({"policy": "p59", "identifiers": {"user": "u"}}))
        .await;
    let mut v = admin(&app, &redis).await;
    // 61 with the demo policy: two pages; the busy one first once the history has it.
    let first = eventually(
        "p59 first",
        PATIENCE,
        async || v.get("/policies").await.text().await.unwrap(),
        |page| {
            page.find("data-testid=\"policies\"")
                .is_some_and(|at| page[at..].contains("p59"))
        },
    )
    .await;
    let busy = &first[first.find("data-testid=\"policies\"").unwrap()..];
    let busy = &busy[..busy.find("</table>").unwrap()];
    assert!(busy.contains("p59") && !busy.contains("p00"), "{busy}");
    assert!(
        first.contains("data-testid=\"idle-policies\""),
        "the idle ones fold"
    );
    assert!(
        first.contains("Policies 1–50 of 61 · page 1 of 2"),
        "the pager"
    );
    let second = v.get("/policies?page=2").await.text().await.unwrap();
    assert!(second.contains("Policies 51–61 of 61 · page 2 of 2"));
    assert!(second.contains("p58") && !second.contains(">p01<"));
    // The search narrows before paging.
    let found = v.get("/policies?q=p1").await.text().await.unwrap();
    assert!(!found.contains("data-testid=\"pager\""));
    assert!(found.contains("p10") && found.contains("p19") && !found.contains(">p20<"));
}
