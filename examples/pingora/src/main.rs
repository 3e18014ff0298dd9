//! A pingora reverse proxy that rate-limits each client with hotlimit.
//!
//! Every request is keyed (the client's address, or its address in `X-Forwarded-For` behind
//! trusted proxies) and decided by a per-key GCRA limiter in pingora's `request_filter` phase,
//! before any upstream connection: a denial is answered `429 Too Many Requests` by the proxy
//! itself. The limit is this process's own, or, with `--redis`, one shared by a fleet of
//! proxies (see *A fleet* below). The answers and header fields are those of hotlimit's tower
//! layer, rendered by the same code (`hotlimit::headers`): `Retry-After` on a 429,
//! `RateLimit-Policy` and `RateLimit` on every response (the upstream's included), optionally
//! the legacy `X-RateLimit-*`.
//!
//! # Usage
//!
//! ```text
//! cargo run --release -- --listen 127.0.0.1:6188 --upstream 127.0.0.1:8080 \
//!     --rate 5/s --burst 5 [--key ip|forwarded:<n>] [--mode enforce|dry-run|shadow] \
//!     [--redis redis://127.0.0.1:6379/ [--fallback-share 0.25]] \
//!     [--cost-header x-estimate] [--settle-header x-tokens-used] [--count-status 401]
//!
//! --listen ADDR        address to listen on (default 127.0.0.1:6188; port 0 picks one)
//! --upstream HOST:PORT the HTTP server to proxy to (plain HTTP, no TLS)
//! --rate RATE          per-client rate: 5/s, 100/min, 0.5/s (default 5/s)
//! --burst N            per-client burst (default: the rate's count)
//! --key ip             key by the client's address from the connection (the default)
//! --key forwarded:N    key by the client address in X-Forwarded-For, behind N trusted
//!                      proxies (the N-th address from the right; spoofable if clients can
//!                      reach this proxy without going through them)
//! --mode MODE          enforce (429s), dry-run or shadow (never deny; see below)
//! --legacy-headers     also send X-RateLimit-Limit / -Remaining / -Reset
//! --draft DRAFT        the RateLimit fields' draft: draft-10 (default), draft-09, draft-07
//! --threads N          pingora's worker threads (default: the number of CPUs)
//! --redis URL          share each client's limit with every proxy using the Redis at URL
//!                      (redis://host:port/; see below); default: this process's own limit
//! --fallback-share F   with --redis: the share of a client's quota, 0 < F <= 1, that this
//!                      proxy admits on its own while it holds none from Redis (a client's
//!                      first request here, an outage); default 1, the whole quota
//! --cost-header NAME   settle at response time: the request header with the provisional
//!                      cost (default 1)
//! --settle-header NAME settle at response time with the cost the upstream reports in this
//!                      response header (its usage: tokens, bytes)
//! --count-status CODE  settle at response time: only responses with this status count
//!                      (401: failed logins); the others are refunded
//! ```
//!
//! It prints `listening on <addr>` once it accepts connections.
//!
//! # Modes
//!
//! - **enforce**: a denied request is answered 429, with `Retry-After` and the fields, and
//!   never reaches the upstream; an allowed one goes through and its response carries the
//!   fields.
//! - **dry-run**: nothing is denied; every response from the upstream carries the fields of
//!   its decision (`r=0` where enforce would have denied), and would-be denials are logged
//!   on stderr.
//! - **shadow**: nothing is denied; the upstream learns the decision from the request header
//!   `hotlimit-shadow: denied` or `allowed` (set by the proxy: a client's own is replaced)
//!   and decides what a denial means (serve it but skip the work, say). Responses to denied
//!   requests carry no rate-limit fields, which would tip the client off; allowed ones do.
//!
//! The proxy appends the client's address to `X-Forwarded-For` for the upstream, as proxies do
//! (so a hotlimit behind it can use `forwarded:1`).
//!
//! A request without a key (`--key forwarded:N` and no `X-Forwarded-For`, or fewer than N
//! entries) is answered 400 in enforce mode, as the tower layer does, and let through
//! uncounted in the other modes.
//!
//! # Settle at response time
//!
//! With any of `--cost-header`, `--settle-header` or `--count-status`, a request's cost is a
//! provisional charge (hotlimit's `take`), settled in `response_filter` with what the
//! upstream's response says (hotlimit's `settle`): units not used come back, an overrun is a
//! debt the client pays before its next admission. A token budget is charged the tokens really
//! used (`--cost-header x-estimate --settle-header x-tokens-used`); a login endpoint counts only
//! failed attempts (`--count-status 401`). A denied request is charged nothing; a response
//! without the settle header keeps the provisional charge. The rate-limit fields on a response
//! are those of the provisional decision.
//!
//! # A fleet
//!
//! Without `--redis`, each proxy process limits alone: N proxies behind a load balancer let a
//! client through N times its quota. With `--redis URL`, the proxy limits with hotlimit's
//! `HybridLimiter` (GCRA from `--rate` and `--burst`, Redis keys `pingora:{<client>}`), and
//! every proxy pointed at the same Redis shares one limit per client: run them all with the
//! same `--rate` and `--burst`. Decisions stay local, with no round trip per request: a
//! background thread reconciles each active client with Redis every 10 ms, leasing quota
//! ahead of the client's demand on this proxy and handing back what it does not use. A
//! client's first request on a proxy, and every request while Redis is unreachable, are
//! decided by the fallback, `--fallback-share` of the quota on this proxy alone; what it
//! admits is charged to the shared limit once Redis answers (an excess is paid back by
//! denials). `1/N` for N proxies keeps an outage to about one quota across the fleet; the
//! default, 1, lets each proxy admit a whole quota on its own then, as it would alone. Redis
//! must be reachable at start.

