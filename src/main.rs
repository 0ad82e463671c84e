//! The `spillway` binary: serve, or manage policies, users and keys (see `spillway --help`).

// Functions stay short (clippy.toml: 80 lines); a dashboard page whose body is one
// `view!` may be exempted by an `expect` of its own, counted by tests/it/architecture.rs.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
use anyhow::Context;
use spillway::{
    cli::{self, Command},
    config::Config,
    server,
    service::Service,
    state::AppState,
    store::Store,
};

/// mimalloc: the check path allocates many small short-lived objects, where glibc malloc
/// showed up as about a fifth of the CPU in `perf` (benches/REPORT.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A start that fails (a setting that cannot be used, a port taken, Redis unreachable) says
/// why on one line, naming the setting, and exits 1.
#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("spillway: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `spillway` (serve): the HTTP port at once (alive, not ready until Redis answers), then
/// the gRPC port, until a signal and the drain.
async fn serve(config: Config, open_files: u64) -> anyhow::Result<()> {
    #[cfg(feature = "profile")]
    let profiler = spillway::telemetry::profile::Profiler::start();
    let traces = match &config.traces {
        Some(settings) => Some(
            spillway::telemetry::traces::install(settings, tokio::runtime::Handle::current())
                .map_err(anyhow::Error::msg)?,
        ),
        None => None,
    };
    let drain = config.shutdown_drain;
    log_capacity(&config.capacity, open_files);
    serve_metrics_port(&config).await?;
    let addr = config.leptos_options.site_addr;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr} (LEPTOS_SITE_ADDR)"))?;
    // Until Redis answers, the port says the process is alive and not ready.
    let tls = config.tls.http.clone();
    let state = server::starting(&listener, tls, AppState::connect_patiently(config))
        .await
        .context("connecting to Redis")?;
    let scheme = if state.tls.http.is_some() {
        "https"
    } else {
        "http"
    };
    tracing::info!(%addr, "spillway listening on {scheme}://{addr}");
    let grpc = bind_grpc(&state).await?;
    let shutdown = server::shutdown_after_drain(state.shutdown.clone(), drain);
    server::serve(listener, grpc, state, shutdown).await?;
    if let Some(traces) = traces {
        // The exporter's last export waits on this runtime: off its threads.
        tokio::task::spawn_blocking(move || traces.shutdown()).await?;
    }
    #[cfg(feature = "profile")]
    if let Some(profiler) = profiler {
        profiler.finish()?;
    }
    tracing::info!("stopped");

    Ok(())
}

/// The caps this process runs under, and where its memory budget came from.
fn log_capacity(capacity: &spillway::config::capacity::Capacity, open_files: u64) {
    tracing::info!(
        open_files,
        memory_budget_mb = capacity.budget_mb,
        max_connections = capacity.max_connections,
        max_pending_calls = capacity.max_pending,
        max_waiting = capacity.max_waiting,
        "capacity: a memory budget of {} MiB from {}",
        capacity.budget_mb,
        capacity.budget_source
    );
    if let Some(clamped) = &capacity.clamped {
        tracing::warn!("{clamped}");
    }
}

/// `/metrics` on a port of its own (`SPILLWAY_METRICS_ADDR`), from the start: what Envoy
/// Gateway scrapes (upstream's `PROMETHEUS_ADDR`). Ends with the process.
async fn serve_metrics_port(config: &Config) -> anyhow::Result<()> {
    if config.metrics_upstream_names {
        spillway::telemetry::metrics::use_upstream_names();
    }
    let Some((addr, path)) = &config.metrics_port else {
        return Ok(());
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr} (SPILLWAY_METRICS_ADDR)"))?;
    tracing::info!(%addr, "metrics on http://{addr}{path}");
    tokio::spawn(spillway::net::metrics_port::serve(
        listener,
        spillway::api::metrics_port(path),
    ));
    Ok(())
}

