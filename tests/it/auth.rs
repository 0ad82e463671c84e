//! People and keys: sign-in (its budgets per account and per IPv6 network, and where it
//! sends one after), sessions (secure cookies behind a proxy; a session that cannot be read
//! is not a sign-out), CSRF, roles on every server function and admin route (a catch-all
//! loosening override is an admin's), API key revocation, and the audit trail and its
//! API's bounds. Against a real Redis and the real app.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode, header};
use serde_json::{Value, json};
use spillway::{
    domain::people::{AuditFilter, KeyRole, Role},
    service::Service,
    service::audit::Actor,
    store::{Keys, Store},
};

use crate::helpers::{
    ADMIN_KEY, PATIENCE, RedisServer, SERVICE_KEY, TestApp, eventually, spawn_app, spawn_app_with,
};

pub(crate) const PASSWORD: &str = "correct horse battery staple";

pub(crate) async fn store(redis: &RedisServer) -> Store {
    Store::connect_with_keys(&redis.url(), Duration::from_secs(2), Keys::default())
        .await
        .unwrap()
}

fn test_actor() -> Actor {
    Actor {
        name: "test".into(),
        role: "admin".into(),
        ip: String::new(),
    }
}

pub(crate) async fn add_user(store: &Store, name: &str, role: Role) {
    Service::for_command(store.clone())
        .add_user(&test_actor(), name, role, PASSWORD)
        .await
        .unwrap();
}

/// A browser-like client: keeps the session cookie and the sign-in form's cookie, never
/// follows redirects.
pub(crate) struct Visitor {
    base: String,
    client: reqwest::Client,
    cookie: Option<String>,
    login_cookie: Option<String>,
    /// Sent as `X-Forwarded-For` on every request (a visitor behind a proxy).
    pub(crate) forwarded_for: Option<String>,
}

impl Visitor {
    pub(crate) fn new(app: &TestApp) -> Self {
        Self {
            base: format!("http://{}", app.addr),
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            cookie: None,
            login_cookie: None,
            forwarded_for: None,
        }
    }

    fn keep_cookie(&mut self, response: &reqwest::Response) {
        for v in response.headers().get_all(header::SET_COOKIE) {
            let v = v.to_str().unwrap();
            let pair = v.split(';').next().unwrap();
            let (name, value) = pair.split_once('=').unwrap();
            if name == "spillway_session" {
                self.cookie = (!value.is_empty()).then(|| pair.to_owned());
            }
            if name == "spillway_login" {
                self.login_cookie = (!value.is_empty()).then(|| pair.to_owned());
            }
        }
    }

    /// The `Cookie` header this browser sends, if any.
    pub(crate) fn cookie_header(&self) -> Option<String> {
        let pairs: Vec<&str> = [&self.cookie, &self.login_cookie]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        (!pairs.is_empty()).then(|| pairs.join("; "))
    }

    pub(crate) async fn get(&mut self, path: &str) -> reqwest::Response {
        let mut req = self.client.get(format!("{}{path}", self.base));
        if let Some(c) = self.cookie_header() {
            req = req.header(header::COOKIE, c);
        }
        if let Some(f) = &self.forwarded_for {
            req = req.header("x-forwarded-for", f);
        }
        let r = req.send().await.unwrap();
        self.keep_cookie(&r);
        r
    }

    pub(crate) async fn post_form(
        &mut self,
        path: &str,
        form: &[(&str, &str)],
        origin: Option<&str>,
    ) -> reqwest::Response {
        let mut req = self.client.post(format!("{}{path}", self.base)).form(form);
        if let Some(c) = self.cookie_header() {
            req = req.header(header::COOKIE, c);
        }
        if let Some(f) = &self.forwarded_for {
            req = req.header("x-forwarded-for", f);
        }
        if let Some(o) = origin {
            req = req.header(header::ORIGIN, o);
        }
        let r = req.send().await.unwrap();
        self.keep_cookie(&r);
        r
    }

    pub(crate) fn origin(&self) -> String {
        self.base.clone()
    }

    /// The session's CSRF token, as the page's forms carry it.
    pub(crate) async fn csrf(&mut self) -> String {
        let r = self.post_form("/fn/whoami", &[], None).await;
        assert_eq!(r.status(), 200);
        let v: serde_json::Value = r.json().await.unwrap();
        v["csrf"].as_str().unwrap().to_owned()
    }

    pub(crate) async fn login(&mut self, user: &str, password: &str) -> reqwest::Response {
        let page = self.get("/login").await;
        let status = page.status();
        // A visitor signed in already is sent on: signing in again goes straight to the form.
        if status != 200 && !(status == StatusCode::SEE_OTHER && self.cookie.is_some()) {
            // Say what came instead of the form (a 504 here was leptos-rs/leptos#4773, see
            // server::dashboard_routes).
            let headers = format!("{:?}", page.headers());
            let body = page.text().await.unwrap_or_default();
            let body: String = body.chars().take(2000).collect();
            panic!("GET /login: {status}\n{headers}\n{body}");
        }
        let csrf = self.csrf().await;
        let origin = self.origin();
        self.post_form(
            "/auth/login",
            &[
                ("username", user),
                ("password", password),
                ("csrf", &csrf),
                ("next", "/people"),
            ],
            Some(&origin),
        )
        .await
    }

    pub(crate) async fn signed_in(app: &TestApp, user: &str) -> Self {
        let mut v = Self::new(app);
        let r = v.login(user, PASSWORD).await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        assert_eq!(r.headers()[header::LOCATION], "/people");
        v
    }
}

fn location(r: &reqwest::Response) -> String {
    r.headers()
        .get(header::LOCATION)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn the_first_start_creates_exactly_one_admin() {
    let redis = RedisServer::start();
    let _a = spawn_app(&redis).await;
    let _b = spawn_app(&redis).await;
    let users = store(&redis).await.list_users().await.unwrap();
    assert_eq!(users.len(), 1);
    assert_eq!(users[0].username.as_str(), "admin");
    assert_eq!(users[0].role, Role::Admin);
    assert!(users[0].password_hash.starts_with("$argon2id$"));
}

#[tokio::test]
async fn the_dashboard_renders_on_the_server_for_people_signed_in() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "ann", Role::Viewer).await;
    let mut anon = Visitor::new(&app);
    let r = anon.get("/identifiers?q=user%3D1").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(location(&r), "/login?next=/identifiers%3Fq%3Duser%253D1");
    let mut v = Visitor::signed_in(&app, "ann").await;
    let r = v.get("/").await;
    assert_eq!(r.status(), 200);
    // Hydration markers (`<!>`) sit between text nodes; the words are what matter here.
    let html = r.text().await.unwrap().replace("<!>", "");
    assert!(html.contains("<h1>Overview</h1>"), "{html}");
    assert!(
        html.contains("Server clock"),
        "the server function ran during SSR: {html}"
    );
    assert!(html.contains("data-testid=\"whoami\">ann"), "{html}");
}

