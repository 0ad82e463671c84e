//! Upstream's metrics and tracing variables, as Spillway's.

use super::{Problem, Upstream, flag};

impl Upstream {
    /// Upstream's metrics and tracing variables.
    pub(super) fn telemetry(
        &mut self,
        get: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), Problem> {
        self.prometheus(get)?;
        self.tracing(get)
    }

    /// USE_PROMETHEUS (PROMETHEUS_ADDR, PROMETHEUS_PATH): a metrics port with upstream's
    /// series beside Spillway's.
    fn prometheus(&mut self, get: &impl Fn(&str) -> Option<String>) -> Result<(), Problem> {
        if flag(get, "USE_PROMETHEUS")? {
            let addr = get("PROMETHEUS_ADDR")
                .filter(|a| !a.is_empty())
                .unwrap_or_else(|| ":9090".into());
            let Some((host, port)) = addr.rsplit_once(':') else {
                return Err((
                    "PROMETHEUS_ADDR",
                    format!("expected [host]:port such as :19001, got {addr:?}"),
                ));
            };
            let port: u16 = port.parse().map_err(|_| {
                (
                    "PROMETHEUS_ADDR",
                    format!("expected [host]:port, got {addr:?}"),
                )
            })?;
            let ip: std::net::IpAddr = match host.trim_matches(['[', ']']) {
                "" => [0, 0, 0, 0].into(),
                "localhost" => [127, 0, 0, 1].into(),
                other => other.parse().map_err(|_| {
                    (
                        "PROMETHEUS_ADDR",
                        format!("expected an IP address and port, got {addr:?}"),
                    )
                })?,
            };
            self.set(
                "SPILLWAY_METRICS_ADDR",
                std::net::SocketAddr::new(ip, port).to_string(),
            );
            if let Some(path) = get("PROMETHEUS_PATH").filter(|p| !p.is_empty()) {
                self.set("SPILLWAY_METRICS_PATH", path);
            }
            self.set("SPILLWAY_METRICS_UPSTREAM_NAMES", "true");
        }
        Ok(())
    }

    /// TRACING_*: OpenTelemetry's settings as upstream sets them (traces only when
    /// TRACING_ENABLED, OTLP over HTTP to OTEL_EXPORTER_OTLP_ENDPOINT).
    fn tracing(&mut self, get: &impl Fn(&str) -> Option<String>) -> Result<(), Problem> {
        match get("TRACING_ENABLED").filter(|v| !v.is_empty()) {
            // Unset: Spillway's own OTEL_* decide (none set, no trace is sent).
            None => return Ok(()),
            Some(_) if !flag(get, "TRACING_ENABLED")? => {
                self.set("OTEL_SDK_DISABLED", "true");
                return Ok(());
            }
            Some(_) => {}
        }
        match get("TRACING_EXPORTER_PROTOCOL")
            .map(|p| p.to_ascii_lowercase())
            .as_deref()
        {
            None | Some("" | "http") => {}
            Some(other) => {
                return Err((
                    "TRACING_EXPORTER_PROTOCOL",
                    format!(
                        "{other:?}: traces are sent as OTLP over HTTP (http, a collector's port 4318)"
                    ),
                ));
            }
        }
        self.set("OTEL_TRACES_EXPORTER", "otlp");
        self.set(
            "OTEL_SERVICE_NAME",
            get("TRACING_SERVICE_NAME")
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "RateLimit".into()),
        );
        let raw = get("TRACING_SAMPLING_RATE")
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "1".into());
        // As upstream's sampler: 1 and above samples every trace.
        let rate = match raw.parse::<f64>() {
            Ok(r) if r >= 1.0 => 1.0,
            Ok(r) if r >= 0.0 => r,
            _ => {
                return Err((
                    "TRACING_SAMPLING_RATE",
                    format!("expected a fraction from 0 to 1, got {raw:?}"),
                ));
            }
        };
        if rate == 0.0 {
            self.ignored.push("TRACING_SAMPLING_RATE=0: no trace is sampled (Envoy Gateway writes a sampling rate under 5% as 0.0)".into());
        }
        self.set("OTEL_TRACES_SAMPLER", "parentbased_traceidratio");
        self.set("OTEL_TRACES_SAMPLER_ARG", rate.to_string());
        let mut attributes: Vec<String> = get("OTEL_RESOURCE_ATTRIBUTES")
            .into_iter()
            .filter(|a| !a.is_empty())
            .collect();
        for (theirs, attribute) in [
            ("TRACING_SERVICE_NAMESPACE", "service.namespace"),
            ("TRACING_SERVICE_INSTANCE_ID", "service.instance.id"),
        ] {
            if let Some(value) = get(theirs).filter(|v| !v.is_empty()) {
                attributes.push(format!("{attribute}={value}"));
            }
        }
        if !attributes.is_empty() {
            self.set("OTEL_RESOURCE_ATTRIBUTES", attributes.join(","));
        }
        Ok(())
    }
}
