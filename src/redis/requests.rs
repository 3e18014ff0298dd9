//! Both clients' requests beyond a plain check, through one path: a [`Request`]'s
//! [`Ask`] becomes one script call ([`ClientCore::ask`]), which the sync client sends
//! (as [`Requests`]) and the async one awaits (its `Request`'s async operations).

#[cfg(feature = "redis-async")]
use super::aio::AsyncRedisLimiter;
use super::client::{ClientCore, Mode, Req};
use super::{BackendError, RedisAlgorithm, RedisLimiter};
use crate::decision::{Decision, Ticket};
use crate::request::Ask;
#[cfg(feature = "redis-async")]
use crate::request::Request;
use crate::request::Requests;

/// What a settle sends, or answers without a round trip.
enum Settle<'a, A> {
    Send(Req<'a, A>),
    Answered(bool),
}

impl<A: RedisAlgorithm> ClientCore<A> {
    /// The settle of `ticket` (taken for `key` by a client of this prefix) with `actual`:
    /// the script call, or the answer without one (a ticket already closed: `false`; an open
    /// one at its charged cost: `true`), the ticket then closed.
    fn settle_ask<'a>(
        &self,
        key: &'a str,
        ticket: &mut Ticket,
        actual: u64,
        ask: Ask<'a, A>,
    ) -> Result<Settle<'a, A>, BackendError> {
        self.check_ticket(key, ticket)?;
        let quota = self.ask(key, ask, Mode::Check)?.quota;
        crate::shared::settle_limit(quota.unwrap_or(&self.config.algo), ticket, actual)?;
        match self.settle_req(key, ticket, actual, ask.at) {
            Ok(req) => Ok(Settle::Send(Req { quota, ..req })),
            Err(answer) => {
                ticket.close();
                Ok(Settle::Answered(answer))
            }
        }
    }
}

/// The sync client's requests beyond a plain check (`request(key)`, with [`Requests`] in
/// scope): a cost, a quota that comes with it, an explicit instant (nanoseconds on the
/// caller's timeline, at most [`MAX_EXPLICIT_NOW`](super::MAX_EXPLICIT_NOW), instead of
/// Redis' clock: tests and trace replay; never mix with server-time calls on one key); then
/// `check`, `peek`, `up_to`, `take` and `settle`, each a round trip (or the local fast path's
/// answer) returning the backend's failure rather than the [`FailMode`](super::FailMode)'s
/// answer.
impl<A: RedisAlgorithm> Requests<str> for RedisLimiter<A> {
    type Algo = A;
    type Error = BackendError;

    fn decide(&self, key: &str, ask: Ask<'_, A>) -> Result<Decision, BackendError> {
        self.run(self.core.ask(key, ask, Mode::Check)?)?.decision()
    }

    /// Never answered by the local fast path.
    fn peek(&self, key: &str, ask: Ask<'_, A>) -> Result<Decision, BackendError> {
        self.run(self.core.ask(key, ask, Mode::Peek)?)?.decision()
    }

    fn up_to(&self, key: &str, ask: Ask<'_, A>) -> Result<(u64, Decision), BackendError> {
        self.run(self.core.ask(key, ask, Mode::UpTo)?)?.granted()
    }

    fn take(&self, key: &str, ask: Ask<'_, A>) -> Result<Ticket, BackendError> {
        let req = self.core.ask(key, ask, Mode::Take)?;
        self.core.ticket(&req, self.run(req)?)
    }

    /// One script call, idempotent per reservation: a retried settle (after a lost reply)
    /// applies once.
    fn settle(
        &self,
        key: &str,
        ticket: &mut Ticket,
        actual: u64,
        ask: Ask<'_, A>,
    ) -> Result<bool, BackendError> {
        let req = match self.core.settle_ask(key, ticket, actual, ask)? {
            Settle::Send(req) => req,
            Settle::Answered(answer) => return Ok(answer),
        };
        let applied = self.run(req)?.settled()?;
        ticket.close();
        Ok(applied)
    }
}

/// The async client's requests: the sync client's, awaited.
#[cfg(feature = "redis-async")]
impl<'a, A: RedisAlgorithm> Request<'a, AsyncRedisLimiter<A>, str, A> {
    /// Decides the request, counting it; the backend's failure is returned (not the
    /// [`FailMode`](super::FailMode)'s answer, which `check_n` gives).
    pub async fn check(self) -> Result<Decision, BackendError> {
        let req = self.limiter.core.ask(self.key, self.ask, Mode::Check)?;
        self.limiter.run(req).await?.decision()
    }

    /// The decision [`check`](Self::check) would return, without counting it.
    pub async fn peek(self) -> Result<Decision, BackendError> {
        let req = self.limiter.core.ask(self.key, self.ask, Mode::Peek)?;
        self.limiter.run(req).await?.decision()
    }

    /// A partial grant of at most the request's cost: `(granted, decision)`.
    pub async fn up_to(self) -> Result<(u64, Decision), BackendError> {
        let req = self.limiter.core.ask(self.key, self.ask, Mode::UpTo)?;
        self.limiter.run(req).await?.granted()
    }

    /// Takes a provisional cost, returning the ticket to settle.
    pub async fn take(self) -> Result<Ticket, BackendError> {
        let req = self.limiter.core.ask(self.key, self.ask, Mode::Take)?;
        let reply = self.limiter.run(req).await?;
        self.limiter.core.ticket(&req, reply)
    }

    /// Settles `ticket` with the `actual` cost (one script call, idempotent per reservation).
    pub async fn settle(self, ticket: &mut Ticket, actual: u64) -> Result<bool, BackendError> {
        let core = &self.limiter.core;
        let req = match core.settle_ask(self.key, ticket, actual, self.ask)? {
            Settle::Send(req) => req,
            Settle::Answered(answer) => return Ok(answer),
        };
        let applied = self.limiter.run(req).await?.settled()?;
        ticket.close();
        Ok(applied)
    }
}