#![forbid(unsafe_code)]
#![deny(missing_docs, missing_debug_implementations)]

#[cfg(not(unix))]
compile_error!("the example hands pingora a socket through its fd table: Unix only");

mod listener;
mod proxy;

use clap::Parser;
use hotlimit::algo::Gcra;
use hotlimit::headers::{AdvertisedQuota, Draft, Mode, RateLimitHeaders};
use hotlimit::redis::{Fallback, HybridLimiter};
use hotlimit::{CasLimiter, Rate, RateLimiter, Requests};
use http::HeaderName;
use listener::Prebound;
use pingora::prelude::{http_proxy_service, Server};
use pingora::server::configuration::ServerConf;
use proxy::{KeyArg, RateLimitProxy, SettleArgs};
use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

/// The command line.
#[derive(Parser, Debug)]
#[command(about = "A pingora reverse proxy rate-limited per client by hotlimit")]
struct Args {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:6188")]
    listen: SocketAddr,
    /// The upstream HTTP server, HOST:PORT (plain HTTP).
    #[arg(long)]
    upstream: String,
    /// Per-client rate, e.g. 5/s, 100/min.
    #[arg(long, default_value = "5/s")]
    rate: Rate,
    /// Per-client burst (default: the rate's count).
    #[arg(long)]
    burst: Option<u64>,
    /// `ip` (the connection's address) or `forwarded:<n>` (X-Forwarded-For behind n proxies).
    #[arg(long, default_value = "ip", value_parser = KeyArg::parse)]
    key: KeyArg,
    /// enforce, dry-run or shadow.
    #[arg(long, default_value = "enforce")]
    mode: Mode,
    /// Also send the legacy X-RateLimit-* headers.
    #[arg(long)]
    legacy_headers: bool,
    /// The RateLimit fields' draft: draft-10, draft-09 or draft-07.
    #[arg(long, default_value_t = Draft::default())]
    draft: Draft,
    /// pingora's worker threads (default: the number of CPUs).
    #[arg(long)]
    threads: Option<usize>,
    /// Share each client's limit with every proxy using this Redis (redis://host:port/).
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// With --redis: the share of a client's quota (0 < F <= 1) admitted alone while this
    /// proxy holds none from Redis (default 1).
    #[arg(long, value_name = "F", requires = "redis", value_parser = parse_share)]
    fallback_share: Option<Fallback>,
    /// Settle at response time: the request header with the provisional cost (default 1).
    #[arg(long, value_name = "NAME")]
    cost_header: Option<HeaderName>,
    /// Settle at response time with the cost the upstream reports in this response header
    /// (refunded if less than taken, charged as a debt if more).
    #[arg(long, value_name = "NAME")]
    settle_header: Option<HeaderName>,
    /// Settle at response time: only responses with this status count (401: failed logins);
    /// the others are refunded.
    #[arg(long, value_name = "CODE")]
    count_status: Option<u16>,
}

