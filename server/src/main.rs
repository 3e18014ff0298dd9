//! `hotlimit-server --config ratelimit.yaml`: Envoy's rate limit service (gRPC) and a JSON
//! API (HTTP) over envoyproxy/ratelimit's configuration. `--help` lists the options.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use hotlimit_server::engine::Backend;
use hotlimit_server::http::Bounds;
use hotlimit_server::service::{HeaderStyle, Limits, Service, Settings};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, Signal, SignalKind};

#[derive(Clone, Copy, ValueEnum)]
enum BackendKind {
    /// In this process.
    Memory,
    /// Every decision in Redis or Redis Cluster: exact across replicas.
    Redis,
    /// The fleet limiter: decisions in memory, one limit across replicas through Redis.
    Hybrid,
}

/// A rate limit service: Envoy's RLS v3 gRPC API and a JSON HTTP API, configured as
/// envoyproxy/ratelimit is.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// A YAML file, or a directory of them (one domain a file).
    #[arg(long, env = "HOTLIMIT_CONFIG")]
    config: PathBuf,
    /// The gRPC address (Envoy's rate limit service cluster points here).
    #[arg(long, env = "HOTLIMIT_GRPC", default_value = "127.0.0.1:8081")]
    grpc: SocketAddr,
    /// The HTTP address: the JSON API, /healthcheck, /metrics.
    #[arg(long, env = "HOTLIMIT_HTTP", default_value = "127.0.0.1:8080")]
    http: SocketAddr,
    /// Where state lives.
    #[arg(long, env = "HOTLIMIT_BACKEND", value_enum, default_value = "memory")]
    backend: BackendKind,
    /// Redis (redis, hybrid): `redis://host:port/`; a cluster node's URL gives a cluster.
    #[arg(
        long,
        env = "HOTLIMIT_REDIS_URL",
        default_value = "redis://127.0.0.1:6379/"
    )]
    redis_url: String,
    /// Prefixes every Redis key.
    #[arg(long, env = "HOTLIMIT_REDIS_PREFIX", default_value = "hotlimit:")]
    redis_prefix: String,
    /// The hybrid backend's exchange interval, in milliseconds.
    #[arg(long, env = "HOTLIMIT_SYNC_MS", default_value_t = 50)]
    sync_ms: u64,
    /// At most this many keys in memory per limiter, a class of rules (memory, hybrid).
    #[arg(long, env = "HOTLIMIT_MAX_KEYS", default_value_t = 100_000)]
    max_keys: usize,
    /// The rate limit headers: off, draft-10, x-ratelimit or both.
    #[arg(long, env = "HOTLIMIT_HEADERS", default_value = "draft-10")]
    headers: HeaderStyle,
    /// Answer OK to everything, still counting (envoyproxy/ratelimit's SHADOW_MODE).
    #[arg(long, env = "HOTLIMIT_SHADOW_MODE")]
    shadow_mode: bool,
    /// How often the configuration is read again (reloaded if it changed), in ms; 0: only
    /// on SIGHUP.
    #[arg(long, env = "HOTLIMIT_RELOAD_MS", default_value_t = 1000)]
    reload_ms: u64,
    /// Worker threads (default: the CPUs this process may run on). With 1, a current-thread
    /// runtime: no work stealing to pay for on a single core.
    #[arg(long, env = "HOTLIMIT_THREADS")]
    threads: Option<usize>,
    /// When a request is over the limit on one descriptor, count none of its others (every
    /// domain `all_or_nothing`), as envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT;
    /// the descriptor over the limit still counts the hit, as there.
    #[arg(long, env = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")]
    stop_cache_key_increment_when_overlimit: bool,
    /// The longest domain a request may carry, in bytes, and the longest descriptor key or value
    /// kept whole in a state key (a longer one is counted under its SHA-256).
    #[arg(long, env = "HOTLIMIT_MAX_VALUE_BYTES", default_value_t = Limits::default().max_value_bytes)]
    max_value_bytes: usize,
    /// The most entries one descriptor may have (at most 4,096: what the JSON API reads).
    #[arg(long, env = "HOTLIMIT_MAX_ENTRIES", default_value_t = Limits::default().max_entries, value_parser = up_to_kept())]
    max_entries: usize,
    /// The most descriptors one request may have (at most 4,096: what the JSON API reads).
    #[arg(long, env = "HOTLIMIT_MAX_DESCRIPTORS", default_value_t = Limits::default().max_descriptors, value_parser = up_to_kept())]
    max_descriptors: usize,
    /// The largest HTTP body or gRPC message, in bytes.
    #[arg(long, env = "HOTLIMIT_MAX_BODY_BYTES", default_value_t = Limits::default().max_body_bytes)]
    max_body_bytes: usize,
    /// Requests handled at once, on each port: on HTTP the API routes all together (the probes
    /// apart), on gRPC the calls of every connection together; beyond, 503 or
    /// RESOURCE_EXHAUSTED at once, never a queue.
    #[arg(long, env = "HOTLIMIT_MAX_CONCURRENT", default_value_t = Bounds::default().max_concurrent)]
    max_concurrent: usize,
    /// A request not answered within this many ms is answered 503 (gRPC: CANCELLED, tonic's
    /// code for its timeout).
    #[arg(long, env = "HOTLIMIT_REQUEST_TIMEOUT_MS", default_value_t = 10_000)]
    request_timeout_ms: u64,
    /// Connections open at once on each port; one more is closed as it is accepted.
    #[arg(long, env = "HOTLIMIT_MAX_CONNECTIONS", default_value_t = Bounds::default().max_connections)]
    max_connections: usize,
    /// An HTTP connection whose next request's headers have not all come within this many ms
    /// is closed (an idle one too); a gRPC one whose HTTP/2 preface has not, too, and one
    /// silent this long is pinged and closed if the ping goes unanswered as long.
    #[arg(long, env = "HOTLIMIT_HEADER_TIMEOUT_MS", default_value_t = 10_000)]
    header_timeout_ms: u64,
    /// A gRPC connection this old is sent GOAWAY and closed once its calls are done; its client
    /// connects again (so Envoy's connections spread again over replicas behind a balancer,
    /// and no connection is held for good). envoyproxy/ratelimit's setting and default; 0:
    /// never.
    #[arg(long, env = "GRPC_MAX_CONNECTION_AGE", default_value = "24h", value_parser = humantime::parse_duration)]
    grpc_max_connection_age: Duration,
    /// How long a gRPC connection past its age has to finish its calls before it is closed
    /// (envoyproxy/ratelimit's setting and default).
    #[arg(long, env = "GRPC_MAX_CONNECTION_AGE_GRACE", default_value = "1h", value_parser = humantime::parse_duration)]
    grpc_max_connection_age_grace: Duration,
    /// Streams open at once on one gRPC connection (HTTP/2's MAX_CONCURRENT_STREAMS; Envoy
    /// opens another connection past it): what one connection can hold.
    #[arg(long, env = "HOTLIMIT_GRPC_MAX_CONCURRENT_STREAMS", default_value_t = Bounds::default().grpc_max_streams, value_parser = clap::value_parser!(u32).range(1..))]
    grpc_max_concurrent_streams: u32,
    /// The secret a take's ticket is signed with: on the redis backend, replicas given the
    /// same one settle each other's tickets (on memory and hybrid, only the issuer settles
    /// its own). Default: random, this process's alone.
    #[arg(long, env = "HOTLIMIT_TICKET_SECRET", hide_env_values = true)]
    ticket_secret: Option<String>,
    /// How many settled tickets are remembered until they expire (48 bytes each and their
    /// tables' slack: 50 to 100 bytes); past it the oldest issued tickets expire early.
    #[arg(long, env = "HOTLIMIT_MAX_SETTLED_TICKETS", default_value_t = hotlimit_server::tickets::DEFAULT_MAX_SETTLED)]
    max_settled_tickets: usize,
    /// /healthcheck answers 503 while the backend does not answer.
    #[arg(long, env = "HOTLIMIT_HEALTH_CHECKS_BACKEND")]
    health_checks_backend: bool,
}

