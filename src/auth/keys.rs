//! Reading a service key from a request: the one way every door (the JSON API, forward-auth,
//! Envoy's gRPC and `/json`) finds its caller. The keys themselves, and which are valid, are
//! the service's (`service::keys`).

use crate::service::keys::{ApiKeys, KeyCaller};

/// The header a key may come in instead of `Authorization` (what proxies and Envoy's
/// `initial_metadata` can send).
pub const KEY_HEADER: &str = "x-spillway-key";

/// The key of an `Authorization: Bearer <key>` header value. The scheme is case-insensitive
/// (RFC 9110 §11.1): `bearer`, `BEARER` too.
fn bearer(header: &str) -> Option<&str> {
    let (scheme, key) = header.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

/// The caller a request's headers name: `authorization: Bearer <key>` (any case of the
/// scheme), or else `x-spillway-key: <key>`; `None` when neither holds a valid key.
pub fn caller_of_headers(keys: &ApiKeys, headers: &http::HeaderMap) -> Option<KeyCaller> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    text("authorization")
        .and_then(bearer)
        .and_then(|key| keys.caller_of(key))
        .or_else(|| keys.caller_of(text(KEY_HEADER)?.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::keys::KeyRole;

    #[test]
    fn a_key_comes_as_a_bearer_token_or_in_its_own_header() {
        let keys = ApiKeys::new(["svc"], ["adm"]);
        let role = |authorization: Option<&str>, own: Option<&str>| {
            let mut headers = http::HeaderMap::new();
            if let Some(v) = authorization {
                headers.insert("authorization", v.parse().unwrap());
            }
            if let Some(v) = own {
                headers.insert(KEY_HEADER, v.parse().unwrap());
            }
            caller_of_headers(&keys, &headers).map(|c| c.role)
        };
        assert_eq!(role(Some("Bearer svc"), None), Some(KeyRole::Service));
        assert_eq!(role(Some("Bearer adm"), None), Some(KeyRole::Admin));
        assert_eq!(role(Some("Bearer nope"), None), None);
        assert_eq!(role(Some("bearer svc"), None), Some(KeyRole::Service));
        assert_eq!(role(Some("BEARER  adm"), None), Some(KeyRole::Admin));
        assert_eq!(role(Some("Basic svc"), None), None);
        assert_eq!(role(Some("Bearersvc"), None), None);
        assert_eq!(role(Some("svc"), None), None);
        assert_eq!(role(None, None), None);
        assert_eq!(role(None, Some(" svc ")), Some(KeyRole::Service));
        assert_eq!(role(Some("Bearer nope"), Some("adm")), Some(KeyRole::Admin));
    }
}
