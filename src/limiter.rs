//! What every limiter shares: the [`RateLimiter`] trait, its async twin [`AsyncRateLimiter`],
//! and the two ways of keeping a key's state ([`Cas`] and [`Locked`]).

use crate::algo::Algorithm;
use crate::cell::{LockCell, StateCells};
use crate::decision::Decision;
use crate::error::QuotaError;
use std::future::{ready, Future, Ready};

/// A limiter of keys of type `Q` that decides in the call, never waiting on I/O: the
/// in-memory [`Limiter`](crate::Limiter) over every store and the hybrid limiter (feature
/// `redis`). So every `RateLimiter` is an [`AsyncRateLimiter`] at no cost (its future ready at
/// once), which the tower layer takes, and a `check` may run inside an async task. Object-safe:
/// a `dyn RateLimiter<Q>` holds any of them. [`Requests`](crate::Requests) reaches every other
/// operation, through one [`Request`](crate::Request).
///
/// The blocking Redis client is not one: its `check` is a round trip that holds the thread,
/// so the types keep it out of an async server. It has the same methods, inherent, and is a
/// [`Requests`](crate::Requests). Implement `RateLimiter` for a limiter of your own only if
/// its `check` never waits on I/O; a limiter that must wait implements [`AsyncRateLimiter`]
/// instead. To wait until a request is admitted: [`Request::until_ready`](crate::Request::until_ready)
/// (async) or [`until_ready_blocking`](crate::Request::until_ready_blocking).
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, ManualClock, MutexLimiter, RateLimiter};
///
/// fn admitted(l: &dyn RateLimiter<str>, n: usize) -> usize {
///     (0..n).filter(|_| l.check("k").is_allowed()).count()
/// }
/// let g: Gcra = "10/s burst 3".parse()?;
/// assert_eq!(admitted(&CasLimiter::<String, _, _>::with_clock(g, ManualClock::default()), 10), 3);
/// assert_eq!(admitted(&MutexLimiter::<String, _, _>::with_clock(g, ManualClock::default()), 10), 3);
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait RateLimiter<Q: ?Sized>: Send + Sync {
    /// Decides a request of cost 1 for `key`.
    fn check(&self, key: &Q) -> Decision;

    /// Decides a request of `cost` for `key`. Errors (and counts nothing) if the cost is 0
    /// or can never be admitted.
    fn check_n(&self, key: &Q, cost: u64) -> Result<Decision, QuotaError>;

    /// Decides a batch of requests of cost 1, one per key, in order: `out` is cleared, then
    /// holds one decision per key, each what [`check`](RateLimiter::check) would have returned
    /// for that key at that point of the sequence (a key twice in a batch is decided twice,
    /// the second time after the first). Takes any iterator of keys: a slice, an array, a
    /// `map` over owned keys.
    ///
    /// The in-memory [`Limiter`](crate::Limiter) and the hybrid limiter decide a batch at one
    /// instant (one clock read) and issue its look-ups back to back, so the CPU overlaps their
    /// cache misses: faster than one `check` per key when the keys are many and spread (a
    /// proxy or broker that receives requests in batches, a replay); for one hot key it gains
    /// little. By default (and through a `&dyn RateLimiter`), one `check` a key.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock, RateLimiter};
    ///
    /// let l = CasLimiter::<u64, Gcra, _>::with_clock("10/s burst 2".parse()?, ManualClock::default());
    /// let mut out = Vec::new();
    /// l.check_batch(&[7, 8, 7, 7], &mut out);
    /// let allowed: Vec<bool> = out.iter().map(|d| d.is_allowed()).collect();
    /// assert_eq!(allowed, [true, true, true, false]); // key 7's burst is 2
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    fn check_batch<'k>(&self, keys: impl IntoIterator<Item = &'k Q>, out: &mut Vec<Decision>)
    where
        Self: Sized,
        Q: 'k,
    {
        out.clear();
        out.extend(keys.into_iter().map(|key| self.check(key)));
    }

    /// Decides a batch of `(key, cost)` requests in order, as one
    /// [`check_n`](RateLimiter::check_n) each: `out` is cleared, then holds one answer per
    /// request. A refused cost (0, or above the capacity) is that request's error and counts
    /// nothing; the others are decided. Batched as [`check_batch`](RateLimiter::check_batch)
    /// is.
    fn check_n_batch<'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k Q, u64)>,
        out: &mut Vec<Result<Decision, QuotaError>>,
    ) where
        Self: Sized,
        Q: 'k,
    {
        out.clear();
        out.extend(
            requests
                .into_iter()
                .map(|(key, cost)| self.check_n(key, cost)),
        );
    }
}

