//! Every algorithm's binding to its Lua (`src/redis/lua/`): the script functions it adds,
//! its parameters in the scripts' time unit, its keys, and the decoding of its reply.

use super::{lua, BackendError};
use crate::algo::Algorithm;
use crate::algo::{
    AllOf, Bias, Earrrl, Exponential, FixedWindow, Gcra, InFlight, SlidingLog, SlidingWindow,
    SubWindow,
};
use crate::decision::{Decision, Policy};

mod private {
    use super::BackendError;
    use ::redis::Value;

    pub trait Sealed {
        /// Appends the Lua function that decides for this algorithm (`local function
        /// <name>(KEYS, ARGV, write) … end`, after those it calls) to `out`, its name numbered
        /// from `next`; returns the name.
        fn lua(&self, out: &mut String, next: &mut usize) -> String;
        /// ARGV 5.., in time units of `unit_ns` nanoseconds.
        fn params(&self, unit_ns: f64) -> Vec<String>;
        /// The suffixes that make the script's keys from the client's Redis key; all keep its
        /// hash tag, so one slot in a cluster.
        fn key_suffixes(&self) -> Vec<String> {
            vec![String::new()]
        }
        /// The decision of the function's reply, times in units of `unit_ns` nanoseconds.
        fn decode(&self, v: Value, unit_ns: f64) -> Result<crate::Decision, BackendError> {
            super::super::replies::decision(v, unit_ns)
        }
    }
}

/// The function around one algorithm's Lua `body`, named `q<next>`.
fn leaf(out: &mut String, next: &mut usize, body: &str) -> String {
    let name = format!("q{next}");
    *next += 1;
    out.push_str(&lua::LEAF_HEAD.replace("NAME", &name));
    out.push_str(body);
    out.push_str("end\n");
    name
}

/// An algorithm the Redis backend can run: every algorithm of the crate but
/// [`Live`](crate::Live): [`Gcra`], [`Earrrl`], [`Exponential`], [`FixedWindow`],
/// [`SlidingWindow`], [`SlidingLog`], [`SubWindow`], [`InFlight`], and [`AllOf`] of them. Sealed.
pub trait RedisAlgorithm: Algorithm + private::Sealed + Clone {}

/// The shortest decimal that round-trips an `f64`; Lua's `tonumber` (strtod) reads it back
/// exactly.
fn num(x: f64) -> String {
    format!("{x:e}")
}

fn strict(p: Policy) -> String {
    if p == Policy::Strict { "1" } else { "0" }.to_string()
}

impl private::Sealed for Gcra {
    fn lua(&self, out: &mut String, next: &mut usize) -> String {
        leaf(out, next, lua::GCRA)
    }
    fn params(&self, unit_ns: f64) -> Vec<String> {
        let t = self.emission_interval().as_nanos();
        // The burst tolerance B·T, exact (the builder bounded it below 2^63 ns).
        let tau = u128::from(self.capacity()) * t;
        let (t, tau) = (t as f64, tau as f64);
        vec![num(t / unit_ns), num(tau / unit_ns), strict(self.policy())]
    }
}
impl RedisAlgorithm for Gcra {}

impl private::Sealed for Earrrl {
    fn lua(&self, out: &mut String, next: &mut usize) -> String {
        leaf(out, next, lua::EARRRL)
    }
    fn params(&self, _unit_ns: f64) -> Vec<String> {
        let (lambda, max_rate, retry_offset, idle_offset) = self.redis_params();
        vec![
            num(lambda),
            num(max_rate),
            num(retry_offset),
            num(idle_offset),
            strict(self.policy()),
        ]
    }
}
impl RedisAlgorithm for Earrrl {}

impl private::Sealed for Exponential {
    fn lua(&self, out: &mut String, next: &mut usize) -> String {
        leaf(out, next, lua::EXPONENTIAL)
    }
    fn params(&self, unit_ns: f64) -> Vec<String> {
        let p = self.period().as_nanos() as f64;
        vec![num(self.limit()), num(p / unit_ns), strict(self.policy())]
    }
}
impl RedisAlgorithm for Exponential {}

/// A window length in time units of `unit_ns` nanoseconds.
fn units(d: std::time::Duration, unit_ns: f64) -> f64 {
    d.as_nanos() as f64 / unit_ns
}

impl private::Sealed for FixedWindow {
    fn lua(&self, out: &mut String, next: &mut usize) -> String {
        leaf(out, next, lua::FIXED_WINDOW)
    }
    fn params(&self, unit_ns: f64) -> Vec<String> {
        let w = units(self.window(), unit_ns);
        vec![num(self.capacity() as f64), num(w), strict(self.policy())]
    }
}
impl RedisAlgorithm for FixedWindow {}

