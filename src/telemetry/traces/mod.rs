//! OpenTelemetry traces over OTLP/HTTP (protobuf), configured by the standard `OTEL_*`
//! variables and off unless an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or `OTEL_TRACES_EXPORTER=otlp` for the default
//! `http://localhost:4318`).
//!
//! The spans: one per HTTP request and per gRPC call (a server span, its parent taken from
//! a W3C `traceparent` header or gRPC metadata entry), with the admin action it made
//! (`spillway.action`); one per check inside it, with the policy and the outcome; one per
//! Redis call of the check scripts, which links every check it carried (the coalescer sends
//! several in one call) and is the child of the first.
//!
//! Off, nothing here costs a check more than reading one flag: every entry point checks
//! [`on`] before it builds anything.

mod logs;
pub use logs::WithTraceIds;

use std::{
    borrow::Cow,
    future::Future,
    sync::{
        OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use opentelemetry::{
    Context, KeyValue,
    context::FutureExt,
    propagation::{Extractor, TextMapPropagator},
    trace::{Link, Span, SpanContext, SpanKind, Status, TraceContextExt, Tracer},
};
use opentelemetry_sdk::{
    propagation::TraceContextPropagator,
    trace::{Sampler, SdkTracer, SdkTracerProvider},
};

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
    fn sampler(self) -> Sampler {
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
        match get("OTEL_SDK_DISABLED").as_deref() {
            None | Some("false" | "FALSE" | "False") => {}
            Some("true" | "TRUE" | "True") => return Ok(None),
            Some(other) => {
                return Err((
                    "OTEL_SDK_DISABLED",
                    format!("must be true or false, got {other:?}"),
                ));
            }
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
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            match get(name).as_deref() {
                None | Some("http/protobuf") => {}
                Some(other) => {
                    return Err((
                        name,
                        format!(
                            "{other:?} is not supported: Spillway sends OTLP over HTTP as \
                             protobuf (http/protobuf, a collector's port 4318)"
                        ),
                    ));
                }
            }
        }
        let own = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .map(|url| http_url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url))
            .transpose()?;
        let general = get("OTEL_EXPORTER_OTLP_ENDPOINT")
            .map(|url| http_url("OTEL_EXPORTER_OTLP_ENDPOINT", &url))
            .transpose()?;
        let endpoint = match (own, general) {
            // The signal's own URL is used as it is; the general one gets the signal's path.
            (Some(url), _) => url,
            (None, Some(base)) => format!("{}/v1/traces", base.trim_end_matches('/')),
            (None, None) if exporter.as_deref() == Some("otlp") => {
                "http://localhost:4318/v1/traces".to_owned()
            }
            (None, None) => return Ok(None),
        };
        if exporter.as_deref() == Some("none") {
            return Ok(None);
        }
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
                            format!(
                                "must be a fraction from 0 to 1 (0.01 samples 1%), got {raw:?}"
                            ),
                        )
                    }),
            }
        };
        let sampler = match get("OTEL_TRACES_SAMPLER").as_deref() {
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
        };
        Ok(Some(Self {
            endpoint,
            headers,
            timeout,
            sampler,
            service_name: get("OTEL_SERVICE_NAME").unwrap_or_else(|| "spillway".into()),
        }))
    }
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

/// `url` without the user and password it may carry, for the log.
fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        Err(_) => "(unparsable)".into(),
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

static ON: AtomicBool = AtomicBool::new(false);
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Whether spans are being made.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The installed exporter; [`Installed::shutdown`] sends what is left.
pub struct Installed(SdkTracerProvider);

impl Installed {
    /// Sends the spans still queued (within the export timeout) and stops.
    pub fn shutdown(self) {
        if let Err(error) = self.0.shutdown() {
            tracing::warn!(%error, "traces: the last spans were not all sent");
        }
    }
}

/// Starts sending spans as `settings` say. The exporter's thread hands each export to
/// `runtime`, where the HTTP client lives.
pub fn install(
    settings: &TraceSettings,
    runtime: tokio::runtime::Handle,
) -> Result<Installed, String> {
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    crate::install_tls_provider();
    let client = reqwest::Client::builder()
        .timeout(settings.timeout)
        .build()
        .map_err(|e| format!("traces: the HTTP client: {e}"))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Exporting { client, runtime })
        .with_endpoint(settings.endpoint.clone())
        .with_timeout(settings.timeout)
        .with_headers(settings.headers.iter().cloned().collect())
        .build()
        .map_err(|e| format!("traces: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(settings.sampler.sampler())
        .with_resource(resource)
        .build();
    use opentelemetry::trace::TracerProvider;
    let _ = TRACER.set(provider.tracer("spillway"));
    ON.store(true, Ordering::Relaxed);
    tracing::info!(endpoint = %shown(&settings.endpoint), "traces: sending spans over OTLP/HTTP");
    Ok(Installed(provider))
}

/// The exporter's HTTP client: the server's reqwest, run on the server's runtime (the batch
/// processor exports from a thread of its own, which has no runtime).
#[derive(Debug)]
struct Exporting {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Exporting {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let (parts, body) = request.into_parts();
        let call = async move {
            let mut builder = client.request(parts.method, parts.uri.to_string());
            for (name, value) in &parts.headers {
                builder = builder.header(name, value);
            }
            let answer = builder.body(body).send().await?;
            let status = answer.status();
            let body = answer.bytes().await?;
            let mut response = http::Response::new(body);
            *response.status_mut() = status;
            Ok::<_, reqwest::Error>(response)
        };
        let sent = self.runtime.spawn(call).await;
        let failure = match &sent {
            Ok(Ok(response)) if response.status().is_success() => None,
            Ok(Ok(response)) => Some(format!("the collector answered {}", response.status())),
            Ok(Err(error)) => Some(error.to_string()),
            Err(error) => Some(error.to_string()),
        };
        exported(failure);
        Ok(sent??)
    }
}

/// Whether the last export failed: said when exports start failing and when they work
/// again, not once per batch.
static EXPORTS_FAILING: AtomicBool = AtomicBool::new(false);

/// Counts an export that failed (`spillway_trace_exports_failed_total`: its spans are
/// lost) and logs the change of state.
fn exported(failure: Option<String>) {
    match failure {
        Some(error) => {
            metrics::counter!("spillway_trace_exports_failed_total").increment(1);
            if !EXPORTS_FAILING.swap(true, Ordering::Relaxed) {
                tracing::warn!(%error, "traces: exporting spans failed; their spans are lost until the collector answers (counted in spillway_trace_exports_failed_total)");
            }
        }
        None => {
            if EXPORTS_FAILING.swap(false, Ordering::Relaxed) {
                tracing::info!("traces: the collector answers again");
            }
        }
    }
}

fn tracer() -> Option<&'static SdkTracer> {
    if on() { TRACER.get() } else { None }
}