/// `RateLimiter` through a pointer: `&limiter`, `Box<limiter>` and `Arc<limiter>` are each
/// one (and so an [`AsyncRateLimiter`]), batches included; and so are `&dyn`, `Box<dyn>` and
/// `Arc<dyn RateLimiter<Q>>`, whose batches are one `check` a request (a trait object cannot
/// take the generic iterator).
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, ManualClock, RateLimiter};
/// use std::sync::Arc;
///
/// fn admitted(l: impl RateLimiter<str>, n: usize) -> usize {
///     (0..n).filter(|_| l.check("k").is_allowed()).count()
/// }
/// let g: Gcra = "10/s burst 3".parse()?;
/// let l = Arc::new(CasLimiter::<String, _, _>::with_clock(g, ManualClock::default()));
/// assert_eq!(admitted(&l, 2), 2);
/// assert_eq!(admitted(l.clone(), 2), 1);
/// let dyn_l: Arc<dyn RateLimiter<str>> = l;
/// let mut out = Vec::new();
/// dyn_l.check_batch(["k", "j"], &mut out);
/// assert!(out[0].is_denied() && out[1].is_allowed());
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
macro_rules! forward_rate_limiter {
    (@decide) => {
        #[inline]
        fn check(&self, key: &Q) -> Decision {
            (**self).check(key)
        }

        #[inline]
        fn check_n(&self, key: &Q, cost: u64) -> Result<Decision, QuotaError> {
            (**self).check_n(key, cost)
        }
    };
    ($($ptr:ty, $dyn_ptr:ty);*) => {$(
        impl<Q: ?Sized, L: RateLimiter<Q>> RateLimiter<Q> for $ptr {
            forward_rate_limiter!(@decide);

            fn check_batch<'k>(
                &self,
                keys: impl IntoIterator<Item = &'k Q>,
                out: &mut Vec<Decision>,
            ) where
                Q: 'k,
            {
                (**self).check_batch(keys, out)
            }

            fn check_n_batch<'k>(
                &self,
                requests: impl IntoIterator<Item = (&'k Q, u64)>,
                out: &mut Vec<Result<Decision, QuotaError>>,
            ) where
                Q: 'k,
            {
                (**self).check_n_batch(requests, out)
            }
        }

        // Its batches are the trait's defaults: a trait object takes no generic iterator.
        impl<Q: ?Sized> RateLimiter<Q> for $dyn_ptr {
            forward_rate_limiter!(@decide);
        }
    )*};
}

forward_rate_limiter!(
    &L, &dyn RateLimiter<Q>;
    Box<L>, Box<dyn RateLimiter<Q>>;
    std::sync::Arc<L>, std::sync::Arc<dyn RateLimiter<Q>>
);

