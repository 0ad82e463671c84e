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
mod settings;
pub use logs::WithTraceIds;
pub use settings::{Invalid, SamplerSetting, TraceSettings};

use std::{
    future::Future,
    sync::{
        OnceLock,
        atomic::{AtomicBool, Ordering},
    },
};

use opentelemetry::{
    Context, KeyValue,
    context::FutureExt,
    propagation::{Extractor, TextMapPropagator},
    trace::{Link, Span, SpanContext, SpanKind, Status, TraceContextExt, Tracer},
};
use opentelemetry_sdk::{
    propagation::TraceContextPropagator,
    trace::{SdkTracer, SdkTracerProvider},
};

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
        .with_attributes(
            settings
                .resource_attributes
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
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
