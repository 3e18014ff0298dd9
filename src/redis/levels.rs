//! A hierarchy in one script call (`check_all` of both clients): the levels' keys and
//! parameters for the `LEVELS` tail (`lua/levels.lua`), and its reply read as the in-memory
//! [`check_all`](crate::check_all)'s answer.

use super::client::{At, ClientCore};
use super::{BackendError, RedisAlgorithm, MAX_EXPLICIT_NOW};
use crate::decision::Decision;
use crate::error::{check_cost, ConfigError, Field};
use crate::request::{tighter, waiting_for_all};
use ::redis::Value;

impl<A: RedisAlgorithm> ClientCore<A> {
    /// The hierarchy script's invocation: each of `levels` (a client key and its quota, else
    /// the limiter's) charged `cost` at `at`, all or nothing. Every quota, cost and the time
    /// are checked first, and a Redis key at two levels is refused (each level decides on the
    /// state as it was: a key twice would be charged as if once).
    pub(super) fn levels(
        &self,
        levels: &[(&str, Option<&A>)],
        cost: u64,
        at: Option<u64>,
    ) -> Result<::redis::ScriptInvocation<'_>, BackendError> {
        let at = At::of(at);
        let mut invocation = self.levels_script.prepare_invoke();
        let own = match at {
            At::Server => {
                invocation.arg("").arg("1000000");
                &self.params_server
            }
            At::Explicit(now) => {
                if now > MAX_EXPLICIT_NOW {
                    return Err(BackendError::TimeOutOfRange(now));
                }
                invocation.arg(now).arg("1000000000");
                &self.params_explicit
            }
        };
        invocation.arg(cost).arg("1").arg(own.len());
        let mut keys = Vec::with_capacity(levels.len() * self.suffixes.len());
        for &(key, quota) in levels {
            let algo = match quota {
                Some(q) => {
                    self.config.algo.check_quota(q)?;
                    q
                }
                None => &self.config.algo,
            };
            check_cost(cost, algo.capacity())?;
            match quota {
                None => own.iter().for_each(|p| {
                    invocation.arg(p);
                }),
                Some(q) => q.params(at.unit_ns()).into_iter().for_each(|p| {
                    invocation.arg(p);
                }),
            }
            let base = self.redis_key(key);
            keys.extend(self.suffixes.iter().map(|suffix| format!("{base}{suffix}")));
        }
        let mut sorted: Vec<&String> = keys.iter().collect();
        sorted.sort_unstable();
        if let Some(twice) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(BackendError::Config(ConfigError::Repeated {
                field: Field::Levels,
                value: twice[0].clone(),
            }));
        }
        for key in keys {
            invocation.key(key);
        }
        Ok(invocation)
    }

    /// The answer of the hierarchy script's reply `v` for `count` levels at `at`, as
    /// [`check_all`](crate::check_all)'s: the first level that denied, waiting for every
    /// later one too; else the tightest.
    pub(super) fn levels_answer(
        &self,
        v: Value,
        count: usize,
        at: Option<u64>,
    ) -> Result<(usize, Decision), BackendError> {
        let unit = At::of(at).unit_ns();
        let v = v.extract_error().map_err(BackendError::from_redis)?;
        let replies = match v {
            Value::Array(replies) if replies.len() == count => replies,
            v => return Err(BackendError::Reply(format!("{v:?}"))),
        };
        let decisions = replies
            .into_iter()
            .map(|r| self.config.algo.decode(r, unit))
            .collect::<Result<Vec<_>, _>>()?;
        let first = (0, decisions[0]);
        Ok(match decisions.iter().position(Decision::is_denied) {
            Some(i) => (
                i,
                waiting_for_all(decisions[i], decisions[i + 1..].to_vec()),
            ),
            None => decisions
                .into_iter()
                .enumerate()
                .skip(1)
                .fold(first, tighter),
        })
    }
}
