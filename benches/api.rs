//! What the API beyond `check` costs on the hot path, against a plain `check` in the same
//! group: decision counting (`Builder::metrics`), a reconfigurable algorithm (`Live`), two
//! quotas in one cell (`AllOf`), `peek`, a quota given with each request (`check_n_with`, the
//! limiter's own and another plan) and a provisional cost settled afterwards (`take` then
//! `settle` with another count: two CAS steps, against `check_n` of the same cost).
//!
//! `cargo bench --bench api`. One thread; 1 key (the cell stays in L1) and 10k uniform keys
//! (in L2). The quotas admit everything, so every check takes the write path (a CAS).

mod common;

use common::gcra;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{
    algo::{AllOf, Gcra},
    CasLimiter, Live,
};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::hint::black_box;

fn api(c: &mut Criterion) {
    for keys in [1u64, 10_000] {
        let mut rng = SmallRng::seed_from_u64(7);
        let seq: Vec<u64> = (0..1 << 16).map(|_| rng.random_range(0..keys)).collect();
        let mut g = c.benchmark_group(format!("api/{keys}-keys"));
        g.throughput(Throughput::Elements(1));
        let mut bench = |name: &str, f: &dyn Fn(&u64) -> bool| {
            let mut i = 0usize;
            g.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter(|| {
                    i = (i + 1) & (seq.len() - 1);
                    black_box(f(&seq[i]))
                })
            });
        };

        let plain = CasLimiter::<u64, _>::new(gcra());
        bench("check", &|k| plain.check(k).is_allowed());

        let counted = CasLimiter::<u64, Gcra>::builder(gcra())
            .metrics(true)
            .build()
            .unwrap();
        bench("check+metrics", &|k| counted.check(k).is_allowed());

        let live = CasLimiter::<u64, _>::new(Live::new(gcra()));
        bench("check-live", &|k| live.check(k).is_allowed());

        let both = CasLimiter::<u64, _>::new(AllOf::new(gcra(), gcra()));
        bench("check-all-of-2", &|k| both.check(k).is_allowed());

        bench("peek", &|k| plain.request(k).peek().unwrap().is_allowed());

        let own = gcra();
        bench("check-with-own-quota", &|k| {
            plain
                .request(k)
                .quota(&own)
                .check()
                .is_ok_and(|d| d.is_allowed())
        });
        let other = gcra()
            .with_burst(hotlimit::algo::Algorithm::capacity(&own) * 2)
            .unwrap();
        bench("check-with-other-plan", &|k| {
            plain
                .request(k)
                .quota(&other)
                .check()
                .is_ok_and(|d| d.is_allowed())
        });

        bench("check_n-2", &|k| {
            plain.check_n(k, 2).is_ok_and(|d| d.is_allowed())
        });
        bench("take-2+settle-1", &|k| {
            let mut t = plain.request(k).cost(2).take().unwrap();
            plain.request(k).settle(&mut t, 1).unwrap()
        });
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = api
}
criterion_main!(benches);
