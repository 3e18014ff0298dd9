//! The keyed limiter's requests beyond one decision at the limiter's own quota: partial grants,
//! a provisional cost settled afterwards, a quota that comes with the request, and batches.
//! Each is one step on the key's state through [`Shared::apply`], the path every request
//! takes (a batch first locates its keys, then takes the same step on each).

use super::{KeyedLimiter, Shared};
use crate::algo::{Algorithm, Reconfigure};
use crate::batch;
use crate::clock::Clock;
use crate::decision::{Decision, Ticket};
use crate::error::TicketError;
use crate::error::{check_cost, CostError, QuotaError};
use crate::limiter::Variant;
use crate::shared::KeyState;
use std::borrow::Borrow;
use std::hash::Hash;

impl<K, A, C, V> KeyedLimiter<K, A, C, V>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    /// Decides a batch of requests of cost 1, one per key, in order: `out` is cleared, then
    /// holds one decision per key, each what [`check`](KeyedLimiter::check) would have
    /// returned for that key at that point of the sequence (a key twice in a batch is
    /// decided twice, the second time after the first). The batch is decided at one instant
    /// (one clock read).
    ///
    /// Faster than one `check` per key when the keys are many and spread (a proxy or broker
    /// that receives requests in batches, a replay): the batch's look-ups are issued back to
    /// back, so the CPU overlaps their cache misses. For one hot key it gains little.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
    ///
    /// let l = CasLimiter::<u64, Gcra>::with_clock("10/s burst 2".parse()?, ManualClock::new());
    /// let mut out = Vec::new();
    /// l.check_batch(&[7, 8, 7, 7], &mut out);
    /// let allowed: Vec<bool> = out.iter().map(|d| d.is_allowed()).collect();
    /// assert_eq!(allowed, [true, true, true, false]); // key 7's burst is 2
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    pub fn check_batch<'k, Q>(&self, keys: impl IntoIterator<Item = &'k Q>, out: &mut Vec<Decision>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized + 'k,
    {
        out.clear();
        let requests = keys.into_iter().map(|key| (key, 1));
        // Cost 1 is never refused (capacities are at least 1): every answer is a decision.
        self.shared
            .decide_batch(requests, |_| Ok(()), |answer| out.extend(answer.ok()));
    }

    /// Decides a batch of `(key, cost)` requests in order, as one
    /// [`check_n`](KeyedLimiter::check_n) each: `out` is cleared, then holds one answer per
    /// request. A refused cost (0, or above the capacity) is that request's error and counts
    /// nothing; the others are decided. See [`check_batch`](KeyedLimiter::check_batch).
    pub fn check_n_batch<'k, Q>(
        &self,
        requests: impl IntoIterator<Item = (&'k Q, u64)>,
        out: &mut Vec<Result<Decision, CostError>>,
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized + 'k,
    {
        out.clear();
        let core = &self.shared.core;
        self.shared
            .decide_batch(requests, |cost| core.cost(cost), |answer| out.push(answer));
    }

    /// A partial grant: admits the most units available now, up to `n`, and says how many:
    /// `(granted, decision)`, `granted` in `0..=n`. For a batch of messages, a streaming
    /// response, a transfer cut to what the quota allows. `n` above the capacity is capped at
    /// it (no request is ever admitted more at once). With nothing available, `granted` is 0
    /// and the decision is the denial of one unit, with its honest `retry_after` (and counted
    /// as one denied unit under the strict policy). Errors only for `n == 0`.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
    ///
    /// let l = CasLimiter::<String, Gcra>::with_clock("10/s burst 8".parse()?, ManualClock::new());
    /// assert_eq!(l.check_up_to("k", 5)?.0, 5);
    /// let (granted, decision) = l.check_up_to("k", 5)?; // 3 units left
    /// assert_eq!((granted, decision.is_allowed()), (3, true));
    /// let (granted, decision) = l.check_up_to("k", 5)?;
    /// assert_eq!((granted, decision.is_denied()), (0, true));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_up_to<Q>(&self, key: &Q, n: u64) -> Result<(u64, Decision), CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let sh = &*self.shared;
        sh.core.grant_up_to(n, At(sh, key))
    }

    /// Takes a provisional cost: decides and charges `cost` like
    /// [`check_n`](KeyedLimiter::check_n), and returns a [`Ticket`] to
    /// [`settle`](KeyedLimiter::settle) once the actual cost is known (an LLM response's
    /// tokens, a body's bytes). Same errors as `check_n`.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
    ///
    /// let l = CasLimiter::<String, Gcra>::with_clock("10/s burst 10".parse()?, ManualClock::new());
    /// let mut ticket = l.take("k", 4)?;
    /// assert!(l.settle("k", &mut ticket, 9)?); // 5 more than estimated: charged now
    /// assert_eq!(l.peek("k").remaining(), Some(0)); // 10 − 9 − the peeked unit
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn take<Q>(&self, key: &Q, cost: u64) -> Result<Ticket, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let sh = &*self.shared;
        sh.core.take(&sh.core.algo, cost, At(sh, key))
    }

    /// Settles `ticket` (taken from this limiter for `key`) with the `actual` cost: unused
    /// units are refunded, an overrun is charged now, past the burst if need be (a debt the
    /// key pays before its next admission); [`Algorithm::settle`]
    /// says what each algorithm makes of it. Lock-free, on the same CAS path as a request.
    ///
    /// Returns whether this call settled the ticket: `false` if it was already settled (a
    /// retried settle changes nothing) or was denied (it holds nothing). Any `actual` is
    /// valid, 0 included (a full refund). A ticket taken from another limiter or for another
    /// key is a [`TicketError`], and stays open: settled here it would refund or charge
    /// another client.
    pub fn settle<Q>(&self, key: &Q, ticket: &mut Ticket, actual: u64) -> Result<bool, TicketError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let sh = &*self.shared;
        sh.core.settle(&sh.core.algo, ticket, actual, At(sh, key))
    }

    /// Decides a request of `cost` for `key` under `quota`, a quota that comes with the
    /// request (a client's plan, a tenant's contract) instead of the limiter's own: one
    /// limiter serves every plan. The key's state means the same whatever quota reads it
    /// (GCRA: the time its spent budget is paid back; the windows: their counts), so a key
    /// whose plan changes keeps what it spent: moved to a larger burst it gains the
    /// difference at once, to a smaller one it waits until its spending fits the new burst.
    ///
    /// `quota` must be able to read the limiter's states
    /// ([`Reconfigure::check_change`]: any GCRA; a
    /// window of the same length; EARRRL of the same half-life), else
    /// [`QuotaError::Quota`]; a cost of 0 or above the quota's capacity is
    /// [`QuotaError::Cost`]. Nothing is counted on an error. The sweeper judges idleness by
    /// the state alone, which every quota reads alike.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
    ///
    /// let free: Gcra = "10/min".parse()?;
    /// let pro: Gcra = "1000/min burst 100".parse()?;
    /// let l = CasLimiter::<String, Gcra>::with_clock(free, ManualClock::new());
    /// assert_eq!(l.check_n_with("alice", 50, &pro)?.remaining(), Some(50));
    /// assert!(l.check_n_with("bob", 50, &free).is_err()); // more than the free burst
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_n_with<Q>(&self, key: &Q, cost: u64, quota: &A) -> Result<Decision, QuotaError>
    where
        A: Reconfigure,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let sh = &*self.shared;
        let quota = sh.core.quota(quota)?;
        check_cost(cost, quota.capacity())?;
        // The path of `check`, by the request's quota: clock first.
        let now = sh.core.clock.now();
        Ok(sh.decide_pinned_by(quota, key, cost, now, &sh.map.guard()))
    }

    /// [`check`](KeyedLimiter::check) under a quota that comes with the request: a request of
    /// cost 1; see [`check_n_with`](KeyedLimiter::check_n_with). Errors only for a quota that
    /// cannot read the limiter's states (never for GCRA).
    // Always: left to LLVM it stays a call (the `Result` puts it past the inlining
    // threshold), a cost `check`, inlined, does not pay (`BENCHMARKS.md`, issue #32).
    #[inline(always)]
    pub fn check_with<Q>(&self, key: &Q, quota: &A) -> Result<Decision, QuotaError>
    where
        A: Reconfigure,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let sh = &*self.shared;
        let quota = sh.core.quota(quota)?;
        // The path of `check`, by the request's quota; cost 1 never exceeds a capacity.
        let now = sh.core.clock.now();
        Ok(sh.decide_pinned_by(quota, key, 1, now, &sh.map.guard()))
    }

    /// [`take`](KeyedLimiter::take) under a quota that comes with the request; see
    /// [`check_n_with`](KeyedLimiter::check_n_with).
    pub fn take_with<Q>(&self, key: &Q, cost: u64, quota: &A) -> Result<Ticket, QuotaError>
    where
        A: Reconfigure,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let sh = &*self.shared;
        let quota = sh.core.quota(quota)?;
        Ok(sh.core.take(quota, cost, At(sh, key))?)
    }

    /// [`settle`](KeyedLimiter::settle) under the quota the ticket was taken with (GCRA
    /// refunds and charges in its emission interval).
    pub fn settle_with<Q>(
        &self,
        key: &Q,
        ticket: &mut Ticket,
        actual: u64,
        quota: &A,
    ) -> Result<bool, QuotaError>
    where
        A: Reconfigure,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let sh = &*self.shared;
        let quota = sh.core.quota(quota)?;
        Ok(sh.core.settle(quota, ticket, actual, At(sh, key))?)
    }
}

