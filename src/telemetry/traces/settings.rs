//! The traces' settings, read from the standard `OTEL_*` variables. A value that cannot be
//! used is an error naming its variable, never quietly replaced by a default.

use std::{borrow::Cow, time::Duration};

use opentelemetry_sdk::trace::Sampler;

/// Where and how spans are sent, as the `OTEL_*` variables say.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceSettings {
    /// The OTLP/HTTP traces URL (`…/v1/traces`).
    pub endpoint: String,
    /// Extra request headers (`OTEL_EXPORTER_OTLP_HEADERS`, `k=v,k2=v2`, URL-encoded).
    pub headers: Vec<(String, String)>,
    /// How long one export may take (`OTEL_EXPORTER_OTLP_TIMEOUT`, ms; default 10 s).
    pub timeout: Duration,
    pub sampler: SamplerSetting,
    /// `OTEL_SERVICE_NAME`, or `spillway`.
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`, as key and value.
    pub resource_attributes: Vec<(String, String)>,
}

/// `OTEL_TRACES_SAMPLER` with its argument (default `parentbased_always_on`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SamplerSetting {
    AlwaysOn,
    AlwaysOff,
    Ratio(f64),
    ParentBasedAlwaysOn,
    ParentBasedAlwaysOff,
    ParentBasedRatio(f64),
}

impl SamplerSetting {
    pub(super) fn sampler(self) -> Sampler {
        match self {
            Self::AlwaysOn => Sampler::AlwaysOn,
            Self::AlwaysOff => Sampler::AlwaysOff,
            Self::Ratio(r) => Sampler::TraceIdRatioBased(r),
            Self::ParentBasedAlwaysOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
            Self::ParentBasedAlwaysOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
            Self::ParentBasedRatio(r) => {
                Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(r)))
            }
        }
    }
}

/// A setting that cannot be used: the variable and what is wrong with it.
pub type Invalid = (&'static str, String);

impl TraceSettings {
    /// The settings `lookup` gives, `None` when traces are off. A value that cannot be
    /// used is an error naming its variable, never quietly replaced by a default.
    pub fn from_lookup(lookup: &impl Fn(&str) -> Option<String>) -> Result<Option<Self>, Invalid> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        if disabled(&get)? {
            return Ok(None);
        }
        let exporter = get("OTEL_TRACES_EXPORTER");
        match exporter.as_deref() {
            None | Some("otlp" | "none") => {}
            Some(other) => {
                return Err((
                    "OTEL_TRACES_EXPORTER",
                    format!("must be otlp or none, got {other:?}"),
                ));
            }
        }
        refuse_other_protocols(&get)?;
        let Some(endpoint) = endpoint(&get, exporter.as_deref() == Some("otlp"))? else {
            return Ok(None);
        };
        if exporter.as_deref() == Some("none") {
            return Ok(None);
        }
        // The signal's own variable first, then the general one.
        let headers = match get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") {
            Some(raw) => headers("OTEL_EXPORTER_OTLP_TRACES_HEADERS", &raw)?,
            None => match get("OTEL_EXPORTER_OTLP_HEADERS") {
                Some(raw) => headers("OTEL_EXPORTER_OTLP_HEADERS", &raw)?,
                None => Vec::new(),
            },
        };
        let timeout = match (
            get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"),
            get("OTEL_EXPORTER_OTLP_TIMEOUT"),
        ) {
            (Some(ms), _) => millis("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", &ms)?,
            (None, Some(ms)) => millis("OTEL_EXPORTER_OTLP_TIMEOUT", &ms)?,
            (None, None) => Duration::from_secs(10),
        };
        let sampler = sampler(&get)?;
        // OTEL_SERVICE_NAME over a service.name among the attributes, as the spec orders.
        let mut resource_attributes = resource_attributes(&get)?;
        let named = resource_attributes
            .iter()
            .position(|(k, _)| k == "service.name")
            .map(|i| resource_attributes.remove(i).1);
        let service_name = get("OTEL_SERVICE_NAME")
            .or(named)
            .unwrap_or_else(|| "spillway".into());
        Ok(Some(Self {
            endpoint,
            headers,
            timeout,
            sampler,
            service_name,
            resource_attributes,
        }))
    }
}

/// `OTEL_RESOURCE_ATTRIBUTES`: `key=value` pairs, comma-separated, values percent-decoded.
fn resource_attributes(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, Invalid> {
    let Some(raw) = get("OTEL_RESOURCE_ATTRIBUTES").filter(|r| !r.trim().is_empty()) else {
        return Ok(Vec::new());
    };
    raw.split(',')
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .filter(|(k, _)| !k.trim().is_empty())
                .ok_or_else(|| {
                    (
                        "OTEL_RESOURCE_ATTRIBUTES",
                        format!("expected key=value pairs separated by commas, got {pair:?}"),
                    )
                })?;
            let value = percent_encoding::percent_decode_str(value.trim()).decode_utf8_lossy();
            Ok((key.trim().to_owned(), value.into_owned()))
        })
        .collect()
}

/// `OTEL_SDK_DISABLED`: true switches traces off whatever else is set.
fn disabled(get: &impl Fn(&str) -> Option<String>) -> Result<bool, Invalid> {
    match get("OTEL_SDK_DISABLED").as_deref() {
        None | Some("false" | "FALSE" | "False") => Ok(false),
        Some("true" | "TRUE" | "True") => Ok(true),
        Some(other) => Err((
            "OTEL_SDK_DISABLED",
            format!("must be true or false, got {other:?}"),
        )),
    }
}

/// Spillway sends OTLP over HTTP as protobuf only; another protocol is refused by name.
fn refuse_other_protocols(get: &impl Fn(&str) -> Option<String>) -> Result<(), Invalid> {
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(other) = get(name).filter(|p| p != "http/protobuf") {
            return Err((
                name,
                format!(
                    "{other:?} is not supported: Spillway sends OTLP over HTTP as \
                     protobuf (http/protobuf, a collector's port 4318)"
                ),
            ));
        }
    }
    Ok(())
}

/// The traces URL: the signal's own is used as it is, the general one gets the signal's
/// path; with neither, the default collector when the exporter is named, else none.
fn endpoint(
    get: &impl Fn(&str) -> Option<String>,
    exporter_named: bool,
) -> Result<Option<String>, Invalid> {
    let own = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .map(|url| http_url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url))
        .transpose()?;
    let general = get("OTEL_EXPORTER_OTLP_ENDPOINT")
        .map(|url| http_url("OTEL_EXPORTER_OTLP_ENDPOINT", &url))
        .transpose()?;
    Ok(match (own, general) {
        (Some(url), _) => Some(url),
        (None, Some(base)) => Some(format!("{}/v1/traces", base.trim_end_matches('/'))),
        (None, None) if exporter_named => Some("http://localhost:4318/v1/traces".to_owned()),
        (None, None) => None,
    })
}

/// `OTEL_TRACES_SAMPLER` and, for the ratio samplers, `OTEL_TRACES_SAMPLER_ARG`.
fn sampler(get: &impl Fn(&str) -> Option<String>) -> Result<SamplerSetting, Invalid> {
    let ratio = || -> Result<f64, Invalid> {
        match get("OTEL_TRACES_SAMPLER_ARG") {
            None => Ok(1.0),
            Some(raw) => raw
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| {
                    (
                        "OTEL_TRACES_SAMPLER_ARG",
                        format!("must be a fraction from 0 to 1 (0.01 samples 1%), got {raw:?}"),
                    )
                }),
        }
    };
    Ok(match get("OTEL_TRACES_SAMPLER").as_deref() {
        None | Some("parentbased_always_on") => SamplerSetting::ParentBasedAlwaysOn,
        Some("always_on") => SamplerSetting::AlwaysOn,
        Some("always_off") => SamplerSetting::AlwaysOff,
        Some("traceidratio") => SamplerSetting::Ratio(ratio()?),
        Some("parentbased_always_off") => SamplerSetting::ParentBasedAlwaysOff,
        Some("parentbased_traceidratio") => SamplerSetting::ParentBasedRatio(ratio()?),
        Some(other) => {
            return Err((
                "OTEL_TRACES_SAMPLER",
                format!(
                    "{other:?} is not one of always_on, always_off, traceidratio, \
                     parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
                ),
            ));
        }
    })
}

/// An OTLP endpoint. Not echoed back when it is wrong: it may carry credentials.
fn http_url(name: &'static str, raw: &str) -> Result<String, Invalid> {
    match url::Url::parse(raw) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
            Ok(raw.to_owned())
        }
        _ => Err((
            name,
            "must be an http:// or https:// URL with a host (http://collector:4318)".into(),
        )),
    }
}

fn millis(name: &'static str, raw: &str) -> Result<Duration, Invalid> {
    raw.parse::<u64>()
        .ok()
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| {
            (
                name,
                format!("must be a number of milliseconds, got {raw:?}"),
            )
        })
}

/// `k=v,k2=v2`, each part URL-encoded, as the OTLP exporter specification writes headers.
/// The values are secrets (API keys): an error names an entry by its place or its key only.
fn headers(name: &'static str, raw: &str) -> Result<Vec<(String, String)>, Invalid> {
    raw.split(',')
        .filter(|p| !p.trim().is_empty())
        .enumerate()
        .map(|(n, pair)| {
            let entry = n + 1;
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| (name, format!("entry {entry} is not key=value")))?;
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s.trim())
                    .decode_utf8()
                    .map(Cow::into_owned)
                    .map_err(|_| (name, format!("entry {entry} is not UTF-8 once decoded")))
            };
            let (k, v) = (decode(k)?, decode(v)?);
            http::HeaderName::try_from(k.as_str())
                .map_err(|_| (name, format!("entry {entry}'s key is not a header name")))?;
            http::HeaderValue::try_from(v.as_str())
                .map_err(|_| (name, format!("the value of {k} is not a header value")))?;
            Ok((k, v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<TraceSettings>, Invalid> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        TraceSettings::from_lookup(&|name: &str| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn traces_are_off_unless_an_endpoint_or_the_exporter_is_set() {
        assert_eq!(settings(&[]).unwrap(), None);
        assert_eq!(
            settings(&[
                ("OTEL_TRACES_EXPORTER", "none"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")
            ])
            .unwrap(),
            None
        );
        assert_eq!(
            settings(&[
                ("OTEL_SDK_DISABLED", "true"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")
            ])
            .unwrap(),
            None
        );
        let on = settings(&[("OTEL_TRACES_EXPORTER", "otlp")])
            .unwrap()
            .unwrap();
        assert_eq!(on.endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(on.sampler, SamplerSetting::ParentBasedAlwaysOn);
        assert_eq!(on.service_name, "spillway");
    }

    #[test]
    fn the_general_endpoint_gets_the_signal_path_and_the_signal_one_is_kept() {
        let general = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")])
            .unwrap()
            .unwrap();
        assert_eq!(general.endpoint, "http://collector:4318/v1/traces");
        let own = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://collector/otlp/traces",
            ),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b,x-team=rl"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.01"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(own.endpoint, "https://collector/otlp/traces");
        assert_eq!(
            own.headers,
            vec![
                ("api-key".into(), "a b".into()),
                ("x-team".into(), "rl".into())
            ]
        );
        assert_eq!(own.sampler, SamplerSetting::ParentBasedRatio(0.01));
    }

    #[test]
    fn a_value_that_cannot_be_used_names_its_variable() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        for (vars, named) in [
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                vec![endpoint, ("OTEL_TRACES_SAMPLER", "sometimes")],
                "OTEL_TRACES_SAMPLER",
            ),
            (
                vec![
                    endpoint,
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "1%"),
                ],
                "OTEL_TRACES_SAMPLER_ARG",
            ),
            (
                vec![endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                vec![endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", "novalue")],
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
            (
                vec![endpoint, ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")],
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
            (
                vec![("OTEL_TRACES_EXPORTER", "jaeger")],
                "OTEL_TRACES_EXPORTER",
            ),
            (
                vec![("OTEL_SDK_DISABLED", "yes please")],
                "OTEL_SDK_DISABLED",
            ),
        ] {
            let (name, problem) = settings(&vars).unwrap_err();
            assert_eq!(name, named, "{problem}");
        }
    }
}