/// 1 to [`KEPT`](hotlimit_server::http::KEPT): past it the JSON API counts descriptors and
/// entries without reading them, so it could not serve a request the limit admits.
fn up_to_kept() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..=hotlimit_server::http::KEPT as u64)
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let runtime = match threads {
        0 | 1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    };
    let result = match runtime {
        Ok(rt) => rt.block_on(run(args)),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hotlimit-server: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    // The handlers before the ports listen: a signal that comes once they do never gets its
    // default action (the process ended at once, requests in flight dropped).
    let term = signal(SignalKind::terminate()).ok();
    let interrupt = signal(SignalKind::interrupt()).ok();
    let hangup = signal(SignalKind::hangup()).ok();
    let backend = match args.backend {
        BackendKind::Memory => Backend::Memory {
            max_keys: args.max_keys,
            clock: None,
        },
        BackendKind::Redis => Backend::Redis {
            url: args.redis_url,
            prefix: args.redis_prefix,
        },
        BackendKind::Hybrid => Backend::Hybrid {
            url: args.redis_url,
            prefix: args.redis_prefix,
            sync_interval: Duration::from_millis(args.sync_ms),
            max_keys: args.max_keys,
        },
    };
    let settings = Settings {
        backend,
        headers: args.headers,
        global_shadow_mode: args.shadow_mode,
        stop_cache_key_increment_when_overlimit: args.stop_cache_key_increment_when_overlimit,
        limits: Limits {
            max_value_bytes: args.max_value_bytes,
            max_entries: args.max_entries,
            max_descriptors: args.max_descriptors,
            max_body_bytes: args.max_body_bytes,
        },
        ticket_secret: args.ticket_secret,
        max_settled_tickets: args.max_settled_tickets,
        health_checks_backend: args.health_checks_backend,
        algorithms: Default::default(),
        ..Settings::memory()
    };
    let bounds = Bounds {
        max_concurrent: args.max_concurrent.max(1),
        timeout: Duration::from_millis(args.request_timeout_ms.max(1)),
        max_connections: args.max_connections.max(1),
        header_timeout: Duration::from_millis(args.header_timeout_ms.max(1)),
        max_connection_age: Some(args.grpc_max_connection_age).filter(|age| !age.is_zero()),
        max_connection_age_grace: args.grpc_max_connection_age_grace,
        grpc_max_streams: args.grpc_max_concurrent_streams,
    };
    let service = Arc::new(Service::from_path(&args.config, settings).await?);
    let grpc = TcpListener::bind(args.grpc).await?;
    let http = TcpListener::bind(args.http).await?;
    eprintln!(
        "hotlimit-server: {} rules from {}, {} backend; gRPC on {}, HTTP on {}",
        service.rule_ids().len(),
        args.config.display(),
        service.settings().backend.name(),
        grpc.local_addr()?,
        http.local_addr()?,
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let grpc_task = tokio::spawn(hotlimit_server::grpc::serve(
        grpc,
        service.clone(),
        bounds,
        stopped(stop_rx.clone()),
    ));
    let http_task = tokio::spawn(hotlimit_server::http::serve(
        http,
        hotlimit_server::http::router(service.clone(), bounds),
        bounds,
        stopped(stop_rx.clone()),
    ));
    tokio::spawn(reloads(service.clone(), args.reload_ms, hangup));

    tokio::select! {
        _ = received(term) => {}
        _ = received(interrupt) => {}
    }
    eprintln!("hotlimit-server: shutting down (in-flight requests finish)");
    let _ = stop_tx.send(true);
    grpc_task.await??;
    http_task.await?;
    Ok(())
}

/// Reads the configuration again every `every_ms` and on SIGHUP (`hup`); a rejected one is
/// logged with its file and line, and the running one kept.
async fn reloads(service: Arc<Service>, every_ms: u64, mut hup: Option<Signal>) {
    loop {
        let tick = async {
            if every_ms == 0 {
                std::future::pending::<()>().await
            } else {
                tokio::time::sleep(Duration::from_millis(every_ms)).await
            }
        };
        let hup_recv = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tick => {}
            _ = hup_recv => {}
        }
        match service.reload().await {
            Ok(true) => eprintln!("hotlimit-server: configuration reloaded"),
            Ok(false) => {}
            Err(e) => {
                eprintln!("hotlimit-server: configuration rejected, the running one kept: {e}")
            }
        }
    }
}

/// The next delivery of `signal`; never, without its handler.
async fn received(signal: Option<Signal>) {
    match signal {
        Some(mut s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}
