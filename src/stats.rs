//! CAS retry statistics, counted only where a retry happens so that counting never becomes
//! the hot spot it measures.

use crossbeam_utils::CachePadded;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Stripes: enough that a few dozen threads rarely share one.
const STRIPES: usize = 32;

#[derive(Default)]
struct Stripe {
    retries: AtomicU64,
    allowed: AtomicU64,
    denied: AtomicU64,
}

/// Striped retry counters; each thread writes the stripe its id maps to.
pub struct Stats {
    stripes: Box<[CachePadded<Stripe>]>,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| CachePadded::default()).collect(),
        }
    }
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stats")
            .field("retries", &self.retries())
            .finish_non_exhaustive()
    }
}

fn stripe_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|i| {
        if i.get() == usize::MAX {
            i.set(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
        }
        i.get()
    })
}

impl Stats {
    /// Records one failed CAS. Striped by thread, so contended keys do not also contend on
    /// the counter.
    #[cold]
    pub(crate) fn retry(&self) {
        self.stripes[stripe_index()]
            .retries
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one decision, on this thread's stripe.
    #[inline]
    pub(crate) fn decided(&self, allowed: bool) {
        let stripe = &self.stripes[stripe_index()];
        let counter = if allowed {
            &stripe.allowed
        } else {
            &stripe.denied
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Allowed and denied decisions counted so far.
    pub(crate) fn decisions(&self) -> (u64, u64) {
        self.stripes.iter().fold((0, 0), |(a, d), s| {
            (
                a + s.allowed.load(Ordering::Relaxed),
                d + s.denied.load(Ordering::Relaxed),
            )
        })
    }

    /// CAS retries so far.
    pub(crate) fn retries(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.retries.load(Ordering::Relaxed))
            .sum()
    }
}

/// What a limiter has done so far: a snapshot of its counters, cheap to take (a few dozen
/// loads), for dashboards and exporters.
///
/// `allowed` and `denied` are counted only when asked for (`Builder::metrics(true)`),
/// because counting costs a `fetch_add` per request (on a
/// per-thread stripe, so threads do not contend on it); otherwise they stay 0. Every other
/// field is always kept. Counts are exact: with counting on, `allowed + denied` is the number
/// of decisions returned (checks and reservations; peeks are not counted).
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, ManualClock, RateLimiter};
///
/// let limiter = CasLimiter::<u64, Gcra, _>::builder("10/s burst 2".parse()?)
///     .clock(ManualClock::default())
///     .metrics(true)
///     .build()?;
/// let allowed = [1, 1, 1, 2].map(|key| limiter.check(&key).is_allowed());
/// assert_eq!(allowed, [true, true, false, true]);
/// let m = limiter.metrics();
/// assert_eq!((m.allowed, m.denied, m.keys), (3, 1, 2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// Requests allowed (when counting is on).
    pub allowed: u64,
    /// Requests denied (when counting is on).
    pub denied: u64,
    /// CAS attempts that lost a race and were retried (always 0 for the [`Locked`] variant).
    ///
    /// A retry is a CAS that lost a race: another thread changed the word between this
    /// request's load and its CAS, so the algorithm re-ran on the winner's word. Retries are
    /// counted on the slow path only: counting every attempt would put a shared-line
    /// `fetch_add` on every request (measured when the counters were written; the sitting is
    /// in `BENCHMARKS.md`'s git history). The CAS attempts of `n` requests are therefore `writes + retries`, where
    /// writes are the allowed requests plus, under the strict policy, the denied ones (a leaky
    /// denial writes nothing).
    ///
    /// [`Locked`]: crate::store::Locked
    pub cas_retries: u64,
    /// Sweeps run so far, by hand or in the background (and capacity passes run by
    /// requests that outran the sweeper).
    pub sweeps: u64,
    /// Keys looked at by the sweeps.
    pub scanned: u64,
    /// Keys dropped as idle (lossless: their state was a fresh key's).
    pub evicted_idle: u64,
    /// Keys dropped to enforce `max_keys` (the compact store's also count keys evicted by
    /// inserts that found their probe window full).
    pub evicted_capacity: u64,
    /// Keys evicted for capacity while they still owed, whose debt was kept.
    pub debts_kept: u64,
    /// Keys inserted with a kept debt: they started from it, not fresh.
    pub debts_restored: u64,
    /// The most capacity passes ever running at once: 1 (or 0 before the first), since a
    /// pass never starts while another runs.
    pub most_passes_at_once: u64,
    /// Time spent sweeping.
    pub sweep_busy: Duration,
    /// Keys held now.
    pub keys: u64,
}

impl Metrics {
    /// `sweep`'s sweep fields with the decisions and retries of `stats` and `keys`.
    pub(crate) fn new(stats: &Stats, sweep: Metrics, keys: usize) -> Self {
        let (allowed, denied) = stats.decisions();
        Self {
            allowed,
            denied,
            cas_retries: stats.retries(),
            keys: keys as u64,
            ..sweep
        }
    }