/// A limiter whose decision may need I/O (a round trip to a shared store), so it is a
/// future: what `hotlimit_tower::RateLimitLayer` is generic over.
///
/// Every [`RateLimiter`] is one, at no cost: its future is [`std::future::Ready`], the
/// decision taken synchronously in the call, nothing boxed or allocated (a
/// `dyn RateLimiter<str>` too). The Redis backend's `AsyncRedisLimiter` (feature
/// `redis-async`) is the one that waits on the network.
///
/// ```
/// use hotlimit::{algo::Gcra, AsyncRateLimiter, CasLimiter, RateLimiter};
/// use std::sync::Arc;
///
/// fn serves<L: AsyncRateLimiter<str> + ?Sized>(_: &L) {}
/// let l: Arc<dyn RateLimiter<str>> = Arc::new(CasLimiter::<String, Gcra>::new("10/s".parse()?));
/// serves(&l); // the `Arc` is one
/// serves(&*l); // and so is what it holds
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
///
/// The future is an associated type, `Send + 'static` (it owns what it needs, so a caller can
/// keep it across an await without borrowing the limiter) and `Unpin` (so a caller can keep it
/// in a struct it moves, unpinned; box a future that is not).
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, AsyncRateLimiter, CasLimiter, ManualClock};
///
/// async fn admitted<L: AsyncRateLimiter<str>>(l: &L, n: usize) -> usize {
///     let mut allowed = 0;
///     for _ in 0..n {
///         allowed += l.check_async("k").await.is_ok_and(|d| d.is_allowed()) as usize;
///     }
///     allowed
/// }
/// let l = CasLimiter::<String, Gcra, _>::with_clock("10/s burst 3".parse()?, ManualClock::default());
/// let rt = tokio::runtime::Builder::new_current_thread().build()?;
/// assert_eq!(rt.block_on(admitted(&l, 10)), 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait AsyncRateLimiter<Q: ?Sized>: Send + Sync {
    /// Why a decision could not be made: [`QuotaError`] for every in-memory limiter, the
    /// backend's own error for one with a backend. Each converts into the one [`QuotaError`],
    /// which tells the request's fault ([`QuotaError::ZeroCost`], [`QuotaError::ExceedsCapacity`]) from the limiter's
    /// ([`QuotaError::Backend`]): how the tower layer answers `413` or `503`. An error of
    /// your own implements `From<YourError> for QuotaError`.
    type Error: Into<QuotaError> + std::error::Error + Send + Sync + 'static;

    /// The decision to come.
    type Future: Future<Output = Result<Decision, Self::Error>> + Send + Unpin + 'static;

    /// Decides a request of `cost` for `key`.
    fn check_n_async(&self, key: &Q, cost: u64) -> Self::Future;

    /// Decides a request of cost 1 for `key`.
    fn check_async(&self, key: &Q) -> Self::Future {
        self.check_n_async(key, 1)
    }
}

/// Every [`RateLimiter`], decided in the call: the future is ready at once.
impl<Q: ?Sized, L: RateLimiter<Q> + ?Sized> AsyncRateLimiter<Q> for L {
    // `QuotaError`, not `QuotaError`: the future owns nothing to drop, and a caller converts
    // on its error path only.
    type Error = QuotaError;
    type Future = Ready<Result<Decision, QuotaError>>;

    #[inline]
    fn check_n_async(&self, key: &Q, cost: u64) -> Self::Future {
        ready(self.check_n(key, cost))
    }

    #[inline]
    fn check_async(&self, key: &Q) -> Self::Future {
        // Cost 1 is always valid: `check` skips the cost check.
        ready(Ok(self.check(key)))
    }
}

pub(crate) mod sealed {
    use crate::algo::Algorithm;
    use crate::cell::StateCell;

    /// The per-key cell of a [`Variant`](super::Variant): the crate's own cells only.
    pub trait VariantCell<A: Algorithm> {
        /// The per-key cell.
        type Cell: StateCell<A::State>;
    }

    /// The compact table's slot of a [`Variant`](super::Variant) for an algorithm's state: a
    /// supertrait of `Variant`, so one bound serves every store.
    pub trait VariantSlot<A: Algorithm> {
        /// The slot, for keys of form `R`.
        type Slot<R: crate::storage::KeyRepr>: crate::storage::TableSlot<R, A::State>;
    }
}

