//! An axum server with hotlimit's tower layer in front of a small handler.
//!
//! # Usage
//!
//! ```text
//! cargo run --release -p hotlimit-tower --example proxy -- --listen 127.0.0.1:3000 \
//!     --rate 5/s --burst 5 [--key ip|header:<name>|forwarded:<n>] [--mode enforce|dry-run|shadow]
//! cargo run --release -p hotlimit-tower --features redis --example proxy -- \
//!     --redis redis://127.0.0.1:6379/ --rate 5/s
//!
//! --listen ADDR        address to listen on (default 127.0.0.1:3000; port 0 picks one)
//! --rate RATE          per-key rate: 5/s, 100/min, 0.5/s (default 5/s)
//! --burst N            per-key burst (default: the rate's count)
//! --key ip             key by the client's address from the connection (the default)
//! --key header:NAME    key by the value of header NAME (an API key, say)
//! --key forwarded:N    key by the client address in X-Forwarded-For, behind N trusted
//!                      proxies (the N-th address from the right; spoofable if clients can
//!                      reach this server without going through them)
//! --mode MODE          enforce (429s), dry-run (never deny, log would-be denials) or shadow
//! --legacy-headers     also send X-RateLimit-Limit / -Remaining / -Reset
//! --draft VERSION      the ratelimit-headers draft: draft-10 (default), draft-09 or draft-07
//! --redis URL          keep the limit in Redis (feature `redis`): every instance
//!                      started with the same URL shares it; fails open if Redis is down
//! ```
//!
//! It prints `listening on <addr>` once it accepts connections. Every response carries the
//! rate-limit headers; try
//!
//! ```text
//! for i in 1 2 3 4 5 6; do curl -si http://127.0.0.1:3000/ | head -n 1; done
//! curl -si http://127.0.0.1:3000/      # 429, Retry-After: 1, RateLimit: "default";r=0;t=1
//! ```
//!
//! Requests without a key (a missing header with `--key header:...` or `--key forwarded:...`)
//! are answered 400.

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::{Extension, Router};
use clap::Parser;
use hotlimit::algo::Gcra;
use hotlimit::headers::{AdvertisedQuota, Draft, Mode};
use hotlimit::{AsyncRateLimiter, CasLimiter, Rate};
use hotlimit_tower::{
    ForwardedIp, HeaderKey, Key, KeyExtractor, PeerIp, RateLimitLayer, ShadowDecision,
};
use http::request::Parts;
use http::HeaderName;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(about = "An axum server rate-limited by hotlimit's tower layer")]
struct Args {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Per-key rate, e.g. 5/s, 100/min.
    #[arg(long, default_value = "5/s")]
    rate: Rate,
    /// Per-key burst (default: the rate's count).
    #[arg(long)]
    burst: Option<u64>,
    /// `ip` (the connection's address) or `header:<name>`.
    #[arg(long, default_value = "ip", value_parser = parse_key)]
    key: KeyArg,
    /// enforce, dry-run or shadow.
    #[arg(long, default_value = "enforce")]
    mode: Mode,
    /// Also send the legacy X-RateLimit-* headers.
    #[arg(long)]
    legacy_headers: bool,
    /// The ratelimit-headers draft the fields follow: draft-07, draft-09 or draft-10.
    #[arg(long, default_value = "draft-10")]
    draft: Draft,
    /// Keep the limit in Redis at this URL, shared by every instance (feature `redis`).
    #[arg(long)]
    redis: Option<String>,
}

/// The key chosen on the command line: one extractor type for all, so one layer type.
#[derive(Debug, Clone)]
enum KeyArg {
    Ip(PeerIp),
    Header(HeaderKey),
    Forwarded(ForwardedIp),
}

fn parse_key(s: &str) -> Result<KeyArg, String> {
    match s.split_once(':') {
        None if s == "ip" => Ok(KeyArg::Ip(
            PeerIp::from_extension::<ConnectInfo<SocketAddr>>(),
        )),
        Some(("header", name)) => name
            .parse::<HeaderName>()
            .map(|n| KeyArg::Header(HeaderKey::new(n)))
            .map_err(|e| format!("bad header name `{name}`: {e}")),
        Some(("forwarded", n)) => match n.parse::<usize>() {
            Ok(n @ 1..) => Ok(KeyArg::Forwarded(ForwardedIp::x_forwarded_for(n))),
            _ => Err(format!(
                "bad proxy count `{n}` (expected the number of trusted proxies, at least 1)"
            )),
        },
        _ => Err(format!(
            "unknown key `{s}` (expected ip, header:<name> or forwarded:<n>)"
        )),
    }
}

impl KeyExtractor for KeyArg {
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        match self {
            KeyArg::Ip(k) => k.extract(parts),
            KeyArg::Header(k) => k.extract(parts),
            KeyArg::Forwarded(k) => k.extract(parts),
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut gcra = Gcra::new(args.rate)?;
    if let Some(burst) = args.burst {
        gcra = gcra.with_burst(burst)?;
    }
    if let Some(url) = &args.redis {
        return serve_redis(url, gcra, &args).await;
    }
    // Drop keys back at their full quota every 10 s, so a flood of clients does not pile up.
    let limiter = Arc::new(
        CasLimiter::<String, _>::builder(gcra)
            .sweep_every(Duration::from_secs(10))
            .build()?,
    );
    serve(limiter, &args).await
}

/// The limit in Redis: the same layer and headers, over the async client.
#[cfg(feature = "redis")]
async fn serve_redis(url: &str, gcra: Gcra, args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let limiter = hotlimit::redis::RedisLimiter::builder(url, gcra)
        .key_prefix("proxy:")
        .build_async()
        .await?;
    serve(Arc::new(limiter), args).await
}

#[cfg(not(feature = "redis"))]
async fn serve_redis(_: &str, _: Gcra, _: &Args) -> Result<(), Box<dyn std::error::Error>> {
    Err("--redis needs the `redis` feature: \
         cargo run -p hotlimit-tower --features redis --example proxy -- --redis URL"
        .into())
}

/// Serves the handler behind the layer over `limiter`, until the process is stopped.
async fn serve<L>(limiter: Arc<L>, args: &Args) -> Result<(), Box<dyn std::error::Error>>
where
    L: AsyncRateLimiter<str> + AdvertisedQuota + 'static,
{
    let mode = args.mode;
    let layer = RateLimitLayer::builder(limiter, args.key.clone())
        .headers(|h| {
            (h.mode, h.on_allowed, h.legacy, h.draft) =
                (mode, true, args.legacy_headers, args.draft)
        })
        .on_decision(move |r| {
            if r.decision.is_denied() && mode != Mode::Enforce {
                eprintln!(
                    "{mode}: would deny {} (retry after {:?})",
                    r.key,
                    r.decision.retry_after()
                );
            }
        })
        .build();

    let app = Router::new()
        .route(
            "/",
            get(|shadow: Option<Extension<ShadowDecision>>| async move {
                match shadow {
                    // Shadow mode: answer as usual, but skip the work for a would-be denial.
                    Some(Extension(ShadowDecision(d))) if d.is_denied() => "hello (not counted)\n",
                    _ => "hello\n",
                }
            }),
        )
        .layer(layer);

    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
