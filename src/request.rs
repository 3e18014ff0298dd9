//! [`Request`]: every request beyond a plain `check`, built by a limiter's `request(key)`: its
//! cost, the quota it comes with, the instant it is decided at; then what to do with it. Each
//! option is written once here and composes with every operation (a plan *and* a partial
//! grant), on every limiter, through the one [`Requests`] trait.

use crate::decision::{Decision, Ticket};
use crate::error::QuotaError;
use std::fmt;
use std::time::Duration;

/// What a request asks of a limiter ([`Requests`]): its cost, the quota it comes with (else the
/// limiter's own) and the instant it is decided at (else the limiter's clock). Made by a
/// [`Request`]; read by the limiter.
#[derive(Debug)]
#[non_exhaustive]
pub struct Ask<'q, A> {
    /// The request's cost (1 unless set; for a partial grant, the most it asks).
    pub cost: u64,
    /// A quota that comes with the request: the limiter's algorithm, configured per client
    /// (a plan, a tenant's contract).
    pub quota: Option<&'q A>,
    /// The instant, in the limiter's clock's nanoseconds, to decide at instead of reading
    /// the clock (a replay, a request stamped upstream).
    pub at: Option<u64>,
}

impl<A> Clone for Ask<'_, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for Ask<'_, A> {}

impl<A> Default for Ask<'_, A> {
    fn default() -> Self {
        Ask {
            cost: 1,
            quota: None,
            at: None,
        }
    }
}

/// One request to a limiter, from its `request(key)`: set what differs from a plain check,
/// then run it. Options: [`cost`](Request::cost), [`quota`](Request::quota),
/// [`at`](Request::at), [`jitter`](Request::jitter) (waits). Operations:
/// [`check`](Request::check), [`peek`](Request::peek), [`up_to`](Request::up_to),
/// [`take`](Request::take) and [`settle`](Request::settle) on every limiter;
/// [`until_ready`](Request::until_ready), [`until_ready_blocking`](Request::until_ready_blocking)
/// and (GCRA) [`reserve`](Request::reserve) in memory.
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, ManualClock, Requests};
///
/// let free: Gcra = "10/min burst 10".parse()?;
/// let pro: Gcra = "1000/min burst 100".parse()?;
/// let l = CasLimiter::<String, Gcra, _>::with_clock(free, ManualClock::default());
/// // A plan and a partial grant at once: up to 150 units under the pro quota.
/// let (granted, decision) = l.request("alice").quota(&pro).cost(150).up_to()?;
/// assert_eq!((granted, decision.is_allowed()), (100, true));
/// assert!(l.request("alice").quota(&pro).peek()?.is_denied()); // the pro burst, spent
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// `A` is the limiter's algorithm, the type of a request's quota.
#[must_use = "a request does nothing until it is run"]
pub struct Request<'a, L: ?Sized, Q: ?Sized, A> {
    pub(crate) limiter: &'a L,
    pub(crate) key: &'a Q,
    pub(crate) ask: Ask<'a, A>,
    pub(crate) jitter: Duration,
}

impl<'a, L: ?Sized, Q: ?Sized, A> Request<'a, L, Q, A> {
    /// A request of cost 1 for `key` to `limiter`, under its own quota, now: what a
    /// limiter's `request(key)` returns, and how generic code over [`Requests`] starts one.
    #[inline(always)]
    pub(crate) fn new(limiter: &'a L, key: &'a Q) -> Self {
        Request {
            limiter,
            key,
            ask: Ask::default(),
            jitter: Duration::ZERO,
        }
    }

    /// The request's cost (default 1): bytes, tokens, a batch's messages. A cost of 0, or
    /// above what the quota can ever admit, is an error and counts nothing.
    #[inline(always)]
    pub fn cost(mut self, cost: u64) -> Self {
        self.ask.cost = cost;
        self
    }

    /// Decides the request under `quota` instead of the limiter's own: one limiter serves
    /// every plan. The key's state means the same whatever quota reads it (GCRA: the time its
    /// spent budget is paid back; the windows: their counts), so a key whose plan changes
    /// keeps what it spent. `quota` must be able to read the limiter's states
    /// ([`Algorithm::check_quota`](crate::algo::Algorithm::check_quota): any GCRA; a
    /// window of the same length; EARRRL of the same half-life), else the error says so.
    #[inline(always)]
    pub fn quota(mut self, quota: &'a A) -> Self {
        self.ask.quota = Some(quota);
        self
    }