/// `--fallback-share`: a share of the quota in (0, 1].
fn parse_share(s: &str) -> Result<Fallback, String> {
    let bad = || format!("bad share `{s}` (expected a number in (0, 1])");
    let share: f64 = s.parse().map_err(|_| bad())?;
    // No flag for `Fallback::DENY` (share 0): a client's first request on each proxy would
    // wait for a sync.
    if !(share > 0.0 && share <= 1.0) {
        return Err(bad());
    }
    Fallback::share(share).map_err(|e| e.to_string())
}

/// How often the fleet's limiter reconciles each active client with Redis.
const SYNC_INTERVAL: Duration = Duration::from_millis(10);

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Builds the limiter (this process's own, or the fleet's with `--redis`) and serves.
fn run(args: Args) -> Result<Infallible, Box<dyn std::error::Error>> {
    let mut gcra = Gcra::new(args.rate)?;
    if let Some(burst) = args.burst {
        gcra = gcra.with_burst(burst)?;
    }
    match &args.redis {
        None => {
            // Drop keys back at their full quota every 10 s, so a flood of clients does not
            // pile up.
            let limiter = CasLimiter::<String, _>::builder(gcra)
                .sweep_every(Duration::from_secs(10))
                .build()?;
            serve(&args, limiter)
        }
        Some(url) => {
            // Connects now: a Redis that cannot be reached fails the start. Its sync thread
            // removes idle clients itself.
            let limiter = HybridLimiter::builder(url.as_str(), gcra)
                .redis(|r| r.key_prefix("pingora:"))
                .sync_interval(SYNC_INTERVAL)
                .fallback(args.fallback_share.unwrap_or(Fallback::FULL))
                .build()
                .map_err(|e| format!("redis `{url}`: {e}"))?;
            serve(&args, limiter)
        }
    }
}

/// Sets the proxy up with `limiter` and serves until the process is stopped.
fn serve<L>(args: &Args, limiter: L) -> Result<Infallible, Box<dyn std::error::Error>>
where
    L: RateLimiter<str> + Requests<str> + AdvertisedQuota + 'static,
{
    // The fields on allowed responses too, as tower/examples/proxy.rs: clients can pace themselves.
    let mut headers = RateLimitHeaders::for_limiter(&limiter);
    (headers.mode, headers.draft) = (args.mode, args.draft);
    (headers.legacy, headers.on_allowed) = (args.legacy_headers, true);
    // Resolved once: pingora would resolve a host name for every request.
    let upstream = args
        .upstream
        .to_socket_addrs()
        .map_err(|e| format!("bad upstream `{}`: {e}", args.upstream))?
        .next()
        .ok_or_else(|| format!("upstream `{}` resolves to no address", args.upstream))?;
    // Bound here, so a busy port fails now, and port 0 is known before we say where we are.
    let listener = TcpListener::bind(args.listen)?;

    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let conf = ServerConf {
        threads,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let bind = args.listen.to_string();
    let mut service = http_proxy_service(
        &server.configuration,
        RateLimitProxy::new(
            limiter,
            args.key,
            headers,
            upstream,
            SettleArgs {
                cost_header: args.cost_header.clone(),
                settle_header: args.settle_header.clone(),
                count_status: args.count_status,
            },
        ),
    );
    service.add_tcp(&bind);
    server.add_service(Prebound::new(service, listener, bind)?);
    server.run_forever()
}