#[tokio::test]
async fn signing_in_starts_a_new_session_and_ends_the_one_before() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "ann", Role::Viewer).await;

    let mut v = Visitor::signed_in(&app, "ann").await;
    let before = v.cookie.clone().expect("signed in");
    let r = v.login("ann", PASSWORD).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "{}", location(&r));
    let cookies: Vec<String> = r
        .headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|c| c.to_str().unwrap().to_owned())
        .collect();
    let session = cookies
        .iter()
        .find(|c| c.starts_with("spillway_session="))
        .unwrap();
    assert!(session.contains("HttpOnly") && session.contains("SameSite=Strict"));
    // The sign-in form's cookie is removed once signed in.
    assert!(
        cookies.iter().any(|c| c.starts_with("spillway_login=;")),
        "{cookies:?}"
    );
    let after = v.cookie.clone().unwrap();
    assert_ne!(before, after, "the session id changes at login");

    // The new session is signed in.
    assert_eq!(v.get("/").await.status(), 200);
    // The id from before is dead.
    let mut attacker = Visitor::new(&app);
    attacker.cookie = Some(before);
    let r = attacker.get("/").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(location(&r).starts_with("/login"));
    let r = attacker.post_form("/fn/whoami", &[], None).await;
    let who: serde_json::Value = r.json().await.unwrap();
    assert_eq!(who["user"], json!(null));
    assert_eq!(who["csrf"], json!(""));
}

/// A visitor of the sign-in page stores nothing in Redis: the form's token is a cookie of
/// its own, and the form is refused without it (or with another browser's).
#[tokio::test]
async fn the_sign_in_page_stores_nothing_for_a_visitor() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "ann", Role::Viewer).await;
    let mut conn = redis.connection();
    let keys = |conn: &mut redis::Connection| -> u64 { redis::cmd("DBSIZE").query(conn).unwrap() };
    let before = keys(&mut conn);
    for _ in 0..200 {
        let mut v = Visitor::new(&app);
        assert_eq!(v.get("/login").await.status(), 200);
        assert!(v.cookie.is_none(), "no session for a visitor");
        assert!(v.login_cookie.is_some(), "the form's token cookie");
    }
    assert_eq!(
        keys(&mut conn),
        before,
        "200 visits of the sign-in page wrote to Redis"
    );

    // The form's token must be this browser's cookie.
    let mut v = Visitor::new(&app);
    v.get("/login").await;
    let csrf = v.csrf().await;
    assert_eq!(csrf.len(), 64);
    let mut other = Visitor::new(&app);
    other.get("/login").await;
    let origin = other.origin();
    let form = [
        ("username", "ann"),
        ("password", PASSWORD),
        ("csrf", csrf.as_str()),
        ("next", "/"),
    ];
    let r = other.post_form("/auth/login", &form, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let mut cookieless = Visitor::new(&app);
    let r = cookieless
        .post_form("/auth/login", &form, Some(&origin))
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = v.post_form("/auth/login", &form, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(location(&r), "/");
}

#[tokio::test]
async fn logout_ends_the_session_on_the_server() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "ann", Role::Viewer).await;
    let mut v = Visitor::signed_in(&app, "ann").await;
    let cookie = v.cookie.clone().unwrap();
    let csrf = v.csrf().await;
    let origin = v.origin();
    let r = v
        .post_form("/auth/logout", &[("csrf", &csrf)], Some(&origin))
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(location(&r), "/login");
    // Replaying the old cookie gets nowhere.
    let mut replay = Visitor::new(&app);
    replay.cookie = Some(cookie);
    assert_eq!(replay.get("/").await.status(), StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn sessions_end_after_the_idle_timeout() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_SESSION_IDLE_MS", "700")]).await;
    add_user(&store(&redis).await, "ann", Role::Viewer).await;
    let mut v = Visitor::signed_in(&app, "ann").await;
    // Used within the idle time, it lives on.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(v.get("/").await.status(), 200);
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(v.get("/").await.status(), StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn sessions_end_at_the_absolute_timeout_even_when_used() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_SESSION_ABSOLUTE_MS", "1200")]).await;
    add_user(&store(&redis).await, "ann", Role::Viewer).await;
    let mut v = Visitor::signed_in(&app, "ann").await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(900) {
        assert_eq!(v.get("/").await.status(), 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(v.get("/").await.status(), StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn unknown_user_and_wrong_password_look_the_same() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "ann", Role::Viewer).await;
    let mut times = (Vec::new(), Vec::new());
    let mut locations = Vec::new();
    for i in 0..3 {
        let mut v = Visitor::new(&app);
        let t = Instant::now();
        let r = v.login(&format!("nobody{i}"), "wrong password!").await;
        times.0.push(t.elapsed());
        locations.push(location(&r));
        let mut v = Visitor::new(&app);
        let t = Instant::now();
        let r = v.login("ann", "wrong password!").await;
        times.1.push(t.elapsed());
        locations.push(location(&r));
    }
    assert!(
        locations
            .iter()
            .all(|l| l == "/login?error=invalid&next=/people"),
        "{locations:?}"
    );
    times.0.sort();
    times.1.sort();
    let (unknown, wrong) = (times.0[1].as_secs_f64(), times.1[1].as_secs_f64());
    assert!(
        unknown / wrong > 0.5 && unknown / wrong < 2.0,
        "median unknown {unknown:.4}s vs wrong password {wrong:.4}s"
    );
}

#[tokio::test]
async fn five_failures_lock_the_login_even_with_the_right_password() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let s = store(&redis).await;
    add_user(&s, "ann", Role::Viewer).await;
    add_user(&s, "bob", Role::Viewer).await;
    // A success refunds: it never counts.
    for _ in 0..6 {
        let mut v = Visitor::new(&app);
        assert_eq!(location(&v.login("ann", PASSWORD).await), "/people");
    }
    for _ in 0..5 {
        let mut v = Visitor::new(&app);
        assert!(location(&v.login("ann", "wrong password!").await).contains("error=invalid"));
    }
    let mut v = Visitor::new(&app);
    let l = location(&v.login("ann", PASSWORD).await);
    assert!(l.contains("error=limited") && l.contains("retry="), "{l}");
    // Another user from the same address is not locked out.
    let mut v = Visitor::new(&app);
    assert_eq!(location(&v.login("bob", PASSWORD).await), "/people");
    let limited = s
        .read_audit(
            &AuditFilter {
                action: "login.limited".into(),
                ..Default::default()
            },
            10,
            None,
        )
        .await
        .unwrap();
    assert_eq!(limited.len(), 1);
}

/// Behind a trusted proxy the sign-in limits key on the client's address, not the proxy's:
/// 50 failures from one client do not lock out everyone else. Without the setting a client's
/// own `X-Forwarded-For` is not believed, so rotating it does not dodge the limit.
#[tokio::test]
async fn sign_in_limits_key_on_the_client_behind_a_trusted_proxy() {
    let redis = RedisServer::start();
    let s = store(&redis).await;
    add_user(&s, "ann", Role::Viewer).await;
    let behind_proxy = spawn_app_with(&redis, &[("SPILLWAY_TRUSTED_PROXIES", "127.0.0.0/8")]).await;
    for i in 0..51 {
        let mut v = Visitor::new(&behind_proxy);
        v.forwarded_for = Some("198.51.100.1".into());
        let l = location(&v.login(&format!("guess{i}"), "wrong password!").await);
        assert!(
            l.contains(if i < 50 {
                "error=invalid"
            } else {
                "error=limited"
            }),
            "{i}: {l}"
        );
    }
    let mut other_client = Visitor::new(&behind_proxy);
    other_client.forwarded_for = Some("6.6.6.6, 198.51.100.2".into());
    assert_eq!(
        location(&other_client.login("ann", PASSWORD).await),
        "/people"
    );
    // The audit log names the client, not the proxy.
    let failures = s
        .read_audit(
            &AuditFilter {
                action: "login.failure".into(),
                ..Default::default()
            },
            1,
            None,
        )
        .await
        .unwrap();
    assert_eq!(failures[0].ip, "198.51.100.1");

    let direct = spawn_app(&redis).await;
    for i in 0..6 {
        let mut v = Visitor::new(&direct);
        v.forwarded_for = Some(format!("203.0.113.{i}"));
        let l = location(&v.login("ann", "wrong password!").await);
        assert!(
            l.contains(if i < 5 {
                "error=invalid"
            } else {
                "error=limited"
            }),
            "{i}: {l}"
        );
    }
}

/// Guessing one's own current password is limited like signing in: after five wrong ones,
/// even the right one is refused for a while.
#[tokio::test]
async fn changing_a_password_limits_guesses_of_the_current_one() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "vic", Role::Viewer).await;
    let mut v = Visitor::signed_in(&app, "vic").await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    for _ in 0..5 {
        let form = [
            ("current", "not my password"),
            ("new_password", "a brand new long password"),
            ("csrf", csrf.as_str()),
        ];
        let r = v.post_form("/fn/my_password", &form, Some(&origin)).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    }
    let form = [
        ("current", PASSWORD),
        ("new_password", "a brand new long password"),
        ("csrf", csrf.as_str()),
    ];
    let r = v.post_form("/fn/my_password", &form, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.text().await.unwrap().contains("too many"));
    // The password did not change (and signing in from here is limited too: the same count).
    let vic = store(&redis)
        .await
        .get_user(&"vic".parse_user())
        .await
        .unwrap()
        .unwrap();
    assert!(spillway::service::password::verify(Some(vic.password_hash), PASSWORD.into()).await);
    let mut again = Visitor::new(&app);
    assert!(location(&again.login("vic", PASSWORD).await).contains("error=limited"));
}