impl private::Sealed for InFlight {
    fn lua(&self, out: &mut String, next: &mut usize) -> String {
        leaf(out, next, lua::IN_FLIGHT)
    }
    fn params(&self, unit_ns: f64) -> Vec<String> {
        // Whole units: the script's epochs are integer divisions. An epoch is half the lease.
        let w = ((self.lease().as_nanos() / 2) as f64 / unit_ns)
            .round()
            .max(1.0);
        vec![num(self.capacity() as f64), num(w)]
    }
}
impl RedisAlgorithm for InFlight {}

impl private::Sealed for SlidingWindow {
    fn lua(&self, out: &mut String, next: &mut usize) -> String {
        leaf(out, next, lua::SLIDING_WINDOW)
    }
    fn params(&self, unit_ns: f64) -> Vec<String> {
        // Whole units: the script compares products of integers exactly. A window that is
        // not a whole number of microseconds is rounded to one on the server clock.
        let w = units(self.window(), unit_ns).round().max(1.0);
        let floor = if self.bias() == Bias::Lenient {
            "1"
        } else {
            "0"
        };
        vec![
            num(self.capacity() as f64),
            num(w),
            strict(self.policy()),
            floor.to_string(),
        ]
    }
}
impl RedisAlgorithm for SlidingWindow {}

impl private::Sealed for SubWindow {
    fn lua(&self, out: &mut String, next: &mut usize) -> String {
        leaf(out, next, lua::SUB_WINDOW)
    }
    fn params(&self, unit_ns: f64) -> Vec<String> {
        let span = self.span();
        vec![
            num(self.capacity() as f64),
            num(units(self.bucket(), unit_ns)),
            num(span as f64),
            strict(self.policy()),
        ]
    }
}
impl RedisAlgorithm for SubWindow {}

impl private::Sealed for SlidingLog {
    fn lua(&self, out: &mut String, next: &mut usize) -> String {
        leaf(out, next, lua::SLIDING_LOG)
    }
    fn params(&self, unit_ns: f64) -> Vec<String> {
        let w = units(self.window(), unit_ns);
        vec![num(self.capacity() as f64), num(w), strict(self.policy())]
    }
    fn key_suffixes(&self) -> Vec<String> {
        vec![String::new(), ":n".into()]
    }
}
impl RedisAlgorithm for SlidingLog {}

impl<A, B> private::Sealed for AllOf<A, B>
where
    A: RedisAlgorithm,
    B: RedisAlgorithm,
{
    fn lua(&self, out: &mut String, next: &mut usize) -> String {
        let first = self.first().lua(out, next);
        let second = self.second().lua(out, next);
        let name = format!("q{next}");
        *next += 1;
        let count = |n: usize| n.to_string();
        out.push_str(
            &lua::ALL_OF
                .replace("NAME", &name)
                .replace("FIRST", &first)
                .replace("SECOND", &second)
                .replace("K1", &count(self.first().key_suffixes().len()))
                .replace("N1", &count(self.first().params(1.0).len()))
                .replace("N2", &count(self.second().params(1.0).len())),
        );
        name
    }
    fn params(&self, unit_ns: f64) -> Vec<String> {
        let mut p = self.first().params(unit_ns);
        p.extend(self.second().params(unit_ns));
        p
    }
    /// Each quota's keys under `:0` and `:1`, after the client's key (so its hash tag).
    fn key_suffixes(&self) -> Vec<String> {
        let first = self
            .first()
            .key_suffixes()
            .into_iter()
            .map(|s| format!(":0{s}"));
        let second = self
            .second()
            .key_suffixes()
            .into_iter()
            .map(|s| format!(":1{s}"));
        first.chain(second).collect()
    }
    fn decode(&self, v: ::redis::Value, unit_ns: f64) -> Result<Decision, BackendError> {
        let ::redis::Value::Array(mut pair) = v else {
            return Err(BackendError::Reply(format!("{v:?}")));
        };
        let (Some(b), Some(a), None) = (pair.pop(), pair.pop(), pair.pop()) else {
            return Err(BackendError::Reply(format!("{pair:?}")));
        };
        Ok(Decision::all_of(
            self.first().decode(a, unit_ns)?,
            self.second().decode(b, unit_ns)?,
        ))
    }
}

/// Several quotas on one key, all-or-nothing, in one script call: each quota's state under its
/// own key (`<key>:0`, `<key>:1`, nested `AllOf`s further down), all under the client's hash
/// tag. Decisions as [`AllOf`]'s in memory: both quotas decide; both store if both allowed,
/// else each that denied stores what its own policy makes of the denial.
impl<A, B> RedisAlgorithm for AllOf<A, B>
where
    A: RedisAlgorithm,
    B: RedisAlgorithm,
    AllOf<A, B>: Algorithm,
{
}