    /// Decides at `now` (nanoseconds of the limiter's clock) instead of reading the clock: a
    /// replay, or a request stamped upstream. A `now` behind the key's state counts as the
    /// state's time, never as an error.
    #[inline(always)]
    pub fn at(mut self, now: u64) -> Self {
        self.ask.at = Some(now);
        self
    }

    /// Adds a random delay of up to `max` to each wait of [`until_ready`](Request::until_ready)
    /// and [`until_ready_blocking`](Request::until_ready_blocking), so that clients denied
    /// together do not all retry at the same instant (a thundering herd). Each wait is the
    /// limiter's honest `retry_after` plus a uniform random duration in `[0, max]`: never
    /// earlier than the limiter allows. None unless set.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, Clock, ManualClock, RateLimiter, Requests};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::default();
    /// let l = CasLimiter::<u64, Gcra, _>::with_clock("10/s burst 1".parse()?, clock.clone());
    /// assert!(l.check(&7).is_allowed());
    /// // The next unit is 100 ms away; the wait adds up to 50 ms (a manual clock moves instead
    /// // of sleeping).
    /// let d = l.request(&7).jitter(Duration::from_millis(50)).until_ready_blocking()?;
    /// assert!(d.is_allowed());
    /// assert!((100_000_000..=150_000_000).contains(&clock.now()), "{}", clock.now());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn jitter(mut self, max: Duration) -> Self {
        self.jitter = max;
        self
    }
}

impl<'a, L: Requests<Q, Algo = A> + ?Sized, Q: ?Sized, A> Request<'a, L, Q, A> {
    /// Decides the request, counting it.
    #[inline(always)]
    pub fn check(self) -> Result<Decision, L::Error> {
        self.limiter.decide(self.key, self.ask)
    }

    /// The decision [`check`](Request::check) would return now, without counting it: the
    /// key's state is left untouched and an unknown key is not inserted. Under concurrency a
    /// snapshot: another request may change the state right after.
    #[inline(always)]
    pub fn peek(self) -> Result<Decision, L::Error> {
        self.limiter.peek(self.key, self.ask)
    }

    /// A partial grant: admits the most units available now, up to the request's cost, and
    /// says how many: `(granted, decision)`. For a batch of messages, a streaming response, a
    /// transfer cut to what the quota allows. A cost above the quota's capacity is capped at
    /// it. With nothing available, `granted` is 0 and the decision is the denial of one unit,
    /// with its honest `retry_after` (counted as one denied unit under the strict policy).
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock, Requests};
    ///
    /// let l = CasLimiter::<String, Gcra, _>::with_clock("10/s burst 8".parse()?, ManualClock::default());
    /// assert_eq!(l.request("k").cost(5).up_to()?.0, 5);
    /// let (granted, decision) = l.request("k").cost(5).up_to()?; // 3 units left
    /// assert_eq!((granted, decision.is_allowed()), (3, true));
    /// let (granted, decision) = l.request("k").cost(5).up_to()?;
    /// assert_eq!((granted, decision.is_denied()), (0, true));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn up_to(self) -> Result<(u64, Decision), L::Error> {
        self.limiter.up_to(self.key, self.ask)
    }

    /// Takes a provisional cost: decides and charges the request like
    /// [`check`](Request::check), and returns a [`Ticket`] to [`settle`](Request::settle)
    /// once the actual cost is known (an LLM response's tokens, a body's bytes).
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock, Requests};
    ///
    /// let l = CasLimiter::<String, Gcra, _>::with_clock("10/s burst 10".parse()?, ManualClock::default());
    /// let mut ticket = l.request("k").cost(4).take()?;
    /// assert!(l.request("k").settle(&mut ticket, 9)?); // 5 more than estimated: charged now
    /// assert_eq!(l.request("k").peek()?.remaining(), Some(0)); // 10 − 9 − the peeked unit
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn take(self) -> Result<Ticket, L::Error> {
        self.limiter.take(self.key, self.ask)
    }

    /// Settles `ticket` (taken from this limiter for this key, under this request's quota:
    /// a refund is priced by the quota that settles, so settled under a slower GCRA quota
    /// than it was taken under it would hand back more than the take charged; a
    /// [`Live`](crate::Live) limiter makes no refund across a switch) with the `actual` cost:
    /// unused units are refunded, an overrun is charged now, past the
    /// burst if need be (a debt the key pays before its next admission);
    /// [`Algorithm::settle`](crate::algo::Algorithm::settle) says what each algorithm makes
    /// of it. The request's cost is not used.
    ///
    /// Returns whether this call settled the ticket: `false` if it was already settled (a
    /// retried settle changes nothing) or was denied (it holds nothing). Any `actual` is
    /// valid, 0 included (a full refund). A ticket taken from another limiter or for another
    /// key is an error, and stays open: settled here it would refund or charge another
    /// client.
    #[inline(always)]
    pub fn settle(self, ticket: &mut Ticket, actual: u64) -> Result<bool, L::Error> {
        self.limiter.settle(self.key, ticket, actual, self.ask)
    }
}