/// The gRPC port (Envoy's rate limit service), unless `SPILLWAY_GRPC_ADDR` is empty.
async fn bind_grpc(state: &AppState) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    let Some(grpc_addr) = state.envoy.grpc_addr else {
        return Ok(None);
    };
    let grpc = tokio::net::TcpListener::bind(grpc_addr)
        .await
        .with_context(|| format!("binding {grpc_addr} (SPILLWAY_GRPC_ADDR)"))?;
    let tls = match &state.tls.grpc {
        Some(port) if port.requires_client_certificates() => " (mTLS)",
        Some(_) => " (TLS)",
        None => "",
    };
    tracing::info!(%grpc_addr, "Envoy rate limit service (gRPC) on {grpc_addr}{tls}");
    Ok(Some(grpc))
}

async fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // --help and --version print and exit 0; a wrong argument says what and exits 2.
    let command = cli::parse(&args).unwrap_or_else(|e| e.exit());
    // Needs no server and no settings.
    if let Command::Validate { files } = &command {
        let merge = Config::merge_domains(|name| std::env::var(name).ok())
            .context("reading the configuration")?;
        return match cli::validate(files, merge) {
            Ok(report) => {
                print!("{report}");
                Ok(())
            }
            Err(problems) => anyhow::bail!("{problems}"),
        };
    }
    if let Command::Test { file, cases } = &command {
        let read = |path: &std::path::PathBuf| {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
        };
        return match cli::plan::test(&read(file)?, &read(cases)?) {
            Ok(report) => {
                print!("{report}");
                Ok(())
            }
            Err(report) => anyhow::bail!("{report}"),
        };
    }
    // Before the configuration: the connection caps are clamped to what the process may open.
    let open_files = spillway::config::capacity::raise_open_files();
    let config = Config::from_env().context("reading the configuration")?;
    server::init_tracing(&config);
    if let Some(ignored) = &config.upstream {
        tracing::info!("envoyproxy/ratelimit's environment: its variables are read as Spillway's");
        for line in ignored {
            tracing::warn!("{line}");
        }
    }
    dispatch(command, config, open_files).await
}

/// Runs a command that needs the configuration (and, but for `demo`, Redis).
async fn dispatch(command: Command, config: Config, open_files: u64) -> anyhow::Result<()> {
    match command {
        Command::Serve => serve(config, open_files).await?,
        Command::Export { format, output } => {
            let service = connect(&config).await?;
            let text = cli::export(&service, format).await?;
            match output {
                Some(path) => std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?,
                None => print!("{text}"),
            }
        }
        Command::Demo(options) => {
            let key = config
                .service_keys
                .first()
                .or(config.admin_keys.first())
                .cloned()
                .context("demo: set SPILLWAY_SERVICE_KEYS (make demo reads .spillway/keys.env)")?;
            spillway::cli::demo::run(options, key).await?;
        }
        Command::People(command) => {
            let service = connect(&config).await?;
            print!("{}", cli::people_command(&service, command).await?);
        }
        Command::State(command) => {
            let service = connect(&config).await?;
            print!("{}", cli::backup::run(&service, command).await?);
        }
        Command::Validate { .. } | Command::Test { .. } => {
            unreachable!("answered before the configuration is read")
        }
        Command::Plan { file, last_ms } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let service = connect(&config).await?;
            let (report, denies) = cli::plan::plan(&service, &text, last_ms).await?;
            print!("{report}");
            if denies {
                // For CI: the file would deny checks that were let through.
                std::process::exit(3);
            }
        }
        Command::Import { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let service = connect(&config).await?;
            let written = cli::import(&service, &text).await?;
            println!("imported {written} policies from {}", file.display());
        }
    }
    Ok(())
}

/// The service a command works with: Redis as configured, no background work.
async fn connect(config: &Config) -> anyhow::Result<Service> {
    // The command line is not on the hot path: give Redis longer than the check timeout.
    let timeout = config.redis_timeout.max(std::time::Duration::from_secs(5));
    let store = Store::connect_configured(config, timeout)
        .await
        .context("connecting to Redis")?;
    Ok(Service::for_command(store))
}
