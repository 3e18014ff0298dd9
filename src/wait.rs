//! Waiting for a limiter: the loops behind `until_ready` (async, any runtime) and
//! `until_ready_blocking`, and their jitter.

use crate::algo::CLOCK_MAX;
use crate::clock::duration_to_nanos;
use crate::decision::Decision;
use std::future::Future;
use std::time::Duration;

/// One random extra delay in `[0, max]` (a [`jitter`](crate::Request::jitter)'s), so that
/// clients denied together do not all retry at the same instant.
fn random_up_to(max: Duration) -> Duration {
    if max.is_zero() {
        return Duration::ZERO;
    }
    let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(fastrand::u64(0..=max))
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
    jitter: Duration,
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
        sleep(wait.saturating_add(random_up_to(jitter))).await;
    }
}

/// [`until_ready`], sleeping on the calling thread.
pub(crate) fn until_ready_blocking<E>(
    mut peek: impl FnMut() -> Result<Decision, E>,
    mut check: impl FnMut() -> Result<Decision, E>,
    now: impl Fn() -> u64,
    jitter: Duration,
    mut sleep: impl FnMut(Duration),
) -> Result<Decision, E> {
    loop {
        match next(&mut peek, &mut check, &now)? {
            Ok(decision) => return Ok(decision),
            Err(wait) => sleep(wait.saturating_add(random_up_to(jitter))),
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