/// A limiter that takes every request a [`Request`] can make: a cost, a quota that comes
/// with the request, an instant; then check, peek, a partial grant, a provisional cost and its
/// settle. Every limiter of the crate is one: in memory, hybrid, and the blocking Redis
/// client. Generic code reaches every operation through it; a limiter implements the five
/// methods below, named as the [`Request`] operations that call them (from
/// [`request`](Requests::request)) but the check's, [`decide`](Requests::decide): every
/// limiter answers `check(key)` itself, and since `Requests` is implemented for `Arc<L>` and
/// `Box<L>` (a [`Permit`](crate::Permit) owns its limiter), a trait method named `check` would
/// shadow the limiter's own in `arc.check(key)`. A
/// limiter of your own issues its tickets with [`Ticket::issue`] and settles them after
/// [`Ticket::check_origin`] and [`Ticket::close`], as the crate's do
/// (`tests/outside_limiter.rs`: a budget per key, through `Request` and [`check_all`], and
/// behind `hotlimit-tower`'s in-flight layer).
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, CompactLimiter, ManualClock, Requests};
///
/// // A partial grant under a plan, on any limiter.
/// fn granted<L: Requests<u64, Algo = Gcra>>(l: &L, plan: &Gcra) -> u64 {
///     l.request(&7).quota(plan).cost(50).up_to().map_or(0, |(n, _)| n)
/// }
/// let (own, plan): (Gcra, Gcra) = ("10/s burst 3".parse()?, "100/s burst 20".parse()?);
/// assert_eq!(granted(&CasLimiter::<u64, _, _>::with_clock(own, ManualClock::default()), &plan), 20);
/// assert_eq!(granted(&CompactLimiter::<u64, _, _>::with_clock(own, ManualClock::default()), &plan), 20);
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait Requests<Q: ?Sized>: Send + Sync {
    /// The limiter's algorithm: what a request's [`quota`](Request::quota) is.
    type Algo;

    /// Why a [`Request`] could not be decided: a cost that can never be admitted, a quota
    /// that cannot read the limiter's states, a ticket from elsewhere
    /// ([`QuotaError`] in memory), a backend's failure (the Redis
    /// client's `BackendError`). It converts into the one [`QuotaError`],
    /// as an [`AsyncRateLimiter`](crate::AsyncRateLimiter)'s does, so generic code tells the
    /// request's fault from the limiter's whatever the limiter.
    type Error: std::error::Error
        + From<QuotaError>
        + Into<crate::QuotaError>
        + Send
        + Sync
        + 'static;

    /// [`Request::check`]: decides `ask` for `key`, counting it.
    fn decide(&self, key: &Q, ask: Ask<'_, Self::Algo>) -> Result<Decision, Self::Error>;

    /// [`Request::peek`]: the decision of `ask` for `key` now, counting nothing.
    fn peek(&self, key: &Q, ask: Ask<'_, Self::Algo>) -> Result<Decision, Self::Error>;

    /// [`Request::up_to`]: a partial grant of at most `ask.cost`.
    fn up_to(&self, key: &Q, ask: Ask<'_, Self::Algo>) -> Result<(u64, Decision), Self::Error>;

    /// [`Request::take`]: decides and charges `ask`, returning a ticket to settle.
    fn take(&self, key: &Q, ask: Ask<'_, Self::Algo>) -> Result<Ticket, Self::Error>;

    /// [`Request::settle`]: settles `ticket` with the `actual` cost.
    fn settle(
        &self,
        key: &Q,
        ticket: &mut Ticket,
        actual: u64,
        ask: Ask<'_, Self::Algo>,
    ) -> Result<bool, Self::Error>;

    /// A [`Request`] for `key`: its options (cost, quota, instant), then one operation:
    /// `check`, `peek`, `up_to` (a partial grant), `take` and `settle` (a cost known
    /// afterwards), and in memory `until_ready` (waits) or `reserve` (pacing).
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock, RateLimiter, Requests};
    ///
    /// let limiter = CasLimiter::<String, Gcra, _>::with_clock("10/s burst 1".parse()?, ManualClock::default());
    /// assert!(limiter.request("k").peek()?.is_allowed());
    /// assert_eq!(limiter.metrics().keys, 0); // a peek counts nothing, inserts nothing
    /// assert!(limiter.check("k").is_allowed());
    /// assert!(limiter.request("k").peek()?.is_denied());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    fn request<'a>(&'a self, key: &'a Q) -> Request<'a, Self, Q, Self::Algo>
    where
        Self: Sized,
    {
        Request::new(self, key)
    }
}

/// One request counted against every level of a hierarchy at once: its user, the user's
/// organisation, a global budget. Each level is `(limiter, key, quota)` (`None`: the limiter's
/// own quota): levels on one limiter with a quota each, or on limiters of one type. The request
/// is admitted only if every level admits it, and then charged on each; if one denies, every
/// level that had admitted it is refunded, so none keeps a charge for it (the denying level
/// does with the denial what its policy does: nothing if leaky). Returns the level that
/// decided and its decision: the first that denied, its `retry_after` the longest any level
/// then asks for (a retry after it, with no other traffic, is admitted by all); or, admitted,
/// the tightest level (the least `remaining`).
///
/// Each level is read first ([`Request::peek`]): if one denies, it alone is charged (by its
/// [`take`](Request::take): its policy's answer to the denial) and no other level is touched.
/// Otherwise each level is charged by its own atomic step ([`Request::take`]), and if one then
/// denies (traffic got there in between), the levels before it are refunded by another step
/// ([`Request::settle`] with 0), so concurrent calls never overspend any level. Between the
/// two steps a request on that level may find it charged and be denied (never admitted beyond
/// its quota). Over Redis each level is a round trip here; the Redis backend's
/// `RedisLimiter::check_all` runs a hierarchy of one limiter's keys in one script call,
/// atomically. A level whose step fails refunds the levels before
/// it and returns the error (a refund that fails leaves its charge: it errs strict). An empty
/// list admits. Any depth is checked in bounded stack: up to 16 levels allocate nothing, a
/// deeper hierarchy one buffer for its tickets.
///
/// ```
/// use hotlimit::{algo::Gcra, check_all, CasLimiter, ManualClock, Requests};
///
/// let l = CasLimiter::<String, Gcra, _>::with_clock("1000/s".parse()?, ManualClock::default());
/// let (user, org): (Gcra, Gcra) = ("10/s burst 3".parse()?, "100/s burst 4".parse()?);
/// let alice = [(&l, "user:alice", Some(&user)), (&l, "org:acme", Some(&org))];
/// let bob = [(&l, "user:bob", Some(&user)), (&l, "org:acme", Some(&org))];
/// for _ in 0..3 {
///     assert!(check_all(&alice, 1)?.1.is_allowed());
/// }
/// let (level, denied) = check_all(&alice, 1)?;
/// assert_eq!((level, denied.is_denied()), (0, true)); // alice's own burst, spent
/// assert!(check_all(&bob, 1)?.1.is_allowed()); // acme's 4th
/// let (level, denied) = check_all(&bob, 1)?;
/// assert_eq!((level, denied.is_denied()), (1, true)); // the organisation's burst, spent...
/// // ...and bob keeps his own: a peek of one unit leaves one more.
/// assert_eq!(l.request("user:bob").quota(&user).peek()?.remaining(), Some(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn check_all<L, Q>(
    levels: &[(&L, &Q, Option<&L::Algo>)],
    cost: u64,
) -> Result<(usize, Decision), L::Error>
where
    L: Requests<Q> + ?Sized,
    Q: ?Sized,
{
    if levels.is_empty() {
        return Ok((0, Decision::allowed()));
    }
    // Each level read first: a request some level denies touches no other, and only a level
    // that changed between its read and a take is ever refunded (a refund undoes what the
    // take stored, `Algorithm::take`: on the exponential limiter a whole impulse, which a
    // hierarchy's admitted levels keep).
    for (i, &(limiter, key, quota)) in levels.iter().enumerate() {
        if limiter.peek(key, ask_with(cost, quota))?.is_allowed() {
            continue;
        }
        let mut ticket = limiter.take(key, ask_with(cost, quota))?;
        if ticket.decision().is_denied() {
            return Ok(denied_at(levels, i, cost, ticket.decision()));
        }
        // Admitted since its read (a refill, a refund): given back, and every level taken.
        limiter.settle(key, &mut ticket, 0, ask_with(1, quota))?;
        break;
    }
    take_levels(levels, cost)
}

/// The answer when level `i` of [`check_all`] denied: its decision, its retry waiting for
/// every later level too (as far as they can be read now).
fn denied_at<L, Q>(
    levels: &[(&L, &Q, Option<&L::Algo>)],
    i: usize,
    cost: u64,
    denied: Decision,
) -> (usize, Decision)
where
    L: Requests<Q> + ?Sized,
    Q: ?Sized,
{
    let later = levels[i + 1..]
        .iter()
        .filter_map(|&(l, k, q)| l.peek(k, ask_with(cost, q)).ok());
    (i, waiting_for_all(denied, later))
}

/// The tickets a hierarchy of at most this many levels holds on the stack; a deeper one takes
/// one allocation. Never one frame a level: a caller's slice of a million levels must not
/// overflow the stack.
const LEVELS_ON_STACK: usize = 16;

/// Every level of [`check_all`] taken in order; if one denies or fails, the levels before it
/// are refunded, the latest first.
fn take_levels<L, Q>(
    levels: &[(&L, &Q, Option<&L::Algo>)],
    cost: u64,
) -> Result<(usize, Decision), L::Error>
where
    L: Requests<Q> + ?Sized,
    Q: ?Sized,
{
    if levels.len() <= LEVELS_ON_STACK {
        let mut tickets: [Option<Ticket>; LEVELS_ON_STACK] = Default::default();
        take_levels_into(levels, cost, &mut tickets)
    } else {
        let mut tickets = Vec::new();
        tickets.resize_with(levels.len(), || None);
        take_levels_into(levels, cost, &mut tickets)
    }
}

/// [`take_levels`] with room for one ticket a level in `tickets`.
fn take_levels_into<L, Q>(
    levels: &[(&L, &Q, Option<&L::Algo>)],
    cost: u64,
    tickets: &mut [Option<Ticket>],
) -> Result<(usize, Decision), L::Error>
where
    L: Requests<Q> + ?Sized,
    Q: ?Sized,
{
    let mut tightest: Option<(usize, Decision)> = None;
    for (i, &(limiter, key, quota)) in levels.iter().enumerate() {
        let outcome = limiter.take(key, ask_with(cost, quota)).map(|ticket| {
            let mine = ticket.decision();
            tickets[i] = Some(ticket);
            mine
        });
        let mut rest = match outcome {
            Ok(mine) if mine.is_allowed() => {
                tightest = Some(match tightest {
                    Some(before) => tighter(before, (i, mine)),
                    None => (i, mine),
                });
                continue;
            }
            Ok(mine) => Ok(denied_at(levels, i, cost, mine)),
            Err(e) => Err(e),
        };
        // Denied or failed here: each level before gives its charge back, the latest first (a
        // refund that fails leaves its own charge, errs strict, and is the error returned
        // unless an earlier level's refund fails too).
        for (&(limiter, key, quota), ticket) in levels[..i].iter().zip(&mut tickets[..i]).rev() {
            if let Some(ticket) = ticket {
                if let Err(e) = limiter.settle(key, ticket, 0, ask_with(1, quota)) {
                    rest = Err(e);
                }
            }
        }
        return rest;
    }
    // `levels` is not empty (`check_all` answered an empty list): some level was the tightest.
    Ok(tightest.unwrap_or((0, Decision::allowed())))
}

fn ask_with<A>(cost: u64, quota: Option<&A>) -> Ask<'_, A> {
    Ask {
        cost,
        quota,
        at: None,
    }
}

/// A hierarchy's denial by one level, waiting for every `later` level too (what each would
/// answer now): a retry sooner would only be denied by another.
pub(crate) fn waiting_for_all(
    denied: Decision,
    later: impl IntoIterator<Item = Decision>,
) -> Decision {
    let longest = later.into_iter().fold(denied.retry_after_nanos(), |m, d| {
        m.max(d.retry_after_nanos())
    });
    denied.with_retry_at_least_ns(longest)
}

/// Of two levels that both allowed, the tightest: the least remaining (an unknown one counts
/// as the most), the earlier on a tie.
pub(crate) fn tighter(a: (usize, Decision), b: (usize, Decision)) -> (usize, Decision) {
    let left = |d: &Decision| d.remaining().unwrap_or(u64::MAX);
    if left(&a.1) <= left(&b.1) {
        a
    } else {
        b
    }
}

/// Boxed, shared (`Arc`) and borrowed limiters are ones too, so a list of limiters of one
/// algorithm as `Box<dyn Requests<Q, Algo = A, Error = E>>` or `Arc<dyn …>` (every store, a
/// test's or a tool's) reaches every operation through one trait object, `request` included:
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, ConfigError, ManualClock, QuotaError, Requests};
/// use std::sync::Arc;
///
/// type Dyn = dyn Requests<u64, Algo = Gcra, Error = QuotaError>;
/// let gcra: Gcra = "10/s burst 2".parse()?;
/// let l: Arc<Dyn> = Arc::new(CasLimiter::<u64, _, _>::with_clock(gcra, ManualClock::default()));
/// assert_eq!(l.request(&7).cost(2).check().map(|d| d.is_allowed()), Ok(true));
/// // A `&dyn` through the impl for `&L` (a `dyn` itself has no `request`: it needs a size).
/// let borrowed: &Dyn = &*l;
/// assert_eq!((&borrowed).request(&7).check().map(|d| d.is_allowed()), Ok(false));
/// # Ok::<(), ConfigError>(())
/// ```
macro_rules! forward_requests {
    ($($ptr:ty),*) => {$(
        impl<Q: ?Sized, L: Requests<Q> + ?Sized> Requests<Q> for $ptr {
            type Algo = L::Algo;
            type Error = L::Error;

            #[inline]
            fn decide(&self, key: &Q, ask: Ask<'_, L::Algo>) -> Result<Decision, L::Error> {
                (**self).decide(key, ask)
            }

            #[inline]
            fn peek(&self, key: &Q, ask: Ask<'_, L::Algo>) -> Result<Decision, L::Error> {
                (**self).peek(key, ask)
            }

            #[inline]
            fn up_to(
                &self,
                key: &Q,
                ask: Ask<'_, L::Algo>,
            ) -> Result<(u64, Decision), L::Error> {
                (**self).up_to(key, ask)
            }

            #[inline]
            fn take(&self, key: &Q, ask: Ask<'_, L::Algo>) -> Result<Ticket, L::Error> {
                (**self).take(key, ask)
            }

            #[inline]
            fn settle(
                &self,
                key: &Q,
                ticket: &mut Ticket,
                actual: u64,
                ask: Ask<'_, L::Algo>,
            ) -> Result<bool, L::Error> {
                (**self).settle(key, ticket, actual, ask)
            }
        }
    )*};
}
forward_requests!(Box<L>, std::sync::Arc<L>, &L);

impl<L: ?Sized, Q: ?Sized, A: fmt::Debug> fmt::Debug for Request<'_, L, Q, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("ask", &self.ask)
            .field("jitter", &self.jitter)
            .finish_non_exhaustive()
    }
}
