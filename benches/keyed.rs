//! Keyed GCRA `check`: hotlimit CAS vs its mutex twin vs a sharded `Mutex<HashMap>`, beside the
//! floor of any papaya-based design, a bare papaya `get` + `fetch_add` — all in one group, so the
//! report compares them in one run.
//!
//! `cargo bench --bench keyed`. Rows: 1 key and 1M keys (uniform), 1 and 2 threads. The quota
//! admits everything, so every request takes the write path (a CAS or a locked store).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hotlimit::{algo::Gcra, CasLimiter, MutexLimiter, QuantaClock, ShardedLimiter};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A quota no benchmark exhausts: 1 event per ns with a burst of 2^40.
fn gcra() -> Gcra {
    "1000000000/s burst 1099511627776".parse().unwrap()
}

/// xorshift64*: a cheap key sequence, the same cost for every variant.
#[inline]
fn next_key(state: &mut u64, keys: u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d) % keys
}

/// Runs `iters` calls of `op` on each of `threads` threads; returns the wall time.
fn run_threads(threads: usize, iters: u64, keys: u64, op: &(impl Fn(u64) + Sync)) -> Duration {
    let start = std::sync::Barrier::new(threads);
    let t0 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let start = &start;
                s.spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1);
                    start.wait();
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        op(next_key(&mut rng, keys));
                    }
                    t0
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).min().unwrap()
    });
    t0.elapsed()
}

fn keyed(c: &mut Criterion) {
    for keys in [1u64, 1_000_000] {
        let cas = CasLimiter::<u64, Gcra, QuantaClock>::new(gcra());
        let mutex = MutexLimiter::<u64, Gcra, QuantaClock>::new(gcra());
        let sharded = ShardedLimiter::<u64, Gcra, QuantaClock>::new(gcra());
        let papaya = papaya::HashMap::builder()
            .hasher(ahash::RandomState::new())
            .build();
        for k in 0..keys {
            cas.check(&k);
            mutex.check(&k);
            sharded.check(&k);
            papaya.pin().insert(k, AtomicU64::new(0));
        }
        for threads in [1usize, 2] {
            let mut g = c.benchmark_group(format!("keyed/{keys}keys/{threads}t"));
            g.throughput(Throughput::Elements(threads as u64));
            let mut bench = |name: &str, op: &(dyn Fn(u64) + Sync)| {
                g.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter_custom(|iters| run_threads(threads, iters, keys, &op))
                });
            };
            bench("cas", &|k| {
                black_box(cas.check(&k));
            });
            bench("mutex", &|k| {
                black_box(mutex.check(&k));
            });
            bench("sharded-mutex", &|k| {
                black_box(sharded.check(&k));
            });
            bench("papaya-get-fetch_add", &|k| {
                let guard = papaya.guard();
                if let Some(v) = papaya.get(&k, &guard) {
                    black_box(v.fetch_add(1, Ordering::AcqRel));
                }
            });
            g.finish();
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = keyed
}
criterion_main!(benches);
