//! The human-string parsers (DESIGN §6) on arbitrary bytes: `Rate` (and a rate's period alone), `Gcra`
//! (`<rate> [burst <n>]`), and `Policy`.
//!
//! Asserts: no panic; an accepted rate has a finite positive count and a period of at least
//! 1 ns, and prints to a string that parses back to the same rate; an accepted duration is at
//! least 1 ns; an accepted GCRA has a non-zero emission interval and a burst of at least 1;
//! every refusal has a non-empty message (and a `ConfigError` names its field).
//!
//! Pins G16, G18 (docs/GUARANTEES.md).
#![no_main]

use hotlimit::algo::Gcra;
use hotlimit::{ConfigError, Policy, Rate};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fn check_error(s: &str, e: &ConfigError) {
    assert!(!e.to_string().is_empty(), "{s:?} -> {e:?}: empty message");
    assert!(
        !e.field().to_string().is_empty(),
        "{s:?} -> {e:?}: no field"
    );
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };

    match s.parse::<Rate>() {
        Ok(r) => {
            assert!(r.count().is_finite() && r.count() > 0.0, "{s:?} -> {r:?}");
            assert!(
                r.period() >= std::time::Duration::from_nanos(1),
                "{s:?} -> {r:?}"
            );
            let printed = r.to_string();
            assert_eq!(
                printed.parse::<Rate>(),
                Ok(r),
                "{s:?} -> {r:?} prints as {printed:?}, which does not parse back"
            );
        }
        Err(e) => check_error(s, &e),
    }

    // The duration parser, through a rate's period.
    match format!("1/{s}").parse::<Rate>() {
        Ok(r) => assert!(r.period() >= Duration::from_nanos(1), "{s:?} -> {r:?}"),
        Err(e) => check_error(s, &e),
    }

    match s.parse::<Gcra>() {
        Ok(g) => {
            assert!(!g.emission_interval().is_zero(), "{s:?} -> {g:?}");
            assert!(
                hotlimit::algo::Algorithm::capacity(&g) >= 1,
                "{s:?} -> {g:?}"
            );
        }
        Err(e) => check_error(s, &e),
    }

    if let Err(e) = s.parse::<Policy>() {
        check_error(s, &e);
    }
});