/// A new API key is shown once, and Redis never holds it in the clear: the session keeps
/// it masked, the browser the mask.
#[tokio::test]
async fn a_new_key_is_shown_once_and_never_stored_in_the_clear() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "root", Role::Admin).await;
    let mut v = Visitor::signed_in(&app, "root").await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let r = v
        .post_form(
            "/fn/key_create",
            &[("name", "ci"), ("role", "service"), ("csrf", &csrf)],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), 200);
    let pad = r
        .headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|c| c.to_str().unwrap().split(';').next().unwrap().to_owned())
        .find(|c| c.starts_with("spillway_new_key="))
        .expect("the browser's half of the key");
    let people = |extra: Option<&str>| {
        let cookie = [
            v.cookie.clone().unwrap(),
            extra.unwrap_or_default().to_owned(),
        ]
        .join("; ");
        v.client
            .post(format!("{}/fn/people", v.base))
            .header(header::COOKIE, cookie)
            .send()
    };
    // Every value in Redis, read while the key waits to be shown.
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    let mut everything = String::new();
    for k in &keys {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(k).query(&mut conn).unwrap();
        everything.push_str(&String::from_utf8_lossy(&dump));
    }
    let shown: serde_json::Value = people(Some(&pad)).await.unwrap().json().await.unwrap();
    let key = shown["new_key"].as_str().expect("shown once").to_owned();
    assert!(key.starts_with("spw_svc_") && key.len() > 40, "{key}");
    assert!(
        !everything.contains(&key[8..]),
        "the new key sat in Redis in the clear"
    );
    let again: serde_json::Value = people(Some(&pad)).await.unwrap().json().await.unwrap();
    assert_eq!(again["new_key"], serde_json::Value::Null, "shown only once");
    // It is a working key (once the instance has reloaded its keys).
    eventually(
        "the new key working",
        PATIENCE,
        async || {
            reqwest::Client::new()
                .post(app.url("/api/v1/check"))
                .bearer_auth(&key)
                .json(&json!({"policy": "demo", "identifiers": {"user": "1"}}))
                .send()
                .await
                .unwrap()
                .status()
        },
        |status| *status == 200,
    )
    .await;
}

