//! Rates, durations and their human-readable forms (`100/s`, `600/h`, `0.5/s`, `250ms`).
//!
//! Parsing is hand-written rather than borrowed from `humantime`: we need fractional values
//! (`0.5/s`, `1.5s`) and errors of our own typed [`ConfigError`], and the grammar is small.

use crate::error::{ConfigError, Field};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Nanoseconds per second, as the float the floating algorithms divide by.
pub(crate) const NANOS_PER_SEC: f64 = 1e9;

/// A validated rate: `count` events per `period`.
///
/// The count may be fractional (`0.5/s`); the period is a whole number of nanoseconds.
///
/// # Examples
///
/// ```
/// use hotlimit::Rate;
/// use std::time::Duration;
///
/// let r: Rate = "600/h".parse()?;
/// assert_eq!(r.count(), 600.0);
/// assert_eq!(r.period(), Duration::from_secs(3600));
/// assert_eq!(r, Rate::new(600.0, Duration::from_secs(3600))?);
/// assert_eq!(r.to_string(), "600/h");
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    count: f64,
    period_ns: u64,
}

impl Rate {
    /// `count` events per `period`. The count must be finite and positive, the period at
    /// least 1 ns and at most `u64::MAX` ns.
    pub fn new(count: f64, period: Duration) -> Result<Self, ConfigError> {
        let value = || format!("{count}/{}", DisplayNanos(period.as_nanos()));
        let period_ns = match u64::try_from(period.as_nanos()) {
            Ok(0) => {
                return Err(ConfigError::Zero {
                    field: Field::Period,
                    value: value(),
                })
            }
            Ok(ns) => ns,
            Err(_) => {
                return Err(ConfigError::TooLarge {
                    field: Field::Period,
                    value: value(),
                    max: "u64::MAX nanoseconds (about 584 years)",
                })
            }
        };
        positive_finite(Field::Rate, count, value)?;
        let rate = Self { count, period_ns };
        // Algorithms work from the per-second value: it must be a positive finite f64 too.
        let per_second = rate.per_second();
        if per_second.is_infinite() {
            return Err(ConfigError::TooLarge {
                field: Field::Rate,
                value: value(),
                max: "a per-second rate within f64 (about 1.8e308/s)",
            });
        }
        if per_second == 0.0 {
            return Err(ConfigError::TooSmall {
                field: Field::Rate,
                value: value(),
                min: "a per-second rate above 0 in f64 (about 4.9e-324/s)",
            });
        }
        Ok(rate)
    }

    /// The number of events per period.
    pub fn count(&self) -> f64 {
        self.count
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns)
    }

    /// The period in nanoseconds.
    pub(crate) fn period_nanos(&self) -> u64 {
        self.period_ns
    }

    /// Events per second.
    pub(crate) fn per_second(&self) -> f64 {
        // Divided first: `count · 1e9` overflows for counts a rate per second still holds.
        self.count / (self.period_ns as f64 / NANOS_PER_SEC)
    }
}

impl FromStr for Rate {
    type Err = ConfigError;

    /// Parses `<count>/<unit>` or `<count>/<duration>`: `100/s`, `600/h`, `0.5/s`,
    /// `10/min`, `100/10s`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        parse_rate(s, Field::Rate)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/", self.count)?;
        match UNITS.iter().find(|(_, ns)| *ns == self.period_ns) {
            Some((name, _)) => f.write_str(name),
            None => write!(f, "{}", DisplayNanos(self.period_ns.into())),
        }
    }
}

