//! The renderer and the verdicts: every draft, mode and `t`.

use super::*;
use crate::decision::Decision;
use http::{HeaderMap, StatusCode};
use std::time::Duration;

fn render(headers: RateLimitHeaders, decision: Decision) -> Vec<String> {
    let v = headers.verdict(decision);
    let from_iter: Vec<String> = render_verdict(v);
    // `apply` writes the same fields.
    let mut map = HeaderMap::new();
    v.apply(&mut map);
    let from_map: Vec<String> = map
        .iter()
        .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
        .collect();
    assert_eq!(from_iter.len(), from_map.len());
    for f in &from_iter {
        assert!(from_map.contains(f), "{f} not in {from_map:?}");
    }
    from_iter
}

/// The headers with `set` applied: a one-line variant in these tests.
trait With: Sized {
    fn with(self, set: impl FnOnce(&mut Self)) -> Self;
}

impl With for RateLimitHeaders {
    fn with(mut self, set: impl FnOnce(&mut Self)) -> Self {
        set(&mut self);
        self
    }
}

// Pins G57.
#[test]
fn long_policy_names_still_format() {
    let name = "a-policy-name-long-enough-to-overflow-the-stack-buffer-of-one-hundred-and-twenty-eight-bytes-used-for-header-values";
    let q = QuotaPolicy::new(7, Duration::from_secs(3))
        .named(name)
        .unwrap();
    let headers = RateLimitHeaders::new(Some(q))
        .with(|h| h.legacy = true)
        .with(|h| h.on_allowed = true)
        .with(|h| h.draft = Draft::Ietf09);
    let d = Decision::allowed()
        .with_remaining(2)
        .with_reset_after_ns(1_000_000_001);
    assert_eq!(
        render(headers, d),
        [
            format!("ratelimit-policy: \"{name}\";q=7;w=3"),
            format!("ratelimit: \"{name}\";r=2;t=2"),
            "x-ratelimit-limit: 7".to_owned(),
            "x-ratelimit-remaining: 2".to_owned(),
            "x-ratelimit-reset: 2".to_owned(),
        ]
    );
}

// Pins G57.
#[test]
fn ceil_secs_rounds_up() {
    assert_eq!(ceil_secs(Duration::ZERO), 0);
    assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
    assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
    assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
}

// Pins G57.
#[test]
fn every_draft_renders_its_own_syntax() {
    // GCRA 1/s burst 5, three units spent: the next comes back in 0.5 s, all in 2.5 s.
    let q = QuotaPolicy::rate(1, Duration::from_secs(1))
        .with_burst(5)
        .refilling_every(Duration::from_secs(1));
    let d = Decision::allowed()
        .with_remaining(2)
        .with_reset_after_ns(2_500_000_000);
    let h = RateLimitHeaders::new(Some(q)).with(|h| h.on_allowed = true);
    assert_eq!(
        render(h, d),
        [
            r#"ratelimit-policy: "default";q=1;w=1;hotlimit-burst=5"#,
            r#"ratelimit: "default";r=2;t=1"#
        ]
    );
    assert_eq!(
        render(h.with(|h| h.draft = Draft::Ietf09), d),
        [
            r#"ratelimit-policy: "default";q=1;w=1;hotlimit-burst=5"#,
            r#"ratelimit: "default";r=2;t=3"#
        ]
    );
    assert_eq!(
        render(h.with(|h| h.draft = Draft::Ietf07), d),
        [
            "ratelimit-policy: 1;w=1;burst=5",
            "ratelimit: limit=1, remaining=2, reset=3"
        ]
    );
}