#[tokio::test]
async fn state_changes_need_the_token_and_this_origin() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let s = store(&redis).await;
    add_user(&s, "root", Role::Admin).await;
    let mut v = Visitor::signed_in(&app, "root").await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let form = |token: &'static str| {
        vec![
            ("csrf", token),
            ("username", "eve"),
            ("role", "viewer"),
            ("password", PASSWORD),
        ]
    };
    // No token.
    let r = v.post_form("/fn/user_add", &form(""), Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // The right token from another site.
    let token: &'static str = Box::leak(csrf.into_boxed_str());
    let r = v
        .post_form("/fn/user_add", &form(token), Some("https://evil.example"))
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(s.get_user(&"eve".parse_user()).await.unwrap().is_none());
    // The login form itself: no token, or another site.
    let mut anon = Visitor::new(&app);
    anon.get("/login").await;
    let r = anon
        .post_form(
            "/auth/login",
            &[("username", "root"), ("password", PASSWORD)],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Both right: it works.
    let r = v
        .post_form("/fn/user_add", &form(token), Some(&origin))
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert!(s.get_user(&"eve".parse_user()).await.unwrap().is_some());
}

trait ParseUser {
    fn parse_user(&self) -> spillway::domain::people::Username;
}
impl ParseUser for &str {
    fn parse_user(&self) -> spillway::domain::people::Username {
        spillway::domain::people::Username::parse(self).unwrap()
    }
}

#[tokio::test]
async fn a_revoked_key_fails_within_a_second_on_every_instance() {
    let redis = RedisServer::start();
    let a = spawn_app(&redis).await;
    let b = spawn_app(&redis).await;
    let s = store(&redis).await;
    let (record, secret) = Service::for_command(s.clone())
        .create_key(&test_actor(), "billing", KeyRole::Admin)
        .await
        .unwrap();
    let call = |app: &TestApp| {
        app.client
            .get(app.url("/api/v1/policies"))
            .bearer_auth(&secret)
            .send()
    };
    let on_both = async || {
        (
            call(&a).await.unwrap().status(),
            call(&b).await.unwrap().status(),
        )
    };
    // New keys are picked up within the poll interval too (the second this test promises).
    eventually(
        "the new key working on both instances",
        Duration::from_secs(1),
        on_both,
        |statuses| *statuses == (StatusCode::OK, StatusCode::OK),
    )
    .await;
    Service::for_command(s.clone())
        .revoke_key(&test_actor(), &record.id)
        .await
        .unwrap();
    eventually(
        "the revoked key refused on both instances",
        Duration::from_secs(1),
        on_both,
        |statuses| *statuses == (StatusCode::UNAUTHORIZED, StatusCode::UNAUTHORIZED),
    )
    .await;
    // Last-used time was recorded (written every 5 s).
    let keys = eventually(
        "the key's last use recorded",
        PATIENCE,
        async || s.list_api_keys().await.unwrap(),
        |keys| keys[0].last_used_ms.is_some(),
    )
    .await;
    assert!(keys[0].last_used_ms.is_some());
    assert!(keys[0].revoked_at_ms.is_some());
}

#[tokio::test]
async fn n_admin_actions_leave_n_audit_records_in_order() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let s = store(&redis).await;
    add_user(&s, "root", Role::Admin).await;
    let mut v = Visitor::signed_in(&app, "root").await;
    let before = s.audit_len().await.unwrap();
    let csrf = v.csrf().await;
    let origin = v.origin();
    let mut expected = Vec::new();
    for i in 0..4 {
        let name = format!("user{i}");
        let r = v
            .post_form(
                "/fn/user_add",
                &[
                    ("csrf", &csrf),
                    ("username", &name),
                    ("role", "viewer"),
                    ("password", PASSWORD),
                ],
                Some(&origin),
            )
            .await;
        assert_eq!(r.status(), 200);
        expected.push(("user.add".to_owned(), name.clone()));
        let r = v
            .post_form(
                "/fn/user_set_role",
                &[("csrf", &csrf), ("username", &name), ("role", "support")],
                Some(&origin),
            )
            .await;
        assert_eq!(r.status(), 200);
        expected.push(("user.set-role".to_owned(), name));
    }
    // An API reset and a policy change through the admin key are audited too.
    let r = app
        .client
        .delete(app.url("/api/v1/identifiers/user/42?reason=support+ticket+7"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    expected.push(("identifier.reset".to_owned(), "user=42".to_owned()));
    // A refused change leaves no record.
    let r = v
        .post_form(
            "/fn/user_add",
            &[
                ("csrf", &csrf),
                ("username", "user0"),
                ("role", "viewer"),
                ("password", PASSWORD),
            ],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    assert_eq!(s.audit_len().await.unwrap() - before, expected.len() as u64);
    let mut records = s
        .read_audit(&AuditFilter::default(), 100, None)
        .await
        .unwrap();
    records.truncate(expected.len());
    records.reverse();
    let got: Vec<(String, String)> = records
        .iter()
        .map(|r| (r.action.clone(), r.target.clone()))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(records[0].actor, "user:root");
    assert_eq!(records[0].role, "admin");
    assert_eq!(records[0].ip, "127.0.0.1");
    let reset = records.last().unwrap();
    assert_eq!(reset.actor, "key:env");
    assert_eq!(reset.reason, "support ticket 7");
    // Filters: by actor and by action.
    let by_key = s
        .read_audit(
            &AuditFilter {
                actor: "key:".into(),
                ..Default::default()
            },
            100,
            None,
        )
        .await
        .unwrap();
    assert_eq!(by_key.len(), 1);
}

#[tokio::test]
async fn pages_send_the_security_headers() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut v = Visitor::new(&app);
    let r = v.get("/login").await;
    let h = r.headers().clone();
    let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(csp.contains("script-src 'self' 'nonce-"), "{csp}");
    assert_eq!(h[header::CACHE_CONTROL], "no-store");
    assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
    let nonce = csp
        .split("'nonce-")
        .nth(1)
        .unwrap()
        .split('\'')
        .next()
        .unwrap();
    let html = r.text().await.unwrap();
    let scripts = html.matches("<script").count();
    assert!(scripts >= 2, "{html}");
    assert_eq!(
        html.matches(&format!("<script nonce=\"{nonce}\"")).count()
            + html
                .matches(&format!("<script type=\"module\" nonce=\"{nonce}\""))
                .count(),
        scripts,
        "every inline script carries the header's nonce: {html}"
    );
    // Secure cookies when a trusted proxy says https; anyone else saying so is not believed.
    let says_https = |app: &TestApp| {
        reqwest::Client::new()
            .get(app.url("/login"))
            .header("x-forwarded-proto", "https")
            .send()
    };
    let r = says_https(&app).await.unwrap();
    assert!(
        !r.headers()[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Secure")
    );
    let behind_proxy = spawn_app_with(&redis, &[("SPILLWAY_TRUSTED_PROXIES", "127.0.0.1")]).await;
    let r = says_https(&behind_proxy).await.unwrap();
    assert!(
        r.headers()[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Secure")
    );
}

/// The admin API accepts a signed-in dashboard session, as the dashboard does: what its
/// role may do, changes only with the session's CSRF token in `X-CSRF-Token` and from this
/// site; the audit log names the person.
#[tokio::test]
async fn the_admin_api_takes_a_session_with_its_csrf_token() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let s = store(&redis).await;
    add_user(&s, "root", Role::Admin).await;
    add_user(&s, "sam", Role::Support).await;
    let policy = json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000}]});
    let call = |v: &Visitor,
                method: reqwest::Method,
                path: &str,
                csrf: Option<&str>,
                origin: Option<&str>| {
        let mut req = app
            .client
            .request(method, app.url(path))
            .header(header::COOKIE, v.cookie.clone().unwrap())
            .json(&policy);
        if let Some(t) = csrf {
            req = req.header("x-csrf-token", t);
        }
        if let Some(o) = origin {
            req = req.header(header::ORIGIN, o);
        }
        req.send()
    };
    let mut root = Visitor::signed_in(&app, "root").await;
    let token = root.csrf().await;
    let origin = root.origin();
    let put = reqwest::Method::PUT;
    let path = "/api/v1/policies/from-browser";
    assert_eq!(
        call(&root, put.clone(), path, None, Some(&origin))
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(
        call(&root, put.clone(), path, Some("nope"), Some(&origin))
            .await
            .unwrap()
            .status(),
        403
    );
    let elsewhere = call(
        &root,
        put.clone(),
        path,
        Some(&token),
        Some("https://evil.example"),
    )
    .await
    .unwrap();
    assert_eq!(elsewhere.status(), 403);
    // The answer says what was missing (it once spoke of an API key nobody sent).
    let problem: serde_json::Value = elsewhere.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("X-CSRF-Token:")),
        "{problem}"
    );
    assert_eq!(
        call(&root, put.clone(), path, Some(&token), Some(&origin))
            .await
            .unwrap()
            .status(),
        201
    );
    let saved = s
        .read_audit(
            &AuditFilter {
                action: "policy.save".into(),
                ..Default::default()
            },
            1,
            None,
        )
        .await
        .unwrap();
    assert_eq!(saved[0].actor, "user:root");

    // Support may reset an identifier and manage overrides, not edit policies.
    let mut sam = Visitor::signed_in(&app, "sam").await;
    let token = sam.csrf().await;
    assert_eq!(
        call(&sam, put, path, Some(&token), Some(&origin))
            .await
            .unwrap()
            .status(),
        403
    );
    let reset = call(
        &sam,
        reqwest::Method::DELETE,
        "/api/v1/identifiers/user/1?reason=support",
        Some(&token),
        Some(&origin),
    );
    assert_eq!(reset.await.unwrap().status(), 200);
    // A session that ended is no caller at all.
    let csrf = root.csrf().await;
    let o = root.origin();
    root.post_form("/auth/logout", &[("csrf", &csrf)], Some(&o))
        .await;
    let gone = app
        .client
        .get(app.url("/api/v1/policies"))
        .header(
            header::COOKIE,
            "spillway_session=".to_owned() + &"0".repeat(64),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 401);
}

