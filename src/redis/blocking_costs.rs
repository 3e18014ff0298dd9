//! The sync client's requests beyond one decision at the limiter's own quota, as on the
//! in-memory stores: partial grants, a provisional cost settled afterwards (one script call,
//! idempotent per reservation), and a quota that comes with the request.

use super::client::{At, Mode, Req};
use super::{BackendError, RedisAlgorithm, RedisLimiter};
#[cfg(doc)]
use super::{MAX_EXPLICIT_NOW, SETTLE_MARK_TTL};
use crate::algo::Reconfigure;
use crate::decision::{Decision, Ticket};

impl<A: RedisAlgorithm> RedisLimiter<A> {
    /// A partial grant, as the in-memory [`check_up_to`](crate::Limiter::check_up_to):
    /// admits the most units available now, up to `n` (capped at the capacity), and says how
    /// many; with none available, 0 and the denial of one unit. One script call: the script
    /// finds the count by bisection on the key's state and counts it, atomically.
    pub fn try_check_up_to(&self, key: &str, n: u64) -> Result<(u64, Decision), BackendError> {
        self.run(self.core.up_to_req(key, n, At::Server)?)?
            .granted()
    }

    /// [`try_check_up_to`](RedisLimiter::try_check_up_to) at an explicit `now` (ns, at most
    /// [`MAX_EXPLICIT_NOW`]; see [`try_check_n_at`](RedisLimiter::try_check_n_at)).
    pub fn try_check_up_to_at(
        &self,
        key: &str,
        n: u64,
        now_ns: u64,
    ) -> Result<(u64, Decision), BackendError> {
        let req = self.core.up_to_req(key, n, At::Explicit(now_ns))?;
        self.run(req)?.granted()
    }

