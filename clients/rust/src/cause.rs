//! What a failed call says about itself: the URL called and the whole chain of causes, not
//! reqwest's top line alone (`error sending request for url (…)` hides whether the
//! connection was refused, reset, or timed out).

use std::error::Error as _;
use std::time::Duration;

/// `timed out after 100 ms calling http://…/api/v1/check`, or every cause of the error
/// (`client error (Connect): tcp connect error: Connection refused (os error 111)`) and the
/// URL called.
pub(crate) fn describe(e: &reqwest::Error, url: &str, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("timed out after {} calling {url}", millis(timeout));
    }
    format!("{} calling {url}", chain(e))
}

/// The error's causes, outermost first, each said once.
pub(crate) fn chain(e: &reqwest::Error) -> String {
    let mut causes: Vec<String> = Vec::new();
    // reqwest's own line names the URL (said by `describe`) for a request that was not sent;
    // any other (a body that could not be read or decoded) says what failed.
    if !(e.is_request() || e.is_connect()) || e.source().is_none() {
        causes.push(own_line(e));
    }
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        // Each layer may repeat the one below it.
        if !causes.iter().any(|c| c.contains(&text)) {
            causes.push(text);
        }
        source = cause.source();
    }
    causes.join(": ")
}

/// `100 ms`, or `1.5 s` from a second on.
pub(crate) fn millis(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// reqwest's line without its ` for url (…)`, which `describe` gives once at its end.
fn own_line(e: &reqwest::Error) -> String {
    let text = e.to_string();
    match text.find(" for url (") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}