/// Who calls in the matrix.
#[derive(Clone, Copy, Debug)]
enum Who {
    Admin,
    Support,
    Viewer,
    ServiceKey,
    AdminKey,
    Anonymous,
}

#[tokio::test]
async fn every_role_gets_what_it_may_on_every_route() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let s = store(&redis).await;
    for (name, role) in [
        ("root", Role::Admin),
        ("sam", Role::Support),
        ("vic", Role::Viewer),
    ] {
        add_user(&s, name, role).await;
    }
    let mut sessions = Vec::new();
    for name in ["root", "sam", "vic"] {
        let mut v = Visitor::signed_in(&app, name).await;
        let csrf = v.csrf().await;
        sessions.push((v, csrf));
    }
    let policy = json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000}]});

    // (route, [admin, support, viewer, service key, admin key, anonymous])
    type Expect = [u16; 6];
    type Call<'a> = (&'a str, Vec<(&'a str, &'a str)>, Expect);
    let server_fns: Vec<Call> = vec![
        ("whoami", vec![], [200, 200, 200, 200, 200, 200]),
        ("redis_status", vec![], [200, 200, 200, 401, 401, 401]),
        ("people", vec![], [200, 403, 403, 401, 401, 401]),
        (
            "user_add",
            vec![
                ("username", "{who}-new"),
                ("role", "viewer"),
                ("password", PASSWORD),
            ],
            [200, 403, 403, 401, 401, 401],
        ),
        (
            "user_set_role",
            vec![("username", "admin-new"), ("role", "support")],
            [200, 403, 403, 401, 401, 401],
        ),
        (
            "key_create",
            vec![("name", "k"), ("role", "service")],
            [200, 403, 403, 401, 401, 401],
        ),
        (
            "key_revoke",
            vec![("id", "nope")],
            [400, 403, 403, 401, 401, 401],
        ),
        (
            "user_remove",
            vec![("username", "admin-new")],
            [200, 403, 403, 401, 401, 401],
        ),
        ("overview", vec![], [200, 200, 200, 401, 401, 401]),
        (
            "inspect",
            vec![("id", "user=1")],
            [200, 200, 200, 401, 401, 401],
        ),
        (
            "reset",
            vec![("id", "user=1"), ("scope", ""), ("reason", "matrix")],
            [200, 200, 403, 401, 401, 401],
        ),
        (
            "audit",
            vec![("action", "user")],
            [200, 200, 200, 401, 401, 401],
        ),
        ("policies", vec![], [200, 200, 200, 401, 401, 401]),
        (
            "policy",
            vec![("name", "demo")],
            [200, 200, 200, 401, 401, 401],
        ),
        (
            "policy_save",
            vec![
                ("name", "matrix2"),
                ("version", "0"),
                ("description", "from the matrix"),
                ("rules[0][name]", "r"),
                ("rules[0][algorithm]", "fixed_window"),
                ("rules[0][limit]", "5"),
                ("rules[0][window_ms]", "1000"),
            ],
            [200, 403, 403, 401, 401, 401],
        ),
        (
            "policy_what_if",
            vec![
                ("name", "matrix2"),
                (
                    "draft",
                    r#"{"description":"","shadow":false,"failure_closed":false,"rules":[{"name":"r","algorithm":"fixed_window","limit":"2","window_ms":"1000"}],"field":"","message":""}"#,
                ),
            ],
            [200, 403, 403, 401, 401, 401],
        ),
        (
            "override_add",
            vec![
                ("name", "matrix2"),
                ("matcher", "user=vip"),
                ("action", "unlimited"),
                ("expires_minutes", "5"),
            ],
            [200, 200, 403, 401, 401, 401],
        ),
        (
            "override_change",
            vec![
                ("name", "matrix2"),
                ("index", "0"),
                ("matcher", "user=vip"),
                ("change", "extend"),
                ("minutes", "5"),
            ],
            [200, 200, 403, 401, 401, 401],
        ),
        (
            "override_remove",
            vec![("name", "matrix2"), ("index", "0")],
            [200, 200, 403, 401, 401, 401],
        ),
        // A second version to roll back from (overrides are not versions).
        (
            "policy_save",
            vec![
                ("name", "matrix2"),
                ("version", "1"),
                ("description", "again"),
                ("rules[0][name]", "r"),
                ("rules[0][algorithm]", "fixed_window"),
                ("rules[0][limit]", "6"),
                ("rules[0][window_ms]", "1000"),
            ],
            [200, 403, 403, 401, 401, 401],
        ),
        (
            "policy_rollback",
            vec![("name", "matrix2"), ("to_version", "1")],
            [200, 403, 403, 401, 401, 401],
        ),
        (
            "policy_delete",
            vec![("name", "matrix2"), ("confirm", "matrix2")],
            [200, 403, 403, 401, 401, 401],
        ),
    ];
    let who_all = [
        Who::Admin,
        Who::Support,
        Who::Viewer,
        Who::ServiceKey,
        Who::AdminKey,
        Who::Anonymous,
    ];
    let mut failures = Vec::new();
    for (endpoint, args, expect) in &server_fns {
        for (i, who) in who_all.iter().enumerate() {
            let tag = format!("{who:?}").to_lowercase();
            let mut form: Vec<(String, String)> = args
                .iter()
                .map(|(k, v)| (k.to_string(), v.replace("{who}", &tag)))
                .collect();
            let status = match who {
                Who::Admin | Who::Support | Who::Viewer => {
                    let (v, csrf) = &mut sessions[i];
                    form.push(("csrf".into(), csrf.clone()));
                    let pairs: Vec<(&str, &str)> =
                        form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    let origin = v.origin();
                    v.post_form(&format!("/fn/{endpoint}"), &pairs, Some(&origin))
                        .await
                        .status()
                }
                Who::ServiceKey | Who::AdminKey | Who::Anonymous => {
                    let mut req = app
                        .client
                        .post(app.url(&format!("/fn/{endpoint}")))
                        .form(&form);
                    match who {
                        Who::ServiceKey => req = req.bearer_auth(SERVICE_KEY),
                        Who::AdminKey => req = req.bearer_auth(ADMIN_KEY),
                        _ => {}
                    }
                    req.send().await.unwrap().status()
                }
            };
            if status.as_u16() != expect[i] {
                failures.push(format!(
                    "{endpoint} as {who:?}: {status}, expected {}",
                    expect[i]
                ));
            }
        }
    }

    // Admin JSON API: API keys only (sessions are for the dashboard).
    // The admin API takes a signed-in session too: every role may read; changes need the
    // session's CSRF token (none is sent here, so they are refused; see
    // the_admin_api_takes_a_session_with_its_csrf_token).
    let api: Vec<(reqwest::Method, String, Option<serde_json::Value>, Expect)> = vec![
        (
            reqwest::Method::GET,
            "/api/v1/policies".into(),
            None,
            [200, 200, 200, 403, 200, 401],
        ),
        (
            reqwest::Method::PUT,
            "/api/v1/policies/matrix".into(),
            Some(policy.clone()),
            [403, 403, 403, 403, 201, 401],
        ),
        (
            reqwest::Method::GET,
            "/api/v1/policies/matrix".into(),
            None,
            [200, 200, 200, 403, 200, 401],
        ),
        (
            reqwest::Method::GET,
            "/api/v1/policies/matrix/versions".into(),
            None,
            [200, 200, 200, 403, 200, 401],
        ),
        (
            reqwest::Method::GET,
            "/api/v1/policies/matrix/overrides".into(),
            None,
            [200, 200, 200, 403, 200, 401],
        ),
        (
            reqwest::Method::POST,
            "/api/v1/policies/matrix/overrides".into(),
            Some(json!({"match": "user=vip", "action": "unlimited"})),
            [403, 403, 403, 403, 201, 401],
        ),
        (
            reqwest::Method::GET,
            "/api/v1/identifiers/user/1".into(),
            None,
            [200, 200, 200, 403, 200, 401],
        ),
        (
            reqwest::Method::DELETE,
            "/api/v1/identifiers/user/1?reason=matrix".into(),
            None,
            [403, 403, 403, 403, 200, 401],
        ),
        (
            reqwest::Method::DELETE,
            "/api/v1/policies/matrix".into(),
            None,
            [403, 403, 403, 403, 204, 401],
        ),
        (
            reqwest::Method::POST,
            "/api/v1/check".into(),
            Some(json!({"policy": "demo", "identifiers": {"user": "1"}})),
            [401, 401, 401, 200, 200, 401],
        ),
    ];
    for (method, path, body, expect) in &api {
        for (i, who) in who_all.iter().enumerate() {
            let mut req = app.client.request(method.clone(), app.url(path));
            if let Some(b) = body {
                req = req.json(b);
            }
            match who {
                Who::Admin | Who::Support | Who::Viewer => {
                    let (v, _) = &sessions[i];
                    req = req.header(header::COOKIE, v.cookie.clone().unwrap());
                }
                Who::ServiceKey => req = req.bearer_auth(SERVICE_KEY),
                Who::AdminKey => req = req.bearer_auth(ADMIN_KEY),
                Who::Anonymous => {}
            }
            let status = req.send().await.unwrap().status();
            if status.as_u16() != expect[i] {
                failures.push(format!(
                    "{method} {path} as {who:?}: {status}, expected {}",
                    expect[i]
                ));
            }
        }
    }

    // Pages: anonymous visitors are sent to sign in; everyone signed in may look, but only
    // admins see users and keys.
    for (path, expect) in [
        ("/", [200, 200, 200, 303, 303, 303]),
        ("/identifiers", [200, 200, 200, 303, 303, 303]),
        ("/policies", [200, 200, 200, 303, 303, 303]),
        ("/audit", [200, 200, 200, 303, 303, 303]),
        ("/people", [200, 403, 403, 303, 303, 303]),
        ("/policy?name=demo", [200, 200, 200, 303, 303, 303]),
        ("/identifiers?id=user%3D1", [200, 200, 200, 303, 303, 303]),
        // A live stream is refused, not sent to the sign-in page.
        ("/events/overview", [200, 200, 200, 401, 401, 401]),
        (
            "/events/identifier?id=user%3D1",
            [200, 200, 200, 401, 401, 401],
        ),
        ("/account", [200, 200, 200, 303, 303, 303]),
        // Signed in: sent on (to `/`); anyone else gets the form.
        ("/login", [303, 303, 303, 200, 200, 200]),
    ] {
        for (i, who) in who_all.iter().enumerate() {
            let status = match who {
                Who::Admin | Who::Support | Who::Viewer => sessions[i].0.get(path).await.status(),
                _ => {
                    let mut v = Visitor::new(&app);
                    let mut req = v.client.get(format!("{}{path}", v.base));
                    match who {
                        Who::ServiceKey => req = req.bearer_auth(SERVICE_KEY),
                        Who::AdminKey => req = req.bearer_auth(ADMIN_KEY),
                        _ => {}
                    }
                    let r = req.send().await.unwrap();
                    v.keep_cookie(&r);
                    r.status()
                }
            };
            if status.as_u16() != expect[i] {
                failures.push(format!(
                    "GET {path} as {who:?}: {status}, expected {}",
                    expect[i]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A server function checks who calls before what they sent: someone not signed in gets the
/// role check's 401 whatever the arguments (a missing or malformed one answered 500 before
/// it), and arguments that do not decode are a 400 for a signed-in caller.
#[tokio::test]
async fn server_functions_check_the_caller_first_and_answer_400_for_bad_arguments() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut anonymous = Visitor::new(&app);
    let origin = anonymous.origin();
    for (path, form) in [
        ("/fn/history", vec![("all", "maybe")]),
        ("/fn/policy_save", vec![]),
        ("/fn/reset", vec![("id", "bob")]),
    ] {
        let r = anonymous.post_form(path, &form, Some(&origin)).await;
        assert_eq!(r.status(), 401, "{path}");
        assert_eq!(r.text().await.unwrap(), r#"{"Refused":"sign in first"}"#);
    }
    add_user(&store(&redis).await, "vic", Role::Viewer).await;
    let mut viewer = Visitor::signed_in(&app, "vic").await;
    let r = viewer
        .post_form("/fn/history", &[("all", "maybe")], Some(&origin))
        .await;
    assert_eq!(r.status(), 400, "{:?}", r.text().await);
    // A role that may not: refused before its (missing) arguments are read.
    let r = viewer
        .post_form("/fn/policy_save", &[], Some(&origin))
        .await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.text().await.unwrap(),
        r#"{"Refused":"the viewer role may not do this"}"#
    );
}

/// The table the session middleware refuses server functions by holds what each function's
/// own role check asks: every `#[server(prefix = "/fn", endpoint = …)]` in `src/app` with a
/// `require(Action::…)` is listed with that action (read from the code).
#[test]
fn the_server_function_role_table_matches_the_functions() {
    use spillway::auth::server_fns::SERVER_FN_ACTIONS;
    let mut found = Vec::new();
    let mut stack = vec![std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/app"
    ))];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let marker = "#[server(prefix = \"/fn\", endpoint = \"";
            let parts: Vec<&str> = text.split(marker).skip(1).collect();
            for part in parts {
                let endpoint = &part[..part.find('"').unwrap()];
                let body = &part[..part.find(marker).unwrap_or(part.len()).min(4000)];
                let action = body.find("Action::").map(|at| {
                    let rest = &body[at + "Action::".len()..];
                    rest[..rest.find(|c: char| !c.is_alphanumeric()).unwrap()].to_owned()
                });
                if let Some(action) = action
                    && body.contains("require")
                {
                    found.push((format!("/fn/{endpoint}"), action));
                }
            }
        }
    }
    found.sort();
    let mut table: Vec<(String, String)> = SERVER_FN_ACTIONS
        .iter()
        .map(|(p, a)| ((*p).to_owned(), format!("{a:?}")))
        .collect();
    table.sort();
    assert!(found.len() >= 30, "{found:?}");
    assert_eq!(table, found);
}