    /// Publishes this snapshot through the [`metrics`](https://docs.rs/metrics) facade, each
    /// value labelled `limiter = name`: counters `hotlimit_allowed_total`,
    /// `hotlimit_denied_total`, `hotlimit_cas_retries_total`, `hotlimit_sweeps_total`,
    /// `hotlimit_evicted_total` (label `reason = idle|capacity`), and the gauge `hotlimit_keys`.
    /// Counters are set to their absolute values, so call it as often as the exporter scrapes
    /// (from the sweeper's schedule, say); the hot path never touches the facade.
    #[cfg(feature = "metrics")]
    pub fn publish(&self, name: &'static str) {
        use metrics::{counter, gauge};
        counter!("hotlimit_allowed_total", "limiter" => name).absolute(self.allowed);
        counter!("hotlimit_denied_total", "limiter" => name).absolute(self.denied);
        counter!("hotlimit_cas_retries_total", "limiter" => name).absolute(self.cas_retries);
        counter!("hotlimit_sweeps_total", "limiter" => name).absolute(self.sweeps);
        counter!("hotlimit_evicted_total", "limiter" => name, "reason" => "idle")
            .absolute(self.evicted_idle);
        counter!("hotlimit_evicted_total", "limiter" => name, "reason" => "capacity")
            .absolute(self.evicted_capacity);
        gauge!("hotlimit_keys", "limiter" => name).set(self.keys as f64);
    }
}

#[cfg(all(test, feature = "metrics"))]
mod metrics_tests {
    use super::Metrics;
    use metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder,
        SharedString, Unit,
    };
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    /// Records the last value each key was set to, as `name{label=value,...}`.
    #[derive(Default, Clone)]
    struct Last(Arc<Mutex<BTreeMap<String, f64>>>);

    struct Handle(Last, String);

    impl CounterFn for Handle {
        fn increment(&self, _: u64) {
            unreachable!("publish sets absolute values")
        }
        fn absolute(&self, value: u64) {
            self.0
                 .0
                .lock()
                .unwrap()
                .insert(self.1.clone(), value as f64);
        }
    }

    impl GaugeFn for Handle {
        fn increment(&self, _: f64) {}
        fn decrement(&self, _: f64) {}
        fn set(&self, value: f64) {
            self.0 .0.lock().unwrap().insert(self.1.clone(), value);
        }
    }

    fn name(key: &Key) -> String {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        format!("{}{{{}}}", key.name(), labels.join(","))
    }

    impl Recorder for Last {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(Arc::new(Handle(self.clone(), name(key))))
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(Arc::new(Handle(self.clone(), name(key))))
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    // Pins G34.
    #[test]
    fn publish_sets_every_value_under_the_limiter_label() {
        let m = Metrics {
            allowed: 7,
            denied: 3,
            cas_retries: 2,
            sweeps: 1,
            evicted_idle: 5,
            evicted_capacity: 4,
            keys: 9,
            ..Metrics::default()
        };
        let recorder = Last::default();
        metrics::with_local_recorder(&recorder, || m.publish("api"));
        let got = recorder.0.lock().unwrap().clone();
        let want: BTreeMap<String, f64> = [
            ("hotlimit_allowed_total{limiter=api}", 7.0),
            ("hotlimit_denied_total{limiter=api}", 3.0),
            ("hotlimit_cas_retries_total{limiter=api}", 2.0),
            ("hotlimit_sweeps_total{limiter=api}", 1.0),
            ("hotlimit_evicted_total{limiter=api,reason=idle}", 5.0),
            ("hotlimit_evicted_total{limiter=api,reason=capacity}", 4.0),
            ("hotlimit_keys{limiter=api}", 9.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(got, want);
    }
}

/// One counter striped by thread like [`Stats`], for a count written per request where
/// threads must not contend on it (the hybrid limiter's degraded decisions).
#[cfg(feature = "redis")]
pub(crate) struct Striped {
    stripes: Box<[CachePadded<AtomicU64>]>,
}

#[cfg(feature = "redis")]
impl Default for Striped {
    fn default() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| CachePadded::default()).collect(),
        }
    }
}

#[cfg(feature = "redis")]
impl std::fmt::Debug for Striped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Striped").field(&self.sum()).finish()
    }
}

#[cfg(feature = "redis")]
impl Striped {
    /// Adds one, on this thread's stripe.
    #[inline]
    pub(crate) fn incr(&self) {
        self.stripes[stripe_index()].fetch_add(1, Ordering::Relaxed);
    }

    /// The total.
    pub(crate) fn sum(&self) -> u64 {
        self.stripes.iter().map(|s| s.load(Ordering::Relaxed)).sum()
    }
}