/// Unit names and their length in nanoseconds; the first name of each length is the one
/// `Display` prints, so the shortest canonical names come first.
const UNITS: &[(&str, u64)] = &[
    ("ns", 1),
    ("nsec", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("usec", 1_000),
    ("ms", 1_000_000),
    ("msec", 1_000_000),
    ("s", 1_000_000_000),
    ("sec", 1_000_000_000),
    ("secs", 1_000_000_000),
    ("second", 1_000_000_000),
    ("seconds", 1_000_000_000),
    ("min", 60_000_000_000),
    ("m", 60_000_000_000),
    ("mins", 60_000_000_000),
    ("minute", 60_000_000_000),
    ("minutes", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("hr", 3_600_000_000_000),
    ("hrs", 3_600_000_000_000),
    ("hour", 3_600_000_000_000),
    ("hours", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
    ("day", 86_400_000_000_000),
    ("days", 86_400_000_000_000),
];

const MISSING_UNIT: &str = "missing unit (ns, us, ms, s, min, h, d)";

fn unit_nanos(unit: &str) -> Option<u64> {
    UNITS.iter().find(|(n, _)| *n == unit).map(|(_, ns)| *ns)
}

/// Splits `s` (trimmed) into its leading plain-decimal number and the rest (trimmed).
fn split_number(s: &str) -> (&str, &str) {
    let s = s.trim();
    let end = s
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || (i == 0 && (c == '-' || c == '+'))))
        .map_or(s.len(), |(i, _)| i);
    (&s[..end], s[end..].trim())
}

/// Parses a plain decimal number and checks it is finite and positive.
fn parse_positive(
    num: &str,
    field: Field,
    input: &str,
    missing: &'static str,
) -> Result<f64, ConfigError> {
    if num.is_empty() {
        return Err(parse_error(field, input, missing));
    }
    let v: f64 = num
        .parse()
        .map_err(|_| parse_error(field, input, "not a decimal number"))?;
    positive_finite(field, v, || input.trim().to_owned())?;
    Ok(v)
}

fn positive_finite(field: Field, v: f64, value: impl Fn() -> String) -> Result<(), ConfigError> {
    if v.is_nan() || v.is_infinite() {
        Err(ConfigError::NotFinite {
            field,
            value: value(),
        })
    } else if v < 0.0 {
        Err(ConfigError::Negative {
            field,
            value: value(),
        })
    } else if v == 0.0 {
        Err(ConfigError::Zero {
            field,
            value: value(),
        })
    } else {
        Ok(())
    }
}

fn parse_error(field: Field, input: &str, reason: &'static str) -> ConfigError {
    ConfigError::Parse {
        field,
        input: input.to_owned(),
        reason,
    }
}

/// `count * unit` rounded to whole nanoseconds, at least 1, at most `u64::MAX`.
fn scaled_nanos(count: f64, unit: u64, field: Field, input: &str) -> Result<u64, ConfigError> {
    let ns = (count * unit as f64).round();
    if ns < 1.0 {
        Err(ConfigError::TooSmall {
            field,
            value: input.trim().to_owned(),
            min: "1ns",
        })
    } else if ns >= u64::MAX as f64 {
        Err(ConfigError::TooLarge {
            field,
            value: input.trim().to_owned(),
            max: "u64::MAX nanoseconds (about 584 years)",
        })
    } else {
        Ok(ns as u64)
    }
}

/// A duration such as `250ms`, `10s`, `1.5h`, `2 min`, in nanoseconds: units `ns`, `us`/`µs`,
/// `ms`, `s`/`sec`/`second(s)`, `m`/`min`/`minute(s)`, `h`/`hr`/`hour(s)`, `d`/`day(s)`; a plain
/// decimal (no exponent), rounded to the nearest nanosecond, at least 1 ns. The period of a
/// [`Rate`] string (`"3/1.5h"`) and the durations of the `serde` forms.
pub(crate) fn parse_duration_nanos(s: &str, field: Field) -> Result<u64, ConfigError> {
    let (num, unit) = split_number(s);
    let v = parse_positive(
        num,
        field,
        s,
        "expected a number followed by a unit, like `250ms`",
    )?;
    if unit.is_empty() {
        return Err(parse_error(field, s, MISSING_UNIT));
    }
    let unit = unit_nanos(unit).ok_or_else(|| parse_error(field, s, "unknown unit"))?;
    scaled_nanos(v, unit, field, s)
}

pub(crate) fn parse_rate(s: &str, field: Field) -> Result<Rate, ConfigError> {
    let Some((count, per)) = s.split_once('/') else {
        return Err(parse_error(
            field,
            s,
            "expected `<count>/<unit or duration>`, like `100/s` or `5/10s`",
        ));
    };
    let (num, rest) = split_number(count);
    if !num.is_empty() && !rest.is_empty() {
        return Err(parse_error(field, s, "not a decimal number"));
    }
    let count = parse_positive(num, field, s, "missing count before `/`")?;
    let per = per.trim();
    let period_ns = if per.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        parse_duration_nanos(per, Field::Period).map_err(|e| match e {
            // Report a malformed period against the whole rate string.
            ConfigError::Parse { reason, .. } => parse_error(field, s, reason),
            other => other,
        })?
    } else if per.is_empty() {
        return Err(parse_error(field, s, MISSING_UNIT));
    } else {
        unit_nanos(per).ok_or_else(|| parse_error(field, s, "unknown unit"))?
    };
    // `Rate::new`'s checks, so that a parsed rate and a constructed one are refused alike
    // (a count of 10^300 per ns is too large, 5·10^-324 per day too small), reported against
    // the string given.
    Rate::new(count, Duration::from_nanos(period_ns)).map_err(|e| match e {
        ConfigError::TooLarge { max, .. } => ConfigError::TooLarge {
            field,
            value: s.trim().to_owned(),
            max,
        },
        ConfigError::TooSmall { min, .. } => ConfigError::TooSmall {
            field,
            value: s.trim().to_owned(),
            min,
        },
        other => other,
    })
}