/// A visitor signed in as `ada`, an admin (added to `redis` first).
pub(crate) async fn admin(app: &TestApp, redis: &RedisServer) -> Visitor {
    add_user(&store(redis).await, "ada", Role::Admin).await;
    Visitor::signed_in(app, "ada").await
}

#[tokio::test]
async fn a_signed_in_visitor_to_the_sign_in_page_is_sent_on() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let v = admin(&app, &redis).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for (path, to) in [
        ("/login", "/"),
        ("/login?next=%2Fpolicies", "/policies"),
        ("/login?next=https%3A%2F%2Fevil.example", "/"),
    ] {
        let r = client
            .get(app.url(path))
            .header(header::COOKIE, v.cookie_header().unwrap())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_redirection(), "{path}: {}", r.status());
        assert_eq!(r.headers()[header::LOCATION], to, "{path}");
    }
}

/// After signing in, `next` goes only to a path of this site: a tab or a newline that the
/// browser would drop, or that cannot be a header, goes to `/` (it answered 500 after the
/// session was made).
#[tokio::test]
async fn sign_in_redirects_only_to_a_path_of_this_site() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "ann", Role::Viewer).await;
    for (next, to) in [
        ("/people", "/people"),
        ("/\t/evil.example/x", "/"),
        ("/\r\nSet-Cookie: x=1", "/"),
        ("/\u{b}/evil.example", "/"),
        ("/\u{c}/evil.example", "/"),
        ("//evil.example", "/"),
        ("/\\evil.example", "/"),
        ("https://evil.example/", "/"),
    ] {
        let mut v = Visitor::new(&app);
        v.get("/login").await;
        let csrf = v.csrf().await;
        let origin = v.origin();
        let form = [
            ("username", "ann"),
            ("password", PASSWORD),
            ("csrf", csrf.as_str()),
            ("next", next),
        ];
        let r = v.post_form("/auth/login", &form, Some(&origin)).await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{next:?}");
        assert_eq!(r.headers()[header::LOCATION], to, "{next:?}");
    }
}

