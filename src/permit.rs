//! [`Permit`]: the permits one request holds of an in-flight limit, given back when dropped.

use crate::decision::{Decision, Ticket};
use crate::request::{Ask, Requests};
use std::borrow::Borrow;
use std::fmt;

/// The permits one request holds of an in-flight limit
/// ([`InFlight`](crate::algo::InFlight)), given back when the permit is dropped: keep it for
/// as long as the request runs (in the task, beside the response body). It is a
/// [`take`](crate::Request::take) whose ticket its drop settles with nothing still held.
///
/// Acquired from any limiter ([`Requests`]) by reference or owned: `&limiter`,
/// `Arc<limiter>` (a permit that outlives the scope, `'static` for a spawned task), a `Box`;
/// in memory, over Redis and on the fleet limiter. It keeps its own copy of the key
/// (`Q::Owned`: a `String` for a `&str`).
/// A denied acquisition is a permit that holds nothing: its [`decision`](Permit::decision)
/// says so, and dropping it changes nothing. Dropped during a panic's unwinding, it gives
/// its permits back too; one never dropped (`mem::forget`) is given back by its lease.
///
/// Rate and concurrency together: acquire the permit first, then check the rate limiter; if
/// the rate denies, drop the permit. Neither limit is then spent by a request the other
/// refused (a permit held for the instant of the rate check may deny another request in
/// that instant, never admit one too many).
///
/// ```
/// use hotlimit::{algo::{Gcra, InFlight}, CasLimiter, ManualClock, Permit, RateLimiter, Requests};
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// let running = Arc::new(CasLimiter::<String, _, _>::with_clock(
///     InFlight::new(1, Duration::from_secs(300))?,
///     ManualClock::default(),
/// ));
/// let rate = CasLimiter::<String, Gcra, _>::with_clock("100/s burst 2".parse()?, ManualClock::default());
/// let admit = |key: &str| -> Result<Option<Permit<_, str>>, hotlimit::QuotaError> {
///     let permit = Permit::acquire(running.clone(), key, 1)?;
///     Ok((permit.decision().is_allowed() && rate.check(key).is_allowed()).then_some(permit))
/// };
/// let held = admit("alice")?.expect("a permit and the rate");
/// assert!(admit("alice")?.is_none()); // one in flight: the rate is not spent
/// drop(held); // the response ended
/// assert!(admit("alice")?.is_some()); // the burst's second request
/// assert!(admit("alice")?.is_none()); // the burst is spent: the permit goes back at once
/// assert!(running.request("alice").peek()?.is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a permit is given back when dropped: keep it while the request runs"]
pub struct Permit<L: Requests<Q>, Q: ToOwned + ?Sized> {
    limiter: L,
    key: Q::Owned,
    ticket: Ticket,
}

impl<L: Requests<Q>, Q: ToOwned + ?Sized> Permit<L, Q> {
    /// Takes `cost` permits for `key` from `limiter`, if it has them free now: a permit that
    /// holds them (its decision allowed) or nothing (denied). Errors as a
    /// [`take`](crate::Request::take) does: a cost of 0 or above the limit.
    #[inline]
    pub fn acquire(limiter: L, key: &Q, cost: u64) -> Result<Self, L::Error> {
        let ticket = limiter.take(
            key,
            Ask {
                cost,
                ..Ask::default()
            },
        )?;
        Ok(Self {
            limiter,
            key: key.to_owned(),
            ticket,
        })
    }

    /// The acquisition's decision: allowed if the permit holds its cost.
    #[inline]
    pub fn decision(&self) -> Decision {
        self.ticket.decision()
    }
}

impl<L: Requests<Q>, Q: ToOwned + ?Sized> Drop for Permit<L, Q> {
    #[inline]
    fn drop(&mut self) {
        if self.ticket.is_open() {
            // Settling nothing left held: the limiter and key the ticket was taken on, so it
            // cannot be refused as another's.
            let _ = self
                .limiter
                .settle(self.key.borrow(), &mut self.ticket, 0, Ask::default());
        }
    }
}

impl<L: Requests<Q>, Q: ToOwned + ?Sized> fmt::Debug for Permit<L, Q>
where
    Q::Owned: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("key", &self.key)
            .field("ticket", &self.ticket)
            .finish_non_exhaustive()
    }
}
