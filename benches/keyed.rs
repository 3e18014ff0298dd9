//! Keyed GCRA `check`: hotlimit CAS (and its `check_batch`, 64 keys a call), its mutex
//! twin, the compact store (`CompactLimiter`, sized for the scenario's keys) and a sharded
//! `Mutex<HashMap>`, each on the exact TSC clock (`QuantaClock`) and on a 1 ms `CoarseClock`;
//! governor's keyed limiter on its default clock and on its quanta upkeep clock (1 ms); and
//! the floor of any papaya-based design (a bare papaya `get` + CAS on the value, pinned per op
//! and per batch) — all in one group per scenario, so the report compares them in one run.
//!
//! `cargo bench --bench keyed`. Scenarios: 1 key; 10k and 1M keys, uniform and zipf(1.0); 1
//! and 2 threads. Every variant reads the same pre-generated key sequence. The quota admits
//! everything, so every request takes the write path (a CAS or a locked store).

mod common;

use common::gcra;
use common::sharded::ShardedLimiter;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use governor::clock::QuantaUpkeepClock;
use governor::{Quota, RateLimiter as Governor};
use hotlimit::RateLimiter;
use hotlimit::{
    algo::Gcra, CasLimiter, Clock, CoarseClock, CompactLimiter, MutexLimiter, QuantaClock,
};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use rand_distr::Zipf;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Requests per call of a batch closure (`*-check_batch` and `*-pinned-batch` rows).
const BATCH: u64 = 64;
/// Pre-generated keys per thread, read in a cycle.
const SEQ: usize = 1 << 20;

#[derive(Clone, Copy)]
enum Dist {
    Uniform,
    Zipf,
}

fn key_sequence(keys: u64, dist: Dist, seed: u64) -> Vec<u64> {
    let mut rng = SmallRng::seed_from_u64(seed);
    match dist {
        Dist::Uniform => (0..SEQ).map(|_| rng.random_range(0..keys)).collect(),
        Dist::Zipf => {
            let zipf = Zipf::new(keys as f64, 1.0).unwrap();
            (0..SEQ).map(|_| rng.sample(zipf) as u64 - 1).collect()
        }
    }
}

/// Runs `iters` requests on each of `threads` threads, each thread walking its own key
/// sequence; `batch(keys, from, n)` runs `n` requests starting at `from`. Returns the wall
/// time from the common start to the last thread's end.
fn run_threads(
    threads: usize,
    iters: u64,
    seqs: &[Vec<u64>],
    batch: &(dyn Fn(&[u64], usize, u64) + Sync),
) -> Duration {
    let start = Barrier::new(threads);
    let t0 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (start, seq) = (&start, &seqs[t]);
                s.spawn(move || {
                    start.wait();
                    let t0 = Instant::now();
                    let mut done = 0;
                    while done < iters {
                        let n = BATCH.min(iters - done);
                        batch(seq, (done as usize) % SEQ, n);
                        done += n;
                    }
                    t0
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).min().unwrap()
    });
    t0.elapsed()
}

/// `n` keys of `seq` from `from`, cycling (`SEQ` is a power of two).
fn keys(seq: &[u64], from: usize, n: u64) -> impl Iterator<Item = &u64> {
    (from..from + n as usize).map(move |i| &seq[i & (SEQ - 1)])
}

/// The hotlimit variants on one clock.
struct Hot<C: Clock> {
    cas: CasLimiter<u64, Gcra, C>,
    mutex: MutexLimiter<u64, Gcra, C>,
    sharded: ShardedLimiter<u64, Gcra, C>,
    compact: CompactLimiter<u64, Gcra, C>,
}

impl<C: Clock + Clone> Hot<C> {
    fn new(keys_n: u64, clock: C) -> Self {
        let hot = Self {
            cas: CasLimiter::with_clock(gcra(), clock.clone()),
            mutex: MutexLimiter::with_clock(gcra(), clock.clone()),
            sharded: ShardedLimiter::with_clock(gcra(), clock.clone()),
            compact: CompactLimiter::builder(gcra())
                .max_keys(keys_n as usize)
                .clock(clock)
                .build()
                .unwrap(),
        };
        for k in 0..keys_n {
            let _ = hot.cas.check(&k);
            let _ = hot.mutex.check(&k);
            let _ = hot.sharded.check(&k);
            let _ = hot.compact.check(&k);
        }
        hot
    }

