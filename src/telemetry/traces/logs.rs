//! Log lines with the ids of the trace they were written in (see [`WithTraceIds`]).

/// Log lines that carry the trace and span ids of the span they were written in (a request's,
/// when traces are on and it was sampled), so a line can be found from its trace and back:
/// JSON lines get `"trace_id"` and `"span_id"` fields, human-readable ones start with
/// `trace_id=… span_id=…`. Lines outside a span are the inner format's, unchanged.
pub struct WithTraceIds<F> {
    inner: F,
    json: bool,
}

impl<F> WithTraceIds<F> {
    pub fn new(inner: F, json: bool) -> Self {
        Self { inner, json }
    }
}

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for WithTraceIds<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let Some((trace, span)) = current_ids() else {
            return self.inner.format_event(ctx, writer, event);
        };
        if !self.json {
            write!(writer, "trace_id={trace} span_id={span} ")?;
            return self.inner.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.inner.format_event(
            ctx,
            tracing_subscriber::fmt::format::Writer::new(&mut line),
            event,
        )?;
        match line.strip_prefix('{') {
            Some(rest) => write!(
                writer,
                "{{\"trace_id\":\"{trace}\",\"span_id\":\"{span}\",{rest}"
            ),
            None => writer.write_str(&line),
        }
    }
}

/// The ids of the span the current task runs in, when there is one.
fn current_ids() -> Option<(String, String)> {
    use opentelemetry::trace::TraceContextExt;
    let cx = opentelemetry::Context::current();
    let span = cx.span();
    let context = span.span_context();
    context.is_valid().then(|| {
        (
            context.trace_id().to_string(),
            context.span_id().to_string(),
        )
    })
}

#[cfg(test)]
mod log_tests {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use std::sync::{Arc, Mutex};

    /// What a subscriber of `json` lines wrote for one event inside a span and one outside.
    fn lines(json: bool) -> String {
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let make = move || Sink(sink.clone());
        let dispatch: tracing::Dispatch = if json {
            tracing_subscriber::fmt()
                .with_writer(make)
                .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                .event_format(super::WithTraceIds::new(
                    tracing_subscriber::fmt::format().json(),
                    true,
                ))
                .finish()
                .into()
        } else {
            tracing_subscriber::fmt()
                .with_writer(make)
                .with_ansi(false)
                .event_format(super::WithTraceIds::new(
                    tracing_subscriber::fmt::format().with_ansi(false),
                    false,
                ))
                .finish()
                .into()
        };
        tracing::dispatcher::with_default(&dispatch, || {
            let context = SpanContext::new(
                TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
                SpanId::from_hex("00f067aa0ba902b7").unwrap(),
                TraceFlags::SAMPLED,
                true,
                TraceState::default(),
            );
            let cx = opentelemetry::Context::new().with_remote_span_context(context);
            {
                let _in_span = cx.attach();
                tracing::warn!(policy = "demo", "inside");
            }
            tracing::warn!("outside");
        });
        String::from_utf8(out.lock().unwrap().clone()).unwrap()
    }

    #[derive(Clone)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn log_lines_carry_the_ids_of_their_span() {
        let json = lines(true);
        let mut rows = json.lines();
        let inside: serde_json::Value = serde_json::from_str(rows.next().unwrap()).unwrap();
        assert_eq!(
            inside["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
            "{json}"
        );
        assert_eq!(inside["span_id"], "00f067aa0ba902b7");
        assert_eq!(inside["fields"]["message"], "inside");
        let outside: serde_json::Value = serde_json::from_str(rows.next().unwrap()).unwrap();
        assert!(outside.get("trace_id").is_none(), "{json}");
        let pretty = lines(false);
        let mut rows = pretty.lines();
        assert!(
            rows.next()
                .unwrap()
                .starts_with("trace_id=4bf92f3577b34da6a3ce929d0e0e4736 span_id=00f067aa0ba902b7 "),
            "{pretty}"
        );
        assert!(!rows.next().unwrap().contains("trace_id"), "{pretty}");
    }
}
