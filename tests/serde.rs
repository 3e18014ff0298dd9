//! The `serde` feature: rates, policies and every rate algorithm's quota deserialize from the strings
//! the parsers accept and from structured forms, to the same values the constructors build,
//! and a bad value fails with the constructor's own `ConfigError` message.

#![cfg(feature = "serde")]

use hotlimit::algo::{
    Bias, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
};
use hotlimit::Requests;
use hotlimit::{CasLimiter, ConfigError, ManualClock, Policy, Rate};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::time::Duration;

fn from<T: DeserializeOwned>(json: &str) -> Result<T, String> {
    serde_json::from_str(json).map_err(|e| e.to_string())
}

/// The message a deserializer reports for `err`: serde_json appends the position.
fn starts_with_error<T: std::fmt::Debug>(got: Result<T, String>, err: ConfigError) {
    let got = got.unwrap_err();
    assert!(got.starts_with(&err.to_string()), "{got:?} vs {err}");
}

// Pins G35.
#[test]
fn strings_and_fields_build_what_the_constructors_build() {
    let minute = Duration::from_secs(60);
    assert_eq!(from::<Rate>(r#""10/s""#), Ok("10/s".parse().unwrap()));
    assert_eq!(
        from::<Rate>(r#"{"count": 600, "per": "1h"}"#),
        Ok(Rate::new(600.0, Duration::from_secs(3600)).unwrap())
    );
    assert_eq!(from::<Policy>(r#""strict""#), Ok(Policy::Strict));
    assert_eq!(from::<Bias>(r#""lenient""#), Ok(Bias::Lenient));
    let gcra: Gcra = "10/min burst 20".parse().unwrap();
    assert_eq!(from::<Gcra>(r#""10/min burst 20""#), Ok(gcra));
    assert_eq!(from::<Gcra>(r#"{"rate": "10/min", "burst": 20}"#), Ok(gcra));
    assert_eq!(
        from::<Gcra>(r#"{"rate": {"count": 10, "per": "1min"}, "burst": 20, "policy": "strict"}"#),
        Ok(gcra.with_policy(Policy::Strict))
    );
    assert_eq!(
        from::<Gcra>(r#"{"rate": "10/min"}"#),
        Ok("10/min".parse().unwrap())
    );
    assert_eq!(
        from::<FixedWindow>(r#"{"limit": 100, "window": "1min"}"#),
        Ok(FixedWindow::new(100, minute).unwrap())
    );
    assert_eq!(
        from::<SlidingLog>(r#"{"limit": 5, "window": "60s", "policy": "strict"}"#),
        Ok(SlidingLog::new(5, minute)
            .unwrap()
            .with_policy(Policy::Strict))
    );
    assert_eq!(
        from::<SlidingWindow>(r#"{"limit": 5, "window": "1 min", "bias": "lenient"}"#),
        Ok(SlidingWindow::new(5, minute)
            .unwrap()
            .with_bias(Bias::Lenient))
    );
    assert_eq!(
        from::<SubWindow>(r#"{"limit": 5, "window": "1min"}"#),
        Ok(SubWindow::new(5, minute, 60).unwrap())
    );
    assert_eq!(
        from::<SubWindow>(r#"{"limit": 5, "window": "1min", "buckets": 6, "bias": "lenient"}"#),
        Ok(SubWindow::new(5, minute, 6)
            .unwrap()
            .with_bias(Bias::Lenient))
    );
    assert_eq!(
        from::<Earrrl>(r#"{"half_life": "2s", "rate": "3/s"}"#),
        Ok(Earrrl::new(
            Duration::from_secs(2),
            Rate::new(3.0, Duration::from_secs(1)).unwrap()
        )
        .unwrap())
    );
    assert_eq!(
        from::<Exponential>(r#"{"limit": 10, "period": "1min", "policy": "strict"}"#),
        Ok(Exponential::new(10.0, minute)
            .unwrap()
            .with_policy(Policy::Strict))
    );
}

// Pins G16, G35.
#[test]
fn bad_values_fail_with_the_constructors_errors() {
    starts_with_error(from::<Rate>(r#""0/s""#), "0/s".parse::<Rate>().unwrap_err());
    starts_with_error(
        from::<Gcra>(r#""10/s burst 0""#),
        "10/s burst 0".parse::<Gcra>().unwrap_err(),
    );
    let rate: Rate = "10/s".parse().unwrap();
    starts_with_error(
        from::<Gcra>(r#"{"rate": "10/s", "burst": 0}"#),
        Gcra::new(rate).unwrap().with_burst(0).unwrap_err(),
    );
    starts_with_error(
        from::<Rate>(r#"{"count": -1, "per": "1s"}"#),
        Rate::new(-1.0, Duration::from_secs(1)).unwrap_err(),
    );
    starts_with_error(
        from::<FixedWindow>(r#"{"limit": 0, "window": "1min"}"#),
        FixedWindow::new(0, Duration::from_secs(60)).unwrap_err(),
    );
    starts_with_error(
        from::<SubWindow>(r#"{"limit": 5, "window": "1min", "buckets": 0}"#),
        SubWindow::new(5, Duration::from_secs(60), 0).unwrap_err(),
    );
    // A duration without a unit is the parser's error, naming the field.
    let err = from::<FixedWindow>(r#"{"limit": 5, "window": "60"}"#).unwrap_err();
    assert!(err.starts_with("cannot parse window `60`"), "{err}");
    let err = from::<Earrrl>(r#"{"half_life": "0s", "rate": "3/s"}"#).unwrap_err();
    assert!(
        err.starts_with(
            &Earrrl::new(
                Duration::ZERO,
                Rate::new(3.0, Duration::from_secs(1)).unwrap()
            )
            .unwrap_err()
            .to_string()
        ),
        "{err}"
    );
    // Fields of another algorithm, or unknown ones, are errors.
    let err = from::<FixedWindow>(r#"{"limit": 5, "window": "1min", "buckets": 6}"#).unwrap_err();
    assert!(
        err.starts_with("a fixed window has no field `buckets`"),
        "{err}"
    );
    assert!(from::<Gcra>(r#"{"rate": "10/s", "brust": 5}"#)
        .unwrap_err()
        .contains("unknown field `brust`"));
    assert!(from::<Policy>(r#""lenient""#).is_err());
    assert!(from::<Gcra>("12").is_err());
}

/// Plans from a configuration file, one limiter serving them all.
// Pins G31, G35.
#[test]
fn plans_from_a_config_file() {
    let plans: BTreeMap<String, Gcra> =
        from(r#"{ "free": "10/min", "pro": { "rate": "1000/min", "burst": 100 } }"#).unwrap();
    let l = CasLimiter::<String, Gcra, _>::with_clock(plans["free"], ManualClock::default());
    assert_eq!(
        l.request("a")
            .cost(60)
            .quota(&plans["pro"])
            .check()
            .unwrap()
            .remaining(),
        Some(40)
    );
    assert!(l
        .request("b")
        .cost(60)
        .quota(&plans["free"])
        .check()
        .is_err());
}

// A ticket serialized and read back settles as the original would, once per copy: the
// round trip keeps its charge, its time and its binding to the limiter and key (another
// key's settle is refused and changes nothing).
#[test]
fn a_ticket_round_trips_and_settles_as_the_original() {
    let l = CasLimiter::<String, Gcra, _>::with_clock(
        "10/min burst 10".parse().unwrap(),
        ManualClock::default(),
    );
    let ticket = l.request("k").cost(6).take().unwrap();
    let json = serde_json::to_string(&ticket).unwrap();
    let mut back: hotlimit::Ticket = serde_json::from_str(&json).unwrap();
    assert_eq!(back, ticket);
    assert!(l.request("other").settle(&mut back, 0).is_err());
    assert!(back.is_open());
    // 6 charged, 1 used: 5 back, so 9 of 10 remain.
    assert!(l.request("k").settle(&mut back, 1).unwrap());
    assert!(!l.request("k").settle(&mut back, 1).unwrap());
    assert_eq!(l.request("k").peek().unwrap().remaining(), Some(8));
    drop(ticket);
}

// A ticket carried to another process is refused there: each process's limiters draw their
// ids at random (every process's first limiter was number 1, so a ticket from one process
// settled on another's first limiter, refunding a charge that limiter never made). Two
// fresh processes of this test binary: the first takes and prints a ticket from its first
// limiter, the second settles it on its own first limiter.
// Pins G29.
#[test]
fn a_ticket_from_another_process_is_refused() {
    const ROLE: &str = "HOTLIMIT_TEST_TICKET_ROLE";
    let limiter = || {
        CasLimiter::<String, Gcra, _>::with_clock(
            "10/min burst 10".parse().unwrap(),
            ManualClock::default(),
        )
    };
    match std::env::var(ROLE).as_deref() {
        Ok("take") => {
            let ticket = limiter().request("k").cost(6).take().unwrap();
            println!("TICKET {}", serde_json::to_string(&ticket).unwrap());
            return;
        }
        Ok("settle") => {
            let l = limiter();
            let mut ticket: hotlimit::Ticket =
                serde_json::from_str(&std::env::var("HOTLIMIT_TEST_TICKET").unwrap()).unwrap();
            let got = l.request("k").settle(&mut ticket, 0);
            assert_eq!(got, Err(hotlimit::QuotaError::TicketFromOtherLimiter));
            println!("REFUSED");
            return;
        }
        _ => {}
    }
    let run = |role: &str, ticket: &str| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_ticket_from_another_process_is_refused",
                "--nocapture",
            ])
            .env(ROLE, role)
            .env("HOTLIMIT_TEST_TICKET", ticket)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{role}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let taken = run("take", "");
    let ticket = taken
        .lines()
        .find_map(|l| l.strip_prefix("TICKET "))
        .unwrap_or_else(|| panic!("no ticket in {taken}"));
    assert!(run("settle", ticket).contains("REFUSED"));
}