/// With SPILLWAY_SECURE_COOKIES the cookies stay Secure even when a trusted proxy says the
/// last hop was plain http (TLS ended further out).
#[tokio::test]
async fn secure_cookies_stay_secure_behind_a_proxy_that_says_http() {
    let redis = RedisServer::start();
    let app = spawn_app_with(
        &redis,
        &[
            ("SPILLWAY_SECURE_COOKIES", "1"),
            ("SPILLWAY_TRUSTED_PROXIES", "127.0.0.1"),
        ],
    )
    .await;
    let r = reqwest::Client::new()
        .get(app.url("/login"))
        .header("x-forwarded-proto", "http")
        .send()
        .await
        .unwrap();
    let cookie = r.headers()[header::SET_COOKIE].to_str().unwrap();
    assert!(cookie.contains("Secure"), "{cookie}");
}

/// Support could add `user=*` unlimited (or `ip=0.0.0.0/0`, or `ip=*.*`, or two /1
/// blocks), which turns a policy off for everyone. Now a loosening override of a wildcard or
/// of a network wider than a v4 /16 or a v6 /48 is an admin's; support lifts named users
/// and networks, and may block any pattern.
#[tokio::test]
async fn catch_all_unlimited_overrides_are_an_admins() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "guarded",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 60000}]}),
    )
    .await;
    add_user(&store(&redis).await, "sue", Role::Support).await;
    let mut support = Visitor::signed_in(&app, "sue").await;
    let csrf = support.csrf().await;
    let origin = support.origin();
    let add = |m: &'static str, action: &'static str| json!({"match": m, "action": action, "reason": "test"});
    for (doc, expected) in [
        (add("user=*", "unlimited"), 403),
        (add("ip=0.0.0.0/0", "unlimited"), 403),
        (add("ip=::/0", "unlimited"), 403),
        (add("user=**", "unlimited"), 403),
        // Ways around the first rule: wildcards that still match
        // everything, and blocks that cover every address together.
        (add("ip=*.*", "unlimited"), 403),
        (add("ip=*:*", "unlimited"), 403),
        (add("envoy=*=*", "unlimited"), 403),
        (add("user=0*", "unlimited"), 403),
        (add("ip=0.0.0.0/1", "unlimited"), 403),
        (add("ip=2001:db8::/32", "unlimited"), 403),
        // IPv4 clients written as IPv6: as wide as the IPv4 they hold.
        (add("ip=::ffff:0:0/96", "unlimited"), 403),
        (add("ip=64:ff9b::/96", "unlimited"), 403),
        (add("ip=::ffff:203.0.113.0/120", "unlimited"), 201),
        (add("user=bob", "unlimited"), 201),
        (add("ip=203.0.113.0/24", "unlimited"), 201),
        (add("ip=2001:db8:1::/48", "unlimited"), 201),
        (add("user=*", "block"), 201),
    ] {
        let r = reqwest::Client::new()
            .post(app.url("/api/v1/policies/guarded/overrides"))
            .header(header::COOKIE, support.cookie_header().unwrap())
            .header("x-csrf-token", &csrf)
            .header(header::ORIGIN, &origin)
            .json(&doc)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert_eq!(status, expected, "{doc}: {body}");
        if expected == 403 {
            assert!(body.contains("only an admin"), "{body}");
        }
    }
    let r = app
        .as_admin(
            Method::POST,
            "/api/v1/policies/guarded/overrides",
            Some(&add("ip=0.0.0.0/0", "unlimited")),
        )
        .await;
    assert_eq!(r.status(), 201);
}

