//! Waiting for a limiter: the loops behind `until_ready` (async, any runtime) and
//! `until_ready_blocking`, and their [`Jitter`].

use crate::algo::CLOCK_MAX;
use crate::clock::duration_to_nanos;
use crate::decision::Decision;
use std::future::Future;
use std::time::Duration;

/// A random extra delay added to each wait of `until_ready`, so that clients denied together
/// do not all retry at the same instant (a thundering herd).
///
/// Each wait is the limiter's honest `retry_after` plus a uniform random duration in
/// `[0, max]`: never earlier than the limiter allows.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, Clock, Jitter, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::default();
/// let l = CasLimiter::<u64, Gcra, _>::with_clock("10/s burst 1".parse()?, clock.clone());
/// assert!(l.check(&7).is_allowed());
/// // The next unit is 100 ms away; the wait adds up to 50 ms (a manual clock moves instead of
/// // sleeping).
/// let d = l.request(&7).jitter(Jitter::up_to(Duration::from_millis(50))).until_ready_blocking()?;
/// assert!(d.is_allowed());
/// assert!((100_000_000..=150_000_000).contains(&clock.now()), "{}", clock.now());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Jitter {
    max: Duration,
}

impl Jitter {
    /// No jitter: wake exactly when the limiter allows.
    pub const NONE: Jitter = Jitter {
        max: Duration::ZERO,
    };

    /// Up to `max` of extra delay, uniformly distributed.
    pub const fn up_to(max: Duration) -> Self {
        Self { max }
    }

    /// One random extra delay in `[0, max]`.
    pub(crate) fn sample(&self) -> Duration {
        if self.max.is_zero() {
            return Duration::ZERO;
        }
        let max = u64::try_from(self.max.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(fastrand::u64(0..=max))
    }
}

/// Waits until `check` allows, sleeping through `sleep` for as long as the limiter says.
///
/// It peeks before it checks, so a waiting caller is not counted while it waits (under a
/// strict policy each counted denial would push its own wait further); a check that loses a
/// race to another caller after an allowing peek sleeps what that check's denial says. The
/// peek may fail (a cost that a live reconfiguration made impossible): the wait ends with
/// that error instead of going on forever. A wait that the limiter's clock cannot reach
/// (past [`CLOCK_MAX`], where a clock saturates) ends with the denial: no sleep would help.
pub(crate) async fn until_ready<E, F, Fut>(
    mut peek: impl FnMut() -> Result<Decision, E>,
    mut check: impl FnMut() -> Result<Decision, E>,
    now: impl Fn() -> u64,
    jitter: Jitter,
    mut sleep: F,
) -> Result<Decision, E>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        let wait = match next(&mut peek, &mut check, &now)? {
            Ok(decision) => return Ok(decision),
            Err(wait) => wait,
        };
        sleep(wait.saturating_add(jitter.sample())).await;
    }
}

/// [`until_ready`], sleeping on the calling thread.
pub(crate) fn until_ready_blocking<E>(
    mut peek: impl FnMut() -> Result<Decision, E>,
    mut check: impl FnMut() -> Result<Decision, E>,
    now: impl Fn() -> u64,
    jitter: Jitter,
    mut sleep: impl FnMut(Duration),
) -> Result<Decision, E> {
    loop {
        match next(&mut peek, &mut check, &now)? {
            Ok(decision) => return Ok(decision),
            Err(wait) => sleep(wait.saturating_add(jitter.sample())),
        }
    }
}

/// One round: the decision to return (allowed, or denied past the clock's reach), or the
/// wait before the next round.
fn next<E>(
    peek: &mut impl FnMut() -> Result<Decision, E>,
    check: &mut impl FnMut() -> Result<Decision, E>,
    now: &impl Fn() -> u64,
) -> Result<Result<Decision, Duration>, E> {
    let peeked = peek()?;
    let denied = if peeked.is_denied() {
        peeked
    } else {
        let decided = check()?;
        if decided.is_allowed() {
            return Ok(Ok(decided));
        }
        decided
    };
    let wait = denied.retry_after();
    let reachable = now()
        .checked_add(duration_to_nanos(wait))
        .is_some_and(|at| at <= CLOCK_MAX);
    Ok(if reachable { Err(wait) } else { Ok(denied) })
}
