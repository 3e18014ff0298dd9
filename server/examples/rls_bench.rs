//! Load for a rate limit service: `ShouldRateLimit` calls over gRPC from N concurrent streams
//! for a fixed time, each a descriptor `(user, <one of K values>)` in a domain; prints calls per
//! second, the latency percentiles and the answers. Any Envoy RLS v3 server: hotlimit-server,
//! Limitador, envoyproxy/ratelimit.
//!
//! ```text
//! cargo run --release --example rls_bench -- --target 127.0.0.1:8081 --streams 64 --secs 10
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use hdrhistogram::Histogram;
use tonic::transport::Channel;

#[derive(Parser)]
struct Args {
    /// The service's gRPC address.
    #[arg(long, default_value = "127.0.0.1:8081")]
    target: String,
    /// Concurrent requests in flight.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// HTTP/2 connections the streams share (round robin).
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Seconds measured, after one second of warm-up.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// The domain.
    #[arg(long, default_value = "bench")]
    domain: String,
    /// Distinct descriptor values (`user` = 0..K).
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
}

/// One stream's tally: latencies (µs), OK and OVER_LIMIT answers, errors.
struct Tally {
    hist: Histogram<u64>,
    ok: u64,
    over: u64,
    errors: u64,
}

async fn stream(
    mut client: RateLimitServiceClient<Channel>,
    args: &Args,
    seed: u64,
    start: Instant,
    end: Instant,
) -> Tally {
    let mut t = Tally {
        hist: Histogram::new(3).expect("a histogram"),
        ok: 0,
        over: 0,
        errors: 0,
    };
    let mut x = seed | 1;
    loop {
        let sent = Instant::now();
        if sent >= end {
            return t;
        }
        // xorshift: the next key, without a lock or a shared generator.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let request = RateLimitRequest {
            domain: args.domain.clone(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: (x % args.keys).to_string(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        let answer = client.should_rate_limit(request).await;
        if sent < start {
            continue; // warm-up
        }
        let micros = sent.elapsed().as_micros() as u64;
        t.hist.record(micros.max(1)).expect("in range");
        match answer {
            Ok(r) if r.get_ref().overall_code == 1 => t.ok += 1,
            Ok(_) => t.over += 1,
            Err(_) => t.errors += 1,
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: &'static Args = Box::leak(Box::new(Args::parse()));
    let mut channels = Vec::new();
    for _ in 0..args.connections.max(1) {
        channels.push(
            Channel::from_shared(format!("http://{}", args.target))?
                .connect()
                .await?,
        );
    }
    let start = Instant::now() + Duration::from_secs(1);
    let end = start + Duration::from_secs(args.secs);
    let tasks: Vec<_> = (0..args.streams)
        .map(|i| {
            let client = RateLimitServiceClient::new(channels[i % channels.len()].clone());
            tokio::spawn(stream(
                client,
                args,
                0x9E37_79B9_7F4A_7C15 ^ ((i as u64 + 1) * 0xBF58_476D_1CE4_E5B9),
                start,
                end,
            ))
        })
        .collect();
    let mut all = Tally {
        hist: Histogram::new(3)?,
        ok: 0,
        over: 0,
        errors: 0,
    };
    for task in tasks {
        let t = task.await?;
        all.hist.add(&t.hist)?;
        all.ok += t.ok;
        all.over += t.over;
        all.errors += t.errors;
    }
    let calls = all.hist.len();
    println!(
        "streams={} connections={} calls={} calls/s={:.0} p50={}us p99={}us p99.9={}us ok={} over_limit={} errors={}",
        args.streams,
        args.connections,
        calls,
        calls as f64 / args.secs as f64,
        all.hist.value_at_quantile(0.5),
        all.hist.value_at_quantile(0.99),
        all.hist.value_at_quantile(0.999),
        all.ok,
        all.over,
        all.errors
    );
    Ok(())
}