/// Parses a quota string `<rate> [burst <n>]`, like `10/min burst 20`.
pub(crate) fn parse_quota(s: &str) -> Result<(Rate, Option<u64>), ConfigError> {
    let (rate, burst) = match s.find("burst") {
        Some(i) => (&s[..i], Some(s[i + "burst".len()..].trim())),
        None => (s, None),
    };
    let rate = parse_rate(rate.trim(), Field::Rate)?;
    let burst = match burst {
        None => None,
        Some(b) => Some(parse_count(b, Field::Burst)?),
    };
    Ok((rate, burst))
}

/// Parses a positive whole number (a burst or a limit).
pub(crate) fn parse_count(s: &str, field: Field) -> Result<u64, ConfigError> {
    let t = s.trim();
    match t.parse::<u64>() {
        Ok(0) => Err(ConfigError::Zero {
            field,
            value: t.to_owned(),
        }),
        Ok(n) => Ok(n),
        Err(_) if t.starts_with('-') => Err(ConfigError::Negative {
            field,
            value: t.to_owned(),
        }),
        Err(_) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => {
            Err(ConfigError::TooLarge {
                field,
                value: t.to_owned(),
                max: "u64::MAX",
            })
        }
        Err(_) => Err(parse_error(field, s, "expected a positive whole number")),
    }
}

/// Formats nanoseconds with the largest unit that divides them exactly.
pub(crate) struct DisplayNanos(pub(crate) u128);