/// Reads `traceparent` (and `tracestate`) from HTTP headers or gRPC metadata.
struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// A server span for a request arriving with `headers`, its parent the caller's
/// `traceparent` when it sent one; `None` when traces are off or the sampler drops it.
/// `name` and `attributes` are only worked out for a span that is kept: at a 1% sample,
/// the other 99 requests cost the sampler's decision and nothing more (no context to carry,
/// no check or Redis span under them).
pub fn server_span(
    name: impl FnOnce() -> String,
    headers: &http::HeaderMap,
    attributes: impl FnOnce() -> Vec<KeyValue>,
) -> Option<Context> {
    let tracer = tracer()?;
    let parent = if headers.contains_key("traceparent") {
        TraceContextPropagator::new().extract(&Headers(headers))
    } else {
        Context::new()
    };
    let mut span = tracer
        .span_builder("request")
        .with_kind(SpanKind::Server)
        .start_with_context(tracer, &parent);
    if !span.span_context().is_sampled() {
        return None;
    }
    span.update_name(name());
    span.set_attributes(attributes());
    Some(parent.with_span(span))
}

/// A span of the work inside the current one (a check), when the current span is kept:
/// `None` when traces are off or no sampled span is current (a check is traced as part of
/// the request or call that asked for it, never on its own).
pub fn child_span(name: &'static str) -> Option<Context> {
    let tracer = tracer()?;
    let parent = Context::current();
    if !parent.span().span_context().is_sampled() {
        return None;
    }
    let span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Internal)
        .start_with_context(tracer, &parent);
    Some(parent.with_span(span))
}

/// Runs `work` inside `span` (the current context while it is polled). The span ends when
/// the last context holding it is dropped: here, unless the caller kept a clone to record
/// the result on.
pub async fn within<F: Future>(span: Option<Context>, work: F) -> F::Output {
    match span {
        None => work.await,
        Some(cx) => work.with_context(cx).await,
    }
}

/// Adds attributes to the current span (made only when traces are on).
pub fn record(attributes: impl FnOnce() -> Vec<KeyValue>) {
    if !on() {
        return;
    }
    let cx = Context::current();
    let span = cx.span();
    if span.is_recording() {
        span.set_attributes(attributes());
    }
}

/// Marks the span of `cx` failed with `message`.
pub fn failed(cx: &Context, message: String) {
    let span = cx.span();
    if span.is_recording() {
        span.set_status(Status::error(message));
    }
}

/// Sets attributes on the span of `cx`, when it records.
pub fn record_on(cx: &Context, attributes: Vec<KeyValue>) {
    let span = cx.span();
    if span.is_recording() {
        span.set_attributes(attributes);
    }
}

/// The current span, when traces are on and it is sampled: what a Redis call that carries
/// this work links back to.
pub fn current_sampled() -> Option<SpanContext> {
    if !on() {
        return None;
    }
    let cx = Context::current();
    let span = cx.span();
    let context = span.span_context();
    (context.is_valid() && context.is_sampled()).then(|| context.clone())
}

/// The span of one call to a backing service (`name`, with `attributes`) that carried the
/// work of `carried` (the checks' spans): the child of the first, linked to every one.
/// `None` when none of them is traced.
pub fn client_call(
    carried: &[SpanContext],
    name: &'static str,
    attributes: &[(&'static str, &'static str)],
) -> Option<Context> {
    let tracer = tracer()?;
    let first = carried.first()?;
    let parent = Context::new().with_remote_span_context(first.clone());
    let span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Client)
        .with_attributes(
            attributes
                .iter()
                .map(|(k, v)| KeyValue::new(*k, *v))
                .chain([KeyValue::new(
                    "spillway.checks_carried",
                    carried.len() as i64,
                )]),
        )
        .with_links(
            carried
                .iter()
                .map(|c| Link::with_context(c.clone()))
                .collect(),
        )
        .start_with_context(tracer, &parent);
    Some(Context::new().with_span(span))
}

/// Runs `work` inside `span` and marks the span failed when `work` fails.
pub async fn within_call<T, E: std::fmt::Display>(
    span: Option<Context>,
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let traced = span.clone();
    let out = within(span, work).await;
    if let (Some(cx), Err(error)) = (traced, &out) {
        failed(&cx, error.to_string());
    }
    out
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