// Pins G58.
#[test]
fn t_of_draft_10_is_the_time_to_more_quota() {
    let s = |n: u64| n * 1_000_000_000;
    let gcra = RateLimitHeaders::new(Some(
        QuotaPolicy::rate(1, Duration::from_secs(2))
            .with_burst(10)
            .refilling_every(Duration::from_secs(2)),
    ))
    .with(|h| h.on_allowed = true);
    let t = |h: RateLimitHeaders, d: Decision| {
        h.verdict(d)
            .fields
            .unwrap()
            .t_nanos()
            .map(|ns| ns.div_ceil(s(1)))
    };
    // 7 s ahead with a 2 s unit: the next unit in 1 s; exactly 8 s ahead: in 2 s.
    let allowed = |reset| {
        Decision::allowed()
            .with_remaining(3)
            .with_reset_after_ns(reset)
    };
    assert_eq!(t(gcra, allowed(s(7))), Some(1));
    assert_eq!(t(gcra, allowed(s(8))), Some(2));
    assert_eq!(t(gcra, allowed(s(8) + 1)), Some(1));
    assert_eq!(t(gcra, allowed(0)), Some(0));
    // A denial: its retry_after, which Retry-After never undercuts.
    let denied = Decision::denied_ns(1_500_000_000)
        .with_remaining(0)
        .with_reset_after_ns(s(20));
    assert_eq!(t(gcra, denied), Some(2));
    assert_eq!(render(gcra, denied)[..1], ["retry-after: 2".to_owned()]);
    // Without a unit interval (a window), the time until the state is fresh.
    let window = RateLimitHeaders::new(Some(QuotaPolicy::new(10, Duration::from_secs(60))));
    assert_eq!(
        t(window.with(|h| h.on_allowed = true), allowed(s(7))),
        Some(7)
    );
    // No reset known, no t; no remaining known, no RateLimit at all.
    assert_eq!(
        t(
            window.with(|h| h.on_allowed = true),
            Decision::allowed().with_remaining(1)
        ),
        None
    );
    assert_eq!(
        render(window.with(|h| h.on_allowed = true), Decision::allowed()),
        [r#"ratelimit-policy: "default";q=10;w=60"#]
    );
}

// Pins G59.
#[test]
fn modes_decide_what_goes_out() {
    let h = RateLimitHeaders::new(Some(QuotaPolicy::new(10, Duration::from_secs(1))));
    let denied = Decision::denied_ns(300_000_000)
        .with_remaining(0)
        .with_reset_after_ns(900_000_000);
    let allowed = Decision::allowed().with_remaining(4).with_reset_after_ns(1);
    let v = h.verdict(denied);
    assert_eq!(v.action, Action::Answer(StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(render(h, denied).len(), 3);
    assert_eq!(h.verdict(allowed).fields().count(), 0);
    assert_eq!(render(h.with(|h| h.on_allowed = true), allowed).len(), 2);
    let dry = h.with(|h| h.mode = Mode::DryRun);
    assert_eq!(dry.verdict(denied).action, Action::Pass);
    assert_eq!(
        render(dry, denied),
        [
            r#"ratelimit-policy: "default";q=10;w=1"#,
            r#"ratelimit: "default";r=0;t=1"#
        ]
    );
    let shadow = h
        .with(|h| h.mode = Mode::Shadow)
        .with(|h| h.on_allowed = true);
    assert_eq!(shadow.verdict(denied).action, Action::Shadow(denied));
    assert!(render(shadow, denied).is_empty());
    assert_eq!(render(shadow, allowed).len(), 2);
    let big = h.with(|h| h.legacy = true).too_large();
    assert_eq!(big.action, Action::Answer(StatusCode::PAYLOAD_TOO_LARGE));
    assert_eq!(
        render_verdict(big),
        [
            r#"ratelimit-policy: "default";q=10;w=1"#,
            "x-ratelimit-limit: 10"
        ]
    );
    assert_eq!(dry.too_large().action, Action::Pass);
}

fn render_verdict(v: Verdict) -> Vec<String> {
    v.fields()
        .map(|f| {
            assert_eq!(f.list, f.name.as_str().starts_with("ratelimit"));
            format!("{}: {}", f.name, f.value.to_str().unwrap())
        })
        .collect()
}

// Pins G57.
#[test]
fn drafts_parse_and_print() {
    for d in [Draft::Ietf07, Draft::Ietf09, Draft::Ietf10] {
        assert_eq!(d.to_string().parse::<Draft>(), Ok(d));
    }
    assert_eq!("10".parse::<Draft>(), Ok(Draft::Ietf10));
    assert!("draft-11".parse::<Draft>().is_err());
}
