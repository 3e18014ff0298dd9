//! One hot key under 1..4 threads: hotlimit CAS vs its mutex twin (keyed, and the unkeyed
//! direct limiter) and governor's keyed limiter, GCRA admitting everything so every request
//! writes. After each group the CAS rows' retries per request are printed (criterion has no
//! column for them).
//!
//! `cargo bench --bench contention`. On a 2-core machine 3 and 4 threads oversubscribe the
//! cores: that is where a lock holder preempted mid-section hurts the mutex most.
//! `HOTLIMIT_BENCH_THREADS=1,2,4,8,16` sets the thread counts (for a machine with more cores).

mod common;

use common::gcra;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use governor::{Quota, RateLimiter as Governor};
use hotlimit::RateLimiter;
use hotlimit::{algo::Gcra, store::Locked, CasLimiter, DirectLimiter, MutexLimiter, QuantaClock};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// `iters` calls of `op` on each of `threads` threads; wall time from the common start.
fn run(threads: usize, iters: u64, op: &(dyn Fn() + Sync)) -> Duration {
    let start = Barrier::new(threads);
    let t0 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        op();
                    }
                    t0
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).min().unwrap()
    });
    t0.elapsed()
}

/// `HOTLIMIT_BENCH_THREADS` (comma-separated counts), else 1 to 4.
fn thread_counts() -> Vec<usize> {
    match std::env::var("HOTLIMIT_BENCH_THREADS") {
        Ok(list) => list
            .split(',')
            .map(|n| {
                n.trim()
                    .parse()
                    .expect("HOTLIMIT_BENCH_THREADS: counts like 1,2,4")
            })
            .collect(),
        Err(_) => (1..=4).collect(),
    }
}

fn contention(c: &mut Criterion) {
    // governor admitting everything as `gcra()` does: its largest quota.
    let max = std::num::NonZeroU32::MAX;
    let quota = Quota::per_second(max).allow_burst(max);
    for threads in thread_counts() {
        let governor = Governor::keyed(quota);
        let keyed_cas = CasLimiter::<u64, Gcra, QuantaClock>::new(gcra());
        let keyed_mutex = MutexLimiter::<u64, Gcra, QuantaClock>::new(gcra());
        let direct_cas = DirectLimiter::<Gcra, QuantaClock>::new(gcra());
        let direct_mutex = DirectLimiter::<Gcra, QuantaClock, Locked>::new(gcra());
        let (keyed_ops, direct_ops) = (AtomicU64::new(0), AtomicU64::new(0));
        let mut g = c.benchmark_group(format!("contention/{threads}t"));
        g.throughput(Throughput::Elements(threads as u64));
        let mut bench = |name: &str, ops: Option<&AtomicU64>, op: &(dyn Fn() + Sync)| {
            g.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter_custom(|iters| {
                    if let Some(ops) = ops {
                        ops.fetch_add(iters * threads as u64, Ordering::Relaxed);
                    }
                    run(threads, iters, op)
                })
            });
        };
        bench("keyed-cas", Some(&keyed_ops), &|| {
            let _ = black_box(keyed_cas.check(&7));
        });
        bench("keyed-mutex", None, &|| {
            let _ = black_box(keyed_mutex.check(&7));
        });
        bench("governor", None, &|| {
            let _ = black_box(governor.check_key(&7u64));
        });
        bench("direct-cas", Some(&direct_ops), &|| {
            let _ = black_box(direct_cas.check(&()));
        });
        bench("direct-mutex", None, &|| {
            let _ = black_box(direct_mutex.check(&()));
        });
        g.finish();
        // Warm-up and measurement together: every request the CAS rows made.
        let per_op = |retries: u64, ops: &AtomicU64| {
            retries as f64 / ops.load(Ordering::Relaxed).max(1) as f64
        };
        eprintln!(
            "contention/{threads}t retries per request: keyed-cas {:.3}, direct-cas {:.3}",
            per_op(keyed_cas.metrics().cas_retries, &keyed_ops),
            per_op(direct_cas.metrics().cas_retries, &direct_ops),
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = contention
}
criterion_main!(benches);
