//! An algorithm written outside the crate, on its public API only (issue #60): a token bucket
//! with whole tokens refilled on ticks, its state one `u64` word. It runs on every in-memory
//! store with the same decisions as its own sequential model, keeps its debts through
//! capacity eviction like the crate's algorithms, and limits HTTP requests through the tower
//! layer (with the `tower` feature).

use hotlimit::algo::Algorithm;
use hotlimit::{
    CasLimiter, CompactLimiter, Decision, DirectLimiter, ManualClock, MutexLimiter, Policy,
    RateLimiter,
};
use std::time::Duration;

/// `size` tokens, `per_tick` more every `tick` ns (whole ticks of the clock), at most `size`.
/// State: the tokens (high 16 bits) as of the tick in the low 48 bits.
#[derive(Debug, Clone, Copy)]
struct TickBucket {
    size: u64,
    per_tick: u64,
    tick: u64,
}

const TICK_BITS: u32 = 48;
const TICK_MASK: u64 = (1 << TICK_BITS) - 1;

impl TickBucket {
    fn new(size: u16, per_tick: u16, tick: Duration) -> Self {
        TickBucket {
            size: u64::from(size),
            per_tick: u64::from(per_tick.max(1)),
            tick: (tick.as_nanos() as u64).max(1),
        }
    }

    /// The word of `tokens` at tick `at`. The fresh word (0) reads as full: tokens are stored
    /// as what is missing from a full bucket.
    fn word(&self, tokens: u64, at: u64) -> u64 {
        (self.size - tokens.min(self.size)) << TICK_BITS | (at & TICK_MASK)
    }

    /// The tokens a word holds at tick `now_tick` (a clock read before its tick refills
    /// nothing).
    fn tokens(&self, word: u64, now_tick: u64) -> u64 {
        let missing = word >> TICK_BITS;
        let ticks = now_tick.saturating_sub(word & TICK_MASK);
        (self.size - missing)
            .saturating_add(ticks.saturating_mul(self.per_tick))
            .min(self.size)
    }

    /// The first tick at which a word holds `want` tokens.
    fn tick_with(&self, word: u64, want: u64) -> u64 {
        let (at, have) = (word & TICK_MASK, self.size - (word >> TICK_BITS));
        at + want.saturating_sub(have).div_ceil(self.per_tick)
    }
}

impl Algorithm for TickBucket {
    type State = u64;

    fn fresh(&self) -> u64 {
        0
    }

    fn capacity(&self) -> u64 {
        self.size
    }

    fn policy(&self) -> Policy {
        Policy::Leaky
    }

    fn update(&self, state: &mut u64, now: u64, cost: u64) -> Decision {
        let now_tick = (now / self.tick).min(TICK_MASK);
        let tokens = self.tokens(*state, now_tick);
        if tokens >= cost {
            *state = self.word(tokens - cost, now_tick.max(*state & TICK_MASK));
            let full_at = self.tick_with(*state, self.size) * self.tick;
            return Decision::allowed()
                .with_remaining(tokens - cost)
                .with_reset_after(Duration::from_nanos(full_at.saturating_sub(now)));
        }
        let at = self.word(tokens, now_tick.max(*state & TICK_MASK));
        let ready = self.tick_with(at, cost) * self.tick;
        Decision::denied(Duration::from_nanos(ready.saturating_sub(now))).with_remaining(tokens)
    }

    fn idle_at(&self, state: &u64) -> u64 {
        if *state >> TICK_BITS == 0 {
            return 0;
        }
        self.tick_with(*state, self.size).saturating_mul(self.tick)
    }

    /// What a key owes: the time it is full again (0: nothing).
    fn debt(&self, state: &u64, _part: usize) -> u128 {
        u128::from(self.idle_at(state))
    }

    fn debt_paid_at(&self, _part: usize, debt: u128) -> u64 {
        if debt == 0 {
            return 0;
        }
        let restored = self.restore(&|_| debt);
        self.idle_at(&restored)
    }

    /// The empty bucket that is full again at the first tick from the debt's end: at every
    /// instant no fuller than any state full by then (refills add at most `per_tick` a tick).
    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> u64 {
        let debt = u64::try_from(debt(0)).unwrap_or(u64::MAX);
        if debt == 0 {
            return 0;
        }
        let full_tick = debt.div_ceil(self.tick).min(TICK_MASK);
        let refill = self.size.div_ceil(self.per_tick);
        self.word(0, full_tick.saturating_sub(refill))
    }
}

fn bucket() -> TickBucket {
    TickBucket::new(3, 1, Duration::from_millis(100))
}

/// The same requests, on a limiter and on the algorithm's own state per key: the same
/// decisions (allowed, remaining, retry_after), request by request.
fn matches_the_model(limiter: &dyn RateLimiter<u64>, clock: &ManualClock, name: &str) {
    let algo = bucket();
    let mut model = [algo.fresh(); 4];
    let mut admitted = 0;
    for i in 0..400u64 {
        let (key, now, cost) = (i % 4, i * 17_000_000 + (i % 3) * 1_000_000, 1 + i % 2);
        clock.set(Duration::from_nanos(now));
        let want = algo.update(&mut model[key as usize], now, cost);
        let got = limiter.check_n(&key, cost).unwrap();
        assert_eq!(got.is_allowed(), want.is_allowed(), "{name}: request {i}");
        assert_eq!(got.remaining(), want.remaining(), "{name}: request {i}");
        assert_eq!(got.retry_after(), want.retry_after(), "{name}: request {i}");
        admitted += u64::from(got.is_allowed());
    }
    // Neither all nor none: the trace crosses the limit both ways.
    assert!(
        (100..400).contains(&admitted),
        "{name}: {admitted} admitted"
    );
}