/// `key`'s state in `sh`: what the request paths of [`Core`](crate::shared::Core) run their
/// step on.
pub(super) struct At<'a, S, Q: ?Sized>(pub(super) &'a S, pub(super) &'a Q);

impl<K, A, C, V, Q> KeyState<A::State> for At<'_, Shared<K, A, C, V>, Q>
where
    K: Hash + Eq + Send + Sync + Borrow<Q>,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    #[inline(always)]
    fn apply<T>(&self, f: impl FnMut(&mut A::State) -> T) -> T {
        self.0.apply(self.1, &self.0.map.guard(), f)
    }

    fn key_print(&self) -> u64 {
        crate::shared::key_print(self.1)
    }
}

impl<K, A, C, V> Shared<K, A, C, V>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    /// A batch through [`batch::in_chunks`]: a chunk's cells looked up (absent keys are not
    /// inserted yet), then each request decided from its cell by
    /// [`apply_found`](Shared::apply_found), which looks again for a key absent at the
    /// look-up or a cell since killed.
    #[inline(always)]
    fn decide_batch<'k, Q>(
        &self,
        requests: impl IntoIterator<Item = (&'k Q, u64)>,
        valid: impl Fn(u64) -> Result<(), CostError>,
        emit: impl FnMut(Result<Decision, CostError>),
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized + 'k,
    {
        let (core, guard) = (&self.core, self.map.guard());
        let now = core.clock.now();
        // papaya hashes inside its look-up: nothing to place ahead of it.
        let place = |_: &Q, cost| valid(cost).map(|()| None);
        let find = |key: &Q, found: &mut Option<_>| *found = self.map.get(key, &guard);
        let decide = |key: &Q, cost, found| {
            let step = |state: &mut A::State| core.algo.update(state, now, cost);
            core.count(self.apply_found(key, found, &guard, step))
        };
        batch::in_chunks(requests, place, find, decide, emit);
    }
}
