//! The pure step of every algorithm, without store, clock or atomics: `Algorithm::update` on a
//! prepared state. `cargo bench --bench algorithms`.
//!
//! Two paths per algorithm: `allow` (a key with headroom, half its quota used over the last
//! half window) and `deny` (a key at its limit, leaky policy: the decision includes computing
//! the honest `retry_after`). Each iteration steps a fresh copy of the prepared state, made
//! outside the timing.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use hotlimit::algo::{
    Algorithm, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
};
use hotlimit::Rate;
use std::hint::black_box;
use std::time::Duration;

const MS: u64 = 1_000_000;

/// A state after `n` requests spread evenly over the 500 ms before `now`.
fn history<A: Algorithm>(algo: &A, n: u64, now: u64) -> A::State {
    let mut state = algo.fresh();
    for i in 0..n {
        let _ = algo.update(&mut state, now - 500 * MS + i * 500 * MS / n, 1);
    }
    state
}

/// A state whose next request at `now` is denied (reached by hammering at `now`).
fn exhausted<A: Algorithm>(algo: &A, now: u64) -> A::State
where
    A::State: Clone,
{
    let mut state = history(algo, 50, now);
    for _ in 0..1_000_000 {
        if algo.update(&mut state.clone(), now, 1).is_denied() {
            break;
        }
        let _ = algo.update(&mut state, now, 1);
    }
    state
}

fn bench<A: Algorithm>(c: &mut Criterion, name: &str, algo: A)
where
    A::State: Clone,
{
    let now = 10_000 * MS;
    let mut g = c.benchmark_group(format!("step/{name}"));
    let allow = history(&algo, 50, now);
    assert!(
        algo.update(&mut allow.clone(), now, 1).is_allowed(),
        "{name}"
    );
    // Rebuilt rather than cloned: a clone has no spare capacity, so the sliding log's push
    // would reallocate on every iteration, which a live log (amortized growth) never does.
    g.bench_function("allow", |b| {
        b.iter_batched_ref(
            || history(&algo, 50, now),
            |s| black_box(algo.update(s, black_box(now), 1)),
            BatchSize::SmallInput,
        )
    });
    let deny = exhausted(&algo, now);
    assert!(algo.update(&mut deny.clone(), now, 1).is_denied(), "{name}");
    g.bench_function("deny", |b| {
        b.iter_batched_ref(
            || deny.clone(),
            |s| black_box(algo.update(s, black_box(now), 1)),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn algorithms(c: &mut Criterion) {
    let second = Duration::from_secs(1);
    bench(c, "gcra", "100/s".parse::<Gcra>().unwrap());
    let limit = Rate::new(100.0, Duration::from_secs(1)).unwrap();
    bench(
        c,
        "earrrl",
        Earrrl::new(Duration::from_millis(100), limit).unwrap(),
    );
    bench(c, "exponential", Exponential::new(100.0, second).unwrap());
    bench(c, "fixed-window", FixedWindow::new(100, second).unwrap());
    bench(
        c,
        "sliding-window",
        SlidingWindow::new(100, second).unwrap(),
    );
    bench(c, "sliding-log", SlidingLog::new(100, second).unwrap());
    bench(c, "sub-window", SubWindow::new(100, second, 60).unwrap());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30);
    targets = algorithms
}
criterion_main!(benches);