    /// Takes a provisional cost, as the in-memory [`take`](crate::Limiter::take):
    /// decides and counts `cost` like [`try_check_n`](RedisLimiter::try_check_n) and returns
    /// a [`Ticket`] to [`try_settle`](RedisLimiter::try_settle) once the actual cost is known.
    /// The ticket carries Redis' time of the decision and a reservation id unique across the
    /// fleet's clients.
    ///
    /// ```no_run
    /// use hotlimit::{algo::Gcra, redis::RedisLimiter};
    ///
    /// let limiter = RedisLimiter::connect("redis://127.0.0.1/", "10000/min".parse::<Gcra>()?)?;
    /// let mut ticket = limiter.try_take("api-key-7", 800)?; // prompt + max_tokens
    /// if ticket.is_allowed() {
    ///     let used = 312; // the response's real token count
    ///     limiter.try_settle("api-key-7", &mut ticket, used)?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_take(&self, key: &str, cost: u64) -> Result<Ticket, BackendError> {
        let req = Req::new(key, cost, At::Server, Mode::Take);
        self.core.ticket(&req, self.run(req)?)
    }

    /// [`try_take`](RedisLimiter::try_take) at an explicit `now` (ns; see
    /// [`try_check_n_at`](RedisLimiter::try_check_n_at)). Settle it with
    /// [`try_settle_at`](RedisLimiter::try_settle_at).
    pub fn try_take_at(&self, key: &str, cost: u64, now_ns: u64) -> Result<Ticket, BackendError> {
        let req = Req::new(key, cost, At::Explicit(now_ns), Mode::Take);
        self.core.ticket(&req, self.run(req)?)
    }

    /// Settles `ticket` (taken from this limiter, or another with the same configuration, for
    /// `key`) with the `actual` cost, as the in-memory
    /// [`settle`](crate::Limiter::settle): unused units refunded, an overrun charged now,
    /// past the burst if need be. One script call, atomic with every other request on the key.
    ///
    /// Idempotent per reservation: the script first marks the ticket's reservation settled
    /// (a key beside the client key's, kept [`SETTLE_MARK_TTL`]) and does nothing if the mark
    /// is there. So when a settle fails ([`BackendError`]: a timeout, a lost reply), the
    /// ticket stays open and the settle can simply be retried: if the first attempt reached
    /// Redis, the retry finds its mark and changes nothing.
    ///
    /// Returns whether this call settled the reservation: `false` if the ticket was closed
    /// already (settled, or denied: it holds nothing) or Redis found it settled (an earlier
    /// attempt whose reply was lost). `actual` equal to the charged cost closes the ticket
    /// without a round trip. A ticket never settled stands as charged.
    ///
    /// A refund can make a key admissible sooner than a denial this instance's local fast
    /// path remembers (it forgets the key on its own settles; another instance's refund it
    /// does not see, and it may deny until the remembered deadline).
    pub fn try_settle(
        &self,
        key: &str,
        ticket: &mut Ticket,
        actual: u64,
    ) -> Result<bool, BackendError> {
        self.settle_by(key, ticket, actual, At::Server, None)
    }

    /// [`try_settle`](RedisLimiter::try_settle) at an explicit `now`, for a ticket from
    /// [`try_take_at`](RedisLimiter::try_take_at).
    pub fn try_settle_at(
        &self,
        key: &str,
        ticket: &mut Ticket,
        actual: u64,
        now_ns: u64,
    ) -> Result<bool, BackendError> {
        self.settle_by(key, ticket, actual, At::Explicit(now_ns), None)
    }

    /// Decides a request of `cost` for `key` under `quota`, a quota that comes with the
    /// request (a client's plan), as the in-memory
    /// [`check_n_with`](crate::Limiter::check_n_with): one limiter, and one set of Redis
    /// keys, for every plan. `quota` must read the limiter's states
    /// ([`Reconfigure::check_change`]), else [`BackendError::Config`]; nothing is sent on an
    /// error.
    pub fn try_check_n_with(
        &self,
        key: &str,
        cost: u64,
        quota: &A,
    ) -> Result<Decision, BackendError>
    where
        A: Reconfigure,
    {
        let quota = self.core.quota(quota)?;
        let req = Req::new(key, cost, At::Server, Mode::Check).with(quota);
        self.run(req)?.decision()
    }

    /// [`try_check_n_with`](RedisLimiter::try_check_n_with) at an explicit `now` (ns; see
    /// [`try_check_n_at`](RedisLimiter::try_check_n_at)).
    pub fn try_check_n_with_at(
        &self,
        key: &str,
        cost: u64,
        quota: &A,
        now_ns: u64,
    ) -> Result<Decision, BackendError>
    where
        A: Reconfigure,
    {
        let quota = self.core.quota(quota)?;
        let req = Req::new(key, cost, At::Explicit(now_ns), Mode::Check).with(quota);
        self.run(req)?.decision()
    }

    /// [`try_take`](RedisLimiter::try_take) under a quota that comes with the request; see
    /// [`try_check_n_with`](RedisLimiter::try_check_n_with).
    pub fn try_take_with(&self, key: &str, cost: u64, quota: &A) -> Result<Ticket, BackendError>
    where
        A: Reconfigure,
    {
        let quota = self.core.quota(quota)?;
        let req = Req::new(key, cost, At::Server, Mode::Take).with(quota);
        self.core.ticket(&req, self.run(req)?)
    }

    /// [`try_settle`](RedisLimiter::try_settle) under the quota the ticket was taken with
    /// (GCRA refunds and charges in its emission interval).
    pub fn try_settle_with(
        &self,
        key: &str,
        ticket: &mut Ticket,
        actual: u64,
        quota: &A,
    ) -> Result<bool, BackendError>
    where
        A: Reconfigure,
    {
        let quota = self.core.quota(quota)?;
        self.settle_by(key, ticket, actual, At::Server, Some(quota))
    }

    /// A settle; the ticket is closed once Redis answered (left open on an error, to retry).
    fn settle_by(
        &self,
        key: &str,
        ticket: &mut Ticket,
        actual: u64,
        at: At,
        quota: Option<&A>,
    ) -> Result<bool, BackendError> {
        self.core.check_ticket(key, ticket)?;
        let req = match self.core.settle_req(key, ticket, actual, at) {
            Ok(req) => req,
            Err(answer) => {
                ticket.close();
                return Ok(answer);
            }
        };
        let req = quota.map_or(req, |q| req.with(q));
        let applied = self.run(req)?.settled()?;
        ticket.close();
        Ok(applied)
    }
}