    /// Registers this set's rows, named `<variant><suffix>`.
    fn rows(
        &self,
        suffix: &str,
        bench: &mut impl FnMut(&str, &(dyn Fn(&[u64], usize, u64) + Sync)),
    ) {
        bench(&format!("cas{suffix}"), &|s, from, n| {
            keys(s, from, n).for_each(|k| {
                let _ = black_box(self.cas.check(k));
            })
        });
        bench(&format!("mutex{suffix}"), &|s, from, n| {
            keys(s, from, n).for_each(|k| {
                let _ = black_box(self.mutex.check(k));
            })
        });
        bench(&format!("compact{suffix}"), &|s, from, n| {
            keys(s, from, n).for_each(|k| {
                let _ = black_box(self.compact.check(k));
            })
        });
        // The same keys through `check_batch`, a call per batch of up to 64.
        bench(&format!("cas{suffix}-check_batch"), &|s, from, n| {
            let mut out = Vec::with_capacity(BATCH as usize);
            self.cas.check_batch(keys(s, from, n), &mut out);
            black_box(&out);
        });
        bench(&format!("compact{suffix}-check_batch"), &|s, from, n| {
            let mut out = Vec::with_capacity(BATCH as usize);
            self.compact.check_batch(keys(s, from, n), &mut out);
            black_box(&out);
        });
        bench(&format!("sharded-mutex{suffix}"), &|s, from, n| {
            keys(s, from, n).for_each(|k| {
                let _ = black_box(self.sharded.check(k));
            })
        });
    }
}

/// The clocks shared by every scenario: one ticker thread each.
/// The OS monotonic clock (`Instant`: `clock_gettime(CLOCK_MONOTONIC)`, a fenced read), a
/// `Clock` of the bench's own.
#[derive(Clone)]
struct OsClock(Instant);

impl Clock for OsClock {
    #[inline]
    fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

struct Clocks {
    coarse: CoarseClock,
    upkeep: QuantaUpkeepClock,
}

fn scenario(c: &mut Criterion, keys_n: u64, dist: Dist, dist_name: &str, clocks: &Clocks) {
    let exact = Hot::new(keys_n, QuantaClock::default());
    let cached = Hot::new(keys_n, clocks.coarse.clone());
    // The OS monotonic clock, which the default clock reads where the kernel does not keep
    // time by the TSC: what that choice costs, on one key and among 1M keys, where its fence
    // keeps the next check's misses from starting early (BENCHMARKS.md, "The default clock").
    let os =
        (keys_n == 1 || keys_n == 1_000_000).then(|| Hot::new(keys_n, OsClock(Instant::now())));
    let max = NonZeroU32::MAX;
    let quota = Quota::per_second(max).allow_burst(max);
    let governor = Governor::keyed(quota);
    let governor_upkeep = Governor::dashmap_with_clock(quota, clocks.upkeep.clone());
    let papaya = papaya::HashMap::builder()
        .hasher(ahash::RandomState::new())
        .build();
    for k in 0..keys_n {
        let _ = governor.check_key(&k);
        let _ = governor_upkeep.check_key(&k);
        papaya.pin().insert(k, AtomicU64::new(0));
    }
    let seqs: Vec<Vec<u64>> = (0..2).map(|t| key_sequence(keys_n, dist, t + 1)).collect();
    // A GCRA-like CAS on the value: load, compute, compare_exchange.
    let bare_cas = |v: &AtomicU64| {
        let cur = v.load(Ordering::Acquire);
        let _ = v.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire);
    };
    for threads in [1usize, 2] {
        let mut g = c.benchmark_group(format!("keyed/{keys_n}keys-{dist_name}/{threads}t"));
        g.throughput(Throughput::Elements(threads as u64));
        let mut bench = |name: &str, batch: &(dyn Fn(&[u64], usize, u64) + Sync)| {
            g.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter_custom(|iters| run_threads(threads, iters, &seqs, batch))
            });
        };
        exact.rows("", &mut bench);
        cached.rows("-coarse", &mut bench);
        if let Some(os) = &os {
            os.rows("-osclock", &mut bench);
        }
        bench("governor", &|s, from, n| {
            keys(s, from, n).for_each(|k| {
                let _ = black_box(governor.check_key(k));
            })
        });
        bench("governor-upkeep", &|s, from, n| {
            keys(s, from, n).for_each(|k| {
                let _ = black_box(governor_upkeep.check_key(k));
            })
        });
        bench("papaya-get-cas", &|s, from, n| {
            keys(s, from, n).for_each(|k| {
                if let Some(v) = papaya.pin().get(k) {
                    bare_cas(v);
                }
            })
        });
        bench("papaya-get-cas-pinned-batch", &|s, from, n| {
            let guard = papaya.guard();
            keys(s, from, n).for_each(|k| {
                if let Some(v) = papaya.get(k, &guard) {
                    bare_cas(v);
                }
            })
        });
        g.finish();
    }
}

fn keyed(c: &mut Criterion) {
    let clocks = Clocks {
        coarse: CoarseClock::new(Duration::from_millis(1)).unwrap(),
        // quanta's process-wide upkeep thread (one per process), for governor.
        upkeep: QuantaUpkeepClock::from_interval(Duration::from_millis(1)).unwrap(),
    };
    scenario(c, 1, Dist::Uniform, "uniform", &clocks);
    for keys_n in [10_000, 1_000_000] {
        scenario(c, keys_n, Dist::Uniform, "uniform", &clocks);
        scenario(c, keys_n, Dist::Zipf, "zipf1", &clocks);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = keyed
}
criterion_main!(benches);