/// Guesses at one account spread over addresses were never limited, and an IPv6
/// client had a fresh budget at every address of its /64.
#[tokio::test]
async fn sign_in_budgets_hold_per_account_and_per_ipv6_network() {
    let redis = RedisServer::start();
    add_user(&store(&redis).await, "ann", Role::Viewer).await;
    let app = spawn_app_with(&redis, &[("SPILLWAY_TRUSTED_PROXIES", "127.0.0.0/8")]).await;
    let location = |r: &reqwest::Response| {
        r.headers()
            .get(header::LOCATION)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    // Six addresses of one /64: the pair budget (5) holds across them.
    for i in 0..6 {
        let mut v = Visitor::new(&app);
        v.forwarded_for = Some(format!("2001:db8:7:7::{:x}", i + 1));
        let l = location(&v.login("ann", "wrong password!").await);
        let expected = if i < 5 {
            "error=invalid"
        } else {
            "error=limited"
        };
        assert!(l.contains(expected), "{i}: {l}");
    }
    // Twenty guesses at one account from twenty addresses, then the 21st is limited even
    // from a new address, and so is the right password.
    add_user(&store(&redis).await, "bo", Role::Viewer).await;
    for i in 0..21 {
        let mut v = Visitor::new(&app);
        v.forwarded_for = Some(format!("198.51.100.{}", i + 1));
        let l = location(&v.login("bo", "wrong password!").await);
        let expected = if i < 20 {
            "error=invalid"
        } else {
            "error=limited"
        };
        assert!(l.contains(expected), "{i}: {l}");
    }
    let mut fresh = Visitor::new(&app);
    fresh.forwarded_for = Some("203.0.113.99".into());
    assert!(location(&fresh.login("bo", PASSWORD).await).contains("error=limited"));
    // Support may not reset sign-in limits (it could then guess an admin's password
    // without end); an admin lifts the lock-out by resetting the account's identifier.
    add_user(&store(&redis).await, "sam", Role::Support).await;
    let mut support = Visitor::new(&app);
    support.forwarded_for = Some("203.0.113.200".into());
    assert_eq!(location(&support.login("sam", PASSWORD).await), "/people");
    let csrf = support.csrf().await;
    let refused = reqwest::Client::new()
        .delete(app.url("/api/v1/identifiers/login-user/bo"))
        .header(header::COOKIE, support.cookie_header().unwrap())
        .header("x-csrf-token", &csrf)
        .header(header::ORIGIN, support.origin())
        .header("x-forwarded-for", "203.0.113.200")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    let reset = app
        .as_admin(Method::DELETE, "/api/v1/identifiers/login-user/bo", None)
        .await;
    assert_eq!(reset.status(), 200);
    let done: Value = reset.json().await.unwrap();
    assert!(done["deleted_keys"].as_u64().unwrap() >= 1, "{done}");
    let mut again = Visitor::new(&app);
    again.forwarded_for = Some("203.0.113.100".into());
    assert_eq!(location(&again.login("bo", PASSWORD).await), "/people");
    // Another account from those addresses is not held back.
    let mut other = Visitor::new(&app);
    other.forwarded_for = Some("198.51.100.1".into());
    assert_eq!(location(&other.login("ann", PASSWORD).await), "/people");
}

/// A session read that times out sent a signed-in user to /login. Now it is read again,
/// and if Redis still does not answer the page says so with a 503; the user stays signed
/// in.
#[tokio::test]
async fn a_session_that_cannot_be_read_is_not_a_sign_out() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_REDIS_TIMEOUT_MS", "100")]).await;
    add_user(&store(&redis).await, "ida", Role::Viewer).await;
    let mut v = Visitor::signed_in(&app, "ida").await;
    redis.pause(1500);
    let r = v.get("/audit").await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().get(header::LOCATION).is_none());
    assert!(r.text().await.unwrap().contains("still signed in"));
    // Once Redis answers again (each look meanwhile says the same: 503, still signed in),
    // the page is served.
    let status = eventually(
        "the page once the pause is over",
        PATIENCE,
        async || v.get("/audit").await.status(),
        |status| *status != StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    assert_eq!(status, 200);
}

/// The audit API's bounds: the first id there can be pages to nothing, a year past 9999
/// is named.
#[tokio::test]
async fn the_audit_apis_bounds_are_answered_or_named() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let r = app
        .as_admin(reqwest::Method::GET, "/api/v1/audit?before=0-0", None)
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["entries"],
        json!([])
    );
    let r = app
        .as_admin(
            reqwest::Method::GET,
            "/api/v1/audit?since=1000000000000000-01-01",
            None,
        )
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["field"],
        "since"
    );
}