impl fmt::Display for DisplayNanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHORT: [(&str, u128); 7] = [
            ("d", 86_400_000_000_000),
            ("h", 3_600_000_000_000),
            ("min", 60_000_000_000),
            ("s", 1_000_000_000),
            ("ms", 1_000_000),
            ("us", 1_000),
            ("ns", 1),
        ];
        let ns = self.0;
        let (name, len) = SHORT
            .iter()
            .find(|(_, len)| ns != 0 && ns % len == 0)
            .copied()
            .unwrap_or(("ns", 1));
        write!(f, "{}{}", ns / len, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nanos(s: &str) -> Result<u64, ConfigError> {
        parse_duration_nanos(s, Field::Duration)
    }

    #[test]
    fn durations() {
        assert_eq!(nanos("250ms"), Ok(250_000_000));
        assert_eq!(nanos("10s"), Ok(10_000_000_000));
        assert_eq!(nanos("1h"), Ok(3_600_000_000_000));
        assert_eq!(nanos("0.5s"), Ok(500_000_000));
        assert_eq!(nanos(" 2 min "), Ok(120_000_000_000));
        assert_eq!(nanos("1µs"), Ok(1_000));
        assert_eq!(nanos("3d"), Ok(259_200_000_000_000));
    }

    // Pins G16.
    #[test]
    fn bad_durations_are_typed() {
        let p = |input: &str, reason| {
            Err(ConfigError::Parse {
                field: Field::Duration,
                input: input.into(),
                reason,
            })
        };
        assert_eq!(nanos("10"), p("10", MISSING_UNIT));
        assert_eq!(nanos("10 parsecs"), p("10 parsecs", "unknown unit"));
        assert_eq!(
            nanos(""),
            p("", "expected a number followed by a unit, like `250ms`")
        );
        assert_eq!(
            nanos("ms"),
            p("ms", "expected a number followed by a unit, like `250ms`")
        );
        assert_eq!(nanos("1.2.3s"), p("1.2.3s", "not a decimal number"));
        assert_eq!(
            nanos("0s"),
            Err(ConfigError::Zero {
                field: Field::Duration,
                value: "0s".into()
            })
        );
        assert_eq!(
            nanos("-5s"),
            Err(ConfigError::Negative {
                field: Field::Duration,
                value: "-5s".into()
            })
        );
        assert_eq!(
            nanos("0.1ns"),
            Err(ConfigError::TooSmall {
                field: Field::Duration,
                value: "0.1ns".into(),
                min: "1ns"
            })
        );
        assert!(matches!(
            nanos("100000000000d"),
            Err(ConfigError::TooLarge { .. })
        ));
        let huge = format!("{}s", "9".repeat(400));
        assert!(matches!(
            nanos(&huge),
            Err(ConfigError::NotFinite {
                field: Field::Duration,
                ..
            })
        ));
    }

    #[test]
    fn rates() {
        let r: Rate = "100/s".parse().unwrap();
        assert_eq!((r.count(), r.period_nanos()), (100.0, 1_000_000_000));
        let r: Rate = "600/h".parse().unwrap();
        assert_eq!((r.count(), r.period_nanos()), (600.0, 3_600_000_000_000));
        let r: Rate = "0.5/s".parse().unwrap();
        assert_eq!(r.per_second(), 0.5);
        let r: Rate = "5 / 10s".parse().unwrap();
        assert_eq!((r.count(), r.period_nanos()), (5.0, 10_000_000_000));
        assert_eq!(r.to_string(), "5/10s");
        assert_eq!("10/min".parse::<Rate>().unwrap().to_string(), "10/min");
    }

    // Pins G16.
    #[test]
    fn bad_rates_are_typed() {
        let p = |input: &str, reason| {
            Err(ConfigError::Parse {
                field: Field::Rate,
                input: input.into(),
                reason,
            })
        };
        assert_eq!(
            "100".parse::<Rate>(),
            p(
                "100",
                "expected `<count>/<unit or duration>`, like `100/s` or `5/10s`"
            )
        );
        assert_eq!("/s".parse::<Rate>(), p("/s", "missing count before `/`"));
        assert_eq!("10/".parse::<Rate>(), p("10/", MISSING_UNIT));
        assert_eq!(
            "10/fortnight".parse::<Rate>(),
            p("10/fortnight", "unknown unit")
        );
        assert_eq!(
            "ten/s".parse::<Rate>(),
            p("ten/s", "missing count before `/`")
        );
        assert_eq!(
            "nan/s".parse::<Rate>(),
            p("nan/s", "missing count before `/`")
        );
        assert_eq!("1x/s".parse::<Rate>(), p("1x/s", "not a decimal number"));
        assert_eq!("10/5".parse::<Rate>(), p("10/5", MISSING_UNIT));
        assert_eq!(
            "-1/s".parse::<Rate>(),
            Err(ConfigError::Negative {
                field: Field::Rate,
                value: "-1/s".into()
            })
        );
        assert_eq!(
            "10/0s".parse::<Rate>(),
            Err(ConfigError::Zero {
                field: Field::Period,
                value: "0s".into()
            })
        );
        assert_eq!(
            Rate::new(f64::NAN, Duration::from_secs(1)),
            Err(ConfigError::NotFinite {
                field: Field::Rate,
                value: "NaN/1s".into()
            })
        );
        assert_eq!(
            Rate::new(f64::INFINITY, Duration::from_secs(1)),
            Err(ConfigError::NotFinite {
                field: Field::Rate,
                value: "inf/1s".into()
            })
        );
        assert_eq!(
            Rate::new(1.0, Duration::ZERO),
            Err(ConfigError::Zero {
                field: Field::Period,
                value: "1/0ns".into()
            })
        );
        assert!(matches!(
            Rate::new(1.0, Duration::MAX),
            Err(ConfigError::TooLarge {
                field: Field::Period,
                ..
            })
        ));
    }

    // Pins G16.
    #[test]
    fn quotas_and_counts() {
        let (r, b) = parse_quota("10/min burst 20").unwrap();
        assert_eq!(
            (r.count(), r.period_nanos(), b),
            (10.0, 60_000_000_000, Some(20))
        );
        assert_eq!(parse_quota("10/s").unwrap().1, None);
        assert_eq!(
            parse_quota("10/s burst 0"),
            Err(ConfigError::Zero {
                field: Field::Burst,
                value: "0".into()
            })
        );
        assert_eq!(
            parse_quota("10/s burst -2"),
            Err(ConfigError::Negative {
                field: Field::Burst,
                value: "-2".into()
            })
        );
        assert_eq!(
            parse_quota("10/s burst lots"),
            Err(ConfigError::Parse {
                field: Field::Burst,
                input: "lots".into(),
                reason: "expected a positive whole number"
            })
        );
        assert!(matches!(
            parse_count("99999999999999999999999", Field::Limit),
            Err(ConfigError::TooLarge {
                field: Field::Limit,
                ..
            })
        ));
    }

    #[test]
    fn display_nanos() {
        assert_eq!(DisplayNanos(0).to_string(), "0ns");
        assert_eq!(DisplayNanos(1_500_000).to_string(), "1500us");
        assert_eq!(DisplayNanos(7_200_000_000_000).to_string(), "2h");
    }
}