#[test]
fn an_outside_algorithm_decides_alike_on_every_store() {
    let clock = ManualClock::default();
    matches_the_model(
        &CasLimiter::<u64, _, _>::with_clock(bucket(), clock.clone()),
        &clock,
        "cas",
    );
    let clock = ManualClock::default();
    matches_the_model(
        &MutexLimiter::<u64, _, _>::with_clock(bucket(), clock.clone()),
        &clock,
        "mutex",
    );
    let clock = ManualClock::default();
    matches_the_model(
        &CompactLimiter::<u64, _, _>::with_clock(bucket(), clock.clone()),
        &clock,
        "compact",
    );

    // Unkeyed: one state for every request.
    let clock = ManualClock::default();
    let direct = DirectLimiter::<TickBucket, _>::with_clock(bucket(), clock.clone());
    let algo = bucket();
    let mut model = algo.fresh();
    for i in 0..50u64 {
        let now = i * 40_000_000;
        clock.set(Duration::from_nanos(now));
        let want = algo.update(&mut model, now, 1);
        let got = direct.check(&());
        assert_eq!(
            (got.is_allowed(), got.retry_after()),
            (want.is_allowed(), want.retry_after()),
            "direct: request {i}"
        );
    }
}

/// Its debts go through the debt table: a key that spent a token, evicted by a flood of spent
/// new keys, comes back at least as limited as it left, on both bounded stores; a twin that
/// forgets evicted limits shows the flood did evict it (it comes back full).
#[test]
fn an_outside_algorithm_keeps_its_debts_through_a_flood() {
    macro_rules! flood {
        ($name:expr, $builder:expr) => {{
            for forget in [false, true] {
                let clock = ManualClock::default();
                let builder = $builder.max_keys(64).clock(clock.clone());
                let builder = if forget {
                    builder.forget_evicted_limits()
                } else {
                    builder
                };
                let limiter = builder.build().unwrap();
                // Key 0 spends one token: it owes the least, so eviction takes it first.
                assert!(limiter.check(&0).is_allowed(), "{}", $name);
                // Each spends its tokens (a newcomer may be denied by a tag collision in the
                // debt table: at most 1% through 10x, G26).
                for key in 1..=640u64 {
                    let _ = limiter.check_n(&key, 3);
                    limiter.sweep();
                }
                assert!(
                    limiter.len() <= 80,
                    "{}: {} keys held",
                    $name,
                    limiter.len()
                );
                // Three tokens only if the flood reset the key (it kept two at most).
                assert_eq!(
                    limiter.check_n(&0, 3).unwrap().is_allowed(),
                    forget,
                    "{} (forgetting: {forget})",
                    $name
                );
                clock.set(Duration::from_millis(100));
                assert!(limiter.check(&0).is_allowed(), "{}", $name);
            }
        }};
    }
    flood!("cas", CasLimiter::<u64, TickBucket>::builder(bucket()));
    flood!(
        "compact",
        CompactLimiter::<u64, TickBucket>::builder(bucket())
    );
}

#[cfg(feature = "tower")]
mod layer {
    use super::{bucket, TickBucket};
    use hotlimit::headers::{AdvertisedQuota, QuotaPolicy};
    use hotlimit::tower::{HeaderKey, RateLimitLayer};
    use hotlimit::{CasLimiter, ManualClock};
    use http::{Request, StatusCode};
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::time::Duration;
    use tower::{service_fn, Layer, ServiceExt};

    /// What the layer advertises: `size` per the time a full refill takes.
    impl AdvertisedQuota for TickBucket {
        fn advertised_quota(&self) -> Option<QuotaPolicy> {
            let refill = self.size.div_ceil(self.per_tick) * self.tick;
            Some(QuotaPolicy::new(self.size, Duration::from_nanos(refill)))
        }
    }

    /// Behind the layer: 3 requests pass, the 4th is a 429 whose Retry-After is the next
    /// tick, and a tick later one passes again.
    #[tokio::test]
    async fn an_outside_algorithm_limits_http_requests() {
        let clock = ManualClock::default();
        let limiter = Arc::new(CasLimiter::<String, TickBucket, _>::with_clock(
            bucket(),
            clock.clone(),
        ));
        let layer = RateLimitLayer::builder(limiter, HeaderKey::from_static("x-api-key")).build();
        let service = layer.layer(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(()))
        }));
        let call = |service: &_| {
            let service = Clone::clone(service);
            async move {
                let req = Request::get("/").header("x-api-key", "k").body(()).unwrap();
                ServiceExt::<Request<()>>::oneshot(service, req)
                    .await
                    .unwrap()
            }
        };
        for _ in 0..3 {
            assert_eq!(call(&service).await.status(), StatusCode::OK);
        }
        let denied = call(&service).await;
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(denied.headers()["retry-after"], "1");
        clock.set(Duration::from_millis(100));
        assert_eq!(call(&service).await.status(), StatusCode::OK);
    }
}
