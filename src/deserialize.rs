//! `serde::Deserialize` for the configuration (feature `serde`): rates, policies and every
//! algorithm's quota, from the strings the parsers accept and from structured forms, through
//! the same constructors, so a bad value fails with the same [`ConfigError`] (as the format's
//! error message).
//!
//! The forms, type by type, are tabled in `docs/limiters.md` ("Configuration files").
//!
//! Durations are strings with a unit, as a [`Rate`]'s period is written (`"250ms"`, `"1.5 h"`,
//! `"2 min"`); unknown fields are errors.

use crate::algo::{
    Bias, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
    DEFAULT_BUCKETS,
};
use crate::config::{parse_duration_nanos, Rate};
use crate::decision::Policy;
use crate::error::{ConfigError, Field};
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;
use std::time::Duration;

/// A value given as a string (parsed by `FromStr`) or as a map of fields `F`.
enum Form<F> {
    Text(String),
    Fields(F),
}

impl<'de, F: Deserialize<'de>> Deserialize<'de> for Form<F> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<F>(PhantomData<F>);
        impl<'de, F: Deserialize<'de>> Visitor<'de> for V<F> {
            type Value = Form<F>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a map of fields")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Form::Text(v.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                F::deserialize(MapAccessDeserializer::new(map)).map(Form::Fields)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A duration field: a string with a unit, as a [`Rate`]'s period, its error naming `field`.
fn duration<E: de::Error>(s: &str, field: Field) -> Result<Duration, E> {
    parse_duration_nanos(s, field)
        .map(Duration::from_nanos)
        .map_err(E::custom)
}

/// A constructor's result, its [`ConfigError`] turned into the format's error.
fn built<T, E: de::Error>(r: Result<T, ConfigError>) -> Result<T, E> {
    r.map_err(E::custom)
}

/// The types whose `Deserialize` is their `FromStr`.
macro_rules! deserialize_from_str {
    ($($t:ty),*) => {$(
        #[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                <$t>::from_str(&s).map_err(de::Error::custom)
            }
        }
    )*};
}
deserialize_from_str!(Policy, Bias);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateFields {
    count: f64,
    per: String,
}

#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Form::<RateFields>::deserialize(d)? {
            Form::Text(s) => built(s.parse()),
            Form::Fields(f) => built(Rate::new(f.count, duration(&f.per, Field::Period)?)),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GcraFields {
    rate: Rate,
    burst: Option<u64>,
    policy: Option<Policy>,
}

#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<'de> Deserialize<'de> for Gcra {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Form::<GcraFields>::deserialize(d)? {
            Form::Text(s) => built(s.parse()),
            Form::Fields(f) => {
                let gcra = built(Gcra::new(f.rate))?;
                let gcra = match f.burst {
                    Some(b) => built(gcra.with_burst(b))?,
                    None => gcra,
                };
                Ok(gcra.with_policy(f.policy.unwrap_or(Policy::Leaky)))
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowFields {
    limit: u64,
    window: String,
    policy: Option<Policy>,
    buckets: Option<u32>,
    bias: Option<Bias>,
}

impl WindowFields {
    fn window<E: de::Error>(&self) -> Result<Duration, E> {
        duration(&self.window, Field::Window)
    }

    fn policy(&self) -> Policy {
        self.policy.unwrap_or(Policy::Leaky)
    }

    /// Rejects the fields that belong to another window algorithm.
    fn only<E: de::Error>(&self, algo: &str, allowed: &[&str]) -> Result<(), E> {
        let given = [
            ("buckets", self.buckets.is_some()),
            ("bias", self.bias.is_some()),
        ];
        match given.iter().find(|(n, set)| *set && !allowed.contains(n)) {
            Some((name, _)) => Err(E::custom(format!("{algo} has no field `{name}`"))),
            None => Ok(()),
        }
    }
}

/// `Deserialize` for a window algorithm from [`WindowFields`]: `$build` makes it from the
/// fields (`f`), `$allowed` the optional fields beyond limit, window and policy.
macro_rules! deserialize_window {
    ($t:ty, $name:literal, [$($allowed:literal),*], |$f:ident| $build:expr) => {
        #[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let $f = WindowFields::deserialize(d)?;
                $f.only($name, &[$($allowed),*])?;
                let algo: $t = $build;
                Ok(algo.with_policy($f.policy()))
            }
        }
    };
}
deserialize_window!(FixedWindow, "a fixed window", [], |f| built(
    FixedWindow::new(f.limit, f.window()?)
)?);
deserialize_window!(SlidingLog, "a sliding log", [], |f| built(
    SlidingLog::new(f.limit, f.window()?)
)?);
deserialize_window!(SlidingWindow, "a sliding window", ["bias"], |f| built(
    SlidingWindow::new(f.limit, f.window()?)
)?
.with_bias(f.bias.unwrap_or(Bias::Strict)));
deserialize_window!(SubWindow, "a sub-window", ["buckets", "bias"], |f| built(
    SubWindow::new(f.limit, f.window()?, f.buckets.unwrap_or(DEFAULT_BUCKETS))
)?
.with_bias(f.bias.unwrap_or(Bias::Strict)));

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EarrrlFields {
    half_life: String,
    rate: Rate,
    policy: Option<Policy>,
}

#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<'de> Deserialize<'de> for Earrrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = EarrrlFields::deserialize(d)?;
        let e = built(Earrrl::new(
            duration(&f.half_life, Field::HalfLife)?,
            f.rate,
        ))?;
        Ok(e.with_policy(f.policy.unwrap_or(Policy::Strict)))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExponentialFields {
    limit: f64,
    period: String,
    policy: Option<Policy>,
}

#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<'de> Deserialize<'de> for Exponential {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = ExponentialFields::deserialize(d)?;
        let e = built(Exponential::new(
            f.limit,
            duration(&f.period, Field::Period)?,
        ))?;
        Ok(e.with_policy(f.policy.unwrap_or(Policy::Leaky)))
    }
}
