//! `HybridLimiter::check` against `CasLimiter::check`, same algorithm, same quota, same key
//! sequence, same sitting: GCRA (leases), fixed window, EARRRL, sliding window and
//! exponential (merged states), 1 key and 10k keys, one thread. The quota admits everything, so every check takes the write
//! path; the hybrid's sync thread runs meanwhile (10 ms interval) against a `redis-server`
//! of the bench's own. The merged algorithms also with a peer instance publishing a live
//! state for every key (`hybrid-with-peer`), so each check merges it. After each hybrid row
//! it prints what the sync cost: script calls per key per interval, and the denials.
//!
//! `cargo bench --features redis --bench hybrid`. Without `redis-server` on the PATH it
//! prints why and measures nothing.

#[path = "../tests/redis_server/mod.rs"]
mod redis_server;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hotlimit::algo::{Earrrl, Exponential, FixedWindow, Gcra, SlidingWindow};
use hotlimit::redis::{HybridAlgorithm, HybridLimiter};
use hotlimit::RateLimiter;
use hotlimit::{CasLimiter, Rate};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SEQ: usize = 1 << 16;

fn keys(n: usize) -> (Vec<String>, Vec<usize>) {
    let names = (0..n).map(|i| format!("client-{i}")).collect();
    let mut rng = SmallRng::seed_from_u64(7);
    (names, (0..SEQ).map(|_| rng.random_range(0..n)).collect())
}

fn pair<A>(c: &mut Criterion, url: &str, name: &str, algo: A)
where
    A: HybridAlgorithm + Copy,
{
    for n in [1, 10_000] {
        let (names, seq) = keys(n);
        let mut g = c.benchmark_group(format!("hybrid/{name}/{n}-keys"));
        g.throughput(Throughput::Elements(1));
        let cas = CasLimiter::<String, A>::new(algo);
        let build = |prefix: String| {
            HybridLimiter::builder(url, algo)
                .redis(|r| r.key_prefix(prefix))
                .build()
                .expect("connect")
        };
        let mut rows = vec![("hybrid", build(format!("bench:{name}:{n}:")))];
        // The merged algorithms also with a peer: another instance (a thread here) checks
        // every key every 50 ms and publishes, so each check merges a live state (GCRA's
        // lease has no such work).
        let stop = Arc::new(AtomicBool::new(false));
        let peer = (name != "gcra").then(|| {
            let prefix = format!("bench:{name}:{n}:peer:");
            let peer = build(prefix.clone());
            rows.push(("hybrid-with-peer", build(prefix)));
            let (names, stop) = (names.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for k in &names {
                        let _ = peer.check(k);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        });
        // Every key known before timing: a key's first request is the fallback's, and its
        // first sync brings the lease or the others' states.
        std::thread::sleep(Duration::from_millis(100));
        for k in &names {
            let _ = hotlimit::RateLimiter::check(&cas, k);
            for (_, l) in &rows {
                let _ = l.check(k);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut i = 0;
        g.bench_function("cas", |b| {
            b.iter(|| {
                i = (i + 1) % SEQ;
                black_box(hotlimit::RateLimiter::check(&cas, &names[seq[i]]))
            })
        });
        for (label, hybrid) in &rows {
            let before = hybrid.stats();
            let (mut checks, mut denied) = (0u64, 0u64);
            g.bench_function(*label, |b| {
                b.iter(|| {
                    i = (i + 1) % SEQ;
                    let d = hybrid.check(&names[seq[i]]);
                    checks += 1;
                    denied += d.is_denied() as u64;
                    black_box(d)
                })
            });
            let after = hybrid.stats();
            let (calls, ticks) = (after.calls - before.calls, after.ticks - before.ticks);
            if checks == 0 {
                continue; // filtered out
            }
            println!(
                "hybrid/{name}/{n}-keys/{label}: {calls} script calls in {ticks} intervals for {n} keys: {:.3} per key per interval; {} round trips; {checks} checks, {denied} denied, {} by the fallback; errors {}",
                calls as f64 / (ticks.max(1) * n as u64) as f64,
                after.round_trips - before.round_trips,
                after.degraded - before.degraded,
                after.errors + after.failed_calls,
            );
        }
        g.finish();
        stop.store(true, Ordering::Relaxed);
        if let Some(p) = peer {
            p.join().unwrap();
        }
    }
}

fn benches(c: &mut Criterion) {
    let Some(server) = redis_server::Server::start() else {
        return;
    };
    let url = server.url();
    // The largest burst the hybrid limiter counts (2^29 - 1 units): leases never run dry.
    let gcra: Gcra = "1000000000/s burst 536870911".parse().unwrap();
    pair(c, &url, "gcra", gcra);
    let fixed = FixedWindow::new((1 << 28) - 1, Duration::from_secs(1)).unwrap();
    pair(c, &url, "fixed-window", fixed);
    // 10^8/s: above what one thread sends one key, low enough that the peer's 20/s per key
    // stays above the idle threshold (10^-9 of it), so its state is merged, not dropped.
    let earrrl = Earrrl::new(
        Duration::from_secs(1),
        Rate::new(1e8, Duration::from_secs(1)).unwrap(),
    )
    .unwrap();
    pair(c, &url, "earrrl", earrrl);
    // Two 128-bit words per key: behind the core's per-key lock in the hybrid.
    let sliding = SlidingWindow::new(u32::MAX as u64 - 2, Duration::from_secs(1)).unwrap();
    pair(c, &url, "sliding-window", sliding);
    let exponential = Exponential::new(1e12, Duration::from_secs(1)).unwrap();
    pair(c, &url, "exponential", exponential);
    // Every limiter above has stopped (after its last sync) before the server goes.
    drop(server);
}

criterion_group! {
    name = hybrid;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = benches
}
criterion_main!(hybrid);