/// How a store keeps each key's state: [`Cas`] or [`Locked`], the last parameter of
/// [`Map`](crate::store::Map) (the keyed limiters), [`CompactLimiter`](crate::CompactLimiter) and
/// [`DirectLimiter`](crate::DirectLimiter). Sealed.
///
/// Both are implemented for every algorithm, so code generic over the algorithm names no
/// storage bound:
///
/// ```
/// use hotlimit::{algo::Algorithm, CasLimiter, ManualClock, RateLimiter};
///
/// fn first_two<A: Algorithm>(algo: A) -> [bool; 2] {
///     let l = CasLimiter::<u64, A, _>::with_clock(algo, ManualClock::default());
///     [l.check(&1).is_allowed(), l.check(&1).is_allowed()]
/// }
/// assert_eq!(first_two("1/s".parse::<hotlimit::algo::Gcra>()?), [true, false]);
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait Variant<A: Algorithm>:
    sealed::VariantCell<A> + sealed::VariantSlot<A> + Send + Sync + 'static
{
}

/// Optimistic: a word state is updated by compare-and-swap, no lock. (States that are not
/// words, the sliding log and the sub-window counters, take a per-key lock even here.)
#[derive(Debug, Clone, Copy)]
pub enum Cas {}

/// Pessimistic: the state sits behind a `parking_lot::Mutex` and the same step runs under
/// the lock.
#[derive(Debug, Clone, Copy)]
pub enum Locked {}

impl<A: Algorithm> Variant<A> for Cas {}
impl<A: Algorithm> Variant<A> for Locked {}

impl<A: Algorithm> sealed::VariantCell<A> for Cas {
    type Cell = <A::State as StateCells>::CasCell;
}

impl<A: Algorithm> sealed::VariantCell<A> for Locked {
    type Cell = LockCell<A::State>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Gcra;
    use crate::{store::Hashed, CasLimiter, CompactLimiter, ManualClock, MutexLimiter};
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }

    /// The output of a future that must be ready at its first poll.
    fn at_once<F: Future>(f: F) -> F::Output {
        let waker = Waker::from(Arc::new(Noop));
        match pin!(f).poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(out) => out,
            Poll::Pending => panic!("not ready at once"),
        }
    }

    /// Compiles only if `L`'s async decision is `std::future::Ready`: nothing boxed.
    fn ready_future<Q: ?Sized, L>(_: &L)
    where
        L: AsyncRateLimiter<Q, Error = QuotaError, Future = Ready<Result<Decision, QuotaError>>>
            + ?Sized,
    {
    }

    // Pins G61.
    #[test]
    fn every_in_memory_limiter_decides_at_once() {
        let g: Gcra = "10/s burst 2".parse().unwrap();
        let clock = ManualClock::default();
        let cas = CasLimiter::<String, Gcra, _>::with_clock(g, clock.clone());
        ready_future::<str, _>(&cas);
        ready_future::<str, _>(&MutexLimiter::<String, Gcra, _>::with_clock(
            g,
            clock.clone(),
        ));
        ready_future::<str, _>(&CompactLimiter::<Hashed<str>, Gcra, _>::with_clock(
            g,
            clock.clone(),
        ));
        let dynamic: &dyn RateLimiter<str> = &cas;
        ready_future::<str, _>(dynamic);

        // The same decisions as the sync calls, taken in the call.
        let d = at_once;
        assert!(d(cas.check_async("k")).unwrap().is_allowed());
        assert!(d(cas.check_n_async("k", 1)).unwrap().is_allowed());
        assert!(d(cas.check_async("k")).unwrap().is_denied());
        assert_eq!(
            d(cas.check_n_async("k", 3)),
            Err(QuotaError::ExceedsCapacity {
                cost: 3,
                capacity: 2
            })
        );
        let refused = d(cas.check_n_async("k", 0)).unwrap_err();
        assert_eq!(refused, QuotaError::ZeroCost);
    }
}
