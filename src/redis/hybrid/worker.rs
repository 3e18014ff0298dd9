//! The sync thread: every interval, one script call per queued key (pipelined), the replies
//! applied, failed keys queued again; every second, idle keys swept.

use super::link::{Call, Link};
use super::{HybridAlgorithm, Shared, Slot, Step};
use crate::clock::Clock;
use crate::sweeper::SweepReport;
use ::redis::Script;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The sync thread: every `interval`, one call per queued key.
pub(super) fn sync_loop<A: HybridAlgorithm, C: Clock>(
    s: &Shared<A, C>,
    mut link: Link<A>,
    interval: Duration,
) {
    let script = Script::new(A::SCRIPT);
    let mut last_sweep = Instant::now();
    loop {
        let started = Instant::now();
        let closing = s.stop.load(Ordering::Acquire);
        let now = s.clock.now();
        s.ctx
            .next_tick
            .store(now.saturating_add(s.ctx.interval), Ordering::Relaxed);
        let batch: Vec<_> = if closing {
            s.map.pin().values().cloned().collect()
        } else {
            std::mem::take(&mut *s.queue.lock())
        };
        let mut calls = Vec::new();
        let mut sent = Vec::new();
        for slot in batch {
            // Cleared before reading the key's counters: a request after this queues it again.
            slot.queued.store(false, Ordering::Release);
            match s.algo.prepare(&s.ctx, &slot.e, now, closing) {
                Step::Skip => {}
                Step::Keep => requeue(s, &slot),
                Step::Call(args, what) => {
                    let mut keys = vec![slot.redis_key.clone()];
                    keys.extend(
                        A::EXTRA_KEYS
                            .iter()
                            .map(|x| format!("{}{x}", slot.redis_key)),
                    );
                    calls.push(Call { keys, args });
                    sent.push((slot, what));
                }
            }
        }
        if !calls.is_empty() {
            let t0 = s.clock.now();
            let replies = link.run(&script, &calls);
            let t1 = s.clock.now();
            let mid = t0 + (t1.saturating_sub(t0)) / 2;
            let st = &s.ctx.stats;
            st.calls.fetch_add(calls.len() as u64, Ordering::Relaxed);
            let mut reached = false;
            for ((slot, what), reply) in sent.into_iter().zip(replies) {
                let outcome = match reply {
                    Ok(v) => {
                        reached = true;
                        s.algo
                            .apply(&s.ctx, &slot.e, v, what, mid)
                            .map_err(|m| (false, m))
                    }
                    Err(e) => {
                        let outage = e.is_outage();
                        s.algo.failed(&s.ctx, &slot.e, what);
                        Err((outage, e.to_string()))
                    }
                };
                match outcome {
                    Ok(again) => {
                        if again && !closing {
                            requeue(s, &slot);
                        }
                    }
                    Err((outage, message)) => {
                        *s.ctx.last_error.lock() = Some(message);
                        if outage {
                            st.failed_calls.fetch_add(1, Ordering::Relaxed);
                        } else {
                            st.errors.fetch_add(1, Ordering::Relaxed);
                        }
                        if !closing {
                            requeue(s, &slot);
                        }
                    }
                }
            }
            s.ctx.down.store(!reached, Ordering::Relaxed);
        }
        let st = &s.ctx.stats;
        st.ticks.fetch_add(1, Ordering::Relaxed);
        st.round_trips.store(link.round_trips, Ordering::Relaxed);
        if closing {
            return;
        }
        if last_sweep.elapsed() >= Duration::from_secs(1) {
            last_sweep = Instant::now();
            sweep(s);
        }
        let next = started + interval;
        let left = next.saturating_duration_since(Instant::now());
        if !left.is_zero() && !s.stop.load(Ordering::Acquire) {
            std::thread::park_timeout(left);
        }
    }
}

fn requeue<A: HybridAlgorithm, C>(s: &Shared<A, C>, slot: &Arc<Slot<A::Entry>>) {
    if !slot.queued.swap(true, Ordering::AcqRel) {
        s.queue.lock().push(Arc::clone(slot));
    }
}

/// Removes idle keys not waiting for a sync: tombstoned first, so a request racing the
/// removal decides again on a live entry.
pub(super) fn sweep<A: HybridAlgorithm, C: Clock>(s: &Shared<A, C>) -> SweepReport {
    let now = s.clock.now();
    let map = s.map.pin();
    let started = Instant::now();
    let mut report = SweepReport::default();
    for (key, slot) in map.iter() {
        report.scanned += 1;
        if !slot.queued.load(Ordering::Acquire) && s.algo.kill(&s.ctx, &slot.e, now) {
            let _ = map.remove_if(key, |_, v| Arc::ptr_eq(v, slot));
            report.evicted_idle += 1;
        }
    }
    report.elapsed = started.elapsed();
    report
}
