//! An LLM gateway's token limit: tokens per minute per API key, a plan per key, the cost
//! estimated up front and settled with the real count when the response ends.
//!
//! A request's tokens are known only after the model answered. So the gateway takes the
//! estimate (prompt tokens + `max_tokens`) when the request arrives (`take`, under the
//! key's plan), and settles with the real count (`settle`): unused tokens come back at
//! once, and a response that ran past its estimate is charged anyway, past the burst if need
//! be (a debt the key pays before its next admission). One limiter serves every plan.
//!
//! Two simulated minutes of traffic on a manual clock (deterministic, instant):
//!
//! ```text
//! cargo run --example llm_tokens
//! ```

use hotlimit::algo::Gcra;
use hotlimit::Requests;
use hotlimit::{CasLimiter, ManualClock};
use std::collections::BTreeMap;
use std::time::Duration;

/// A plan: tokens per minute, with a burst of one minute's worth.
fn plan(tokens_per_minute: u64) -> Gcra {
    format!("{tokens_per_minute}/min")
        .parse()
        .expect("a valid plan")
}

/// What the gateway saw for one API key.
#[derive(Default)]
struct Tally {
    admitted: u64,
    denied: u64,
    estimated: u64,
    used: u64,
}

fn main() {
    let plans = BTreeMap::from([("free", plan(2_000)), ("pro", plan(100_000))]);
    let keys = [
        ("key-alice", "pro"),
        ("key-bob", "free"),
        ("key-carol", "free"),
    ];
    let clock = ManualClock::default();
    // The limiter's own quota is the smallest plan; every request brings its key's.
    let limiter = CasLimiter::<String, Gcra, _>::with_clock(plans["free"], clock.clone());
    let mut tally: BTreeMap<&str, Tally> = BTreeMap::new();

    // A request every 250 ms, round robin over the keys, for two minutes; prompts of 200 to
    // 1,000 tokens, `max_tokens` 1,000, responses of 50 to 1,200 tokens (a few overrun the
    // estimate: a client that did not set max_tokens).
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for i in 0..480u64 {
        clock.advance(Duration::from_millis(250));
        let (key, plan_name) = keys[(i % keys.len() as u64) as usize];
        let quota = &plans[plan_name];
        let prompt = 200 + next(800);
        let estimate = prompt + 1_000;
        let t = tally.entry(key).or_default();
        let mut ticket = match limiter.request(key).cost(estimate).quota(quota).take() {
            Ok(ticket) if ticket.decision().is_allowed() => ticket,
            // A 429 whose Retry-After is `denied.decision().retry_after()`.
            Ok(_denied) => {
                t.denied += 1;
                continue;
            }
            // An estimate beyond the plan's burst could never pass: a 400, not a 429.
            Err(e) => {
                println!("{key}: refused ({e})");
                t.denied += 1;
                continue;
            }
        };
        // ... the model streams its answer; then the real count is known.
        let generated = 50 + next(1_150);
        let used = prompt + generated;
        limiter
            .request(key)
            .quota(quota)
            .settle(&mut ticket, used)
            .expect("the plan reads the limiter's states");
        t.admitted += 1;
        t.estimated += estimate;
        t.used += used;
    }

    let minutes = 2;
    println!(
        "{minutes} minutes, a request every 250 ms round robin over {} keys",
        keys.len()
    );
    println!(
        "{:<10} {:>5} {:>8} {:>6} {:>10} {:>8} {:>10}",
        "key", "plan", "admitted", "denied", "estimated", "used", "allowance"
    );
    for (key, plan_name) in keys {
        let t = &tally[key];
        // GCRA's bound: one burst (a minute's worth) plus the rate over the run.
        let per_minute = 60_000_000_000 / plans[plan_name].emission_interval().as_nanos() as u64;
        let allowance = per_minute * (minutes + 1);
        println!(
            "{key:<10} {plan_name:>5} {:>8} {:>6} {:>10} {:>8} {allowance:>10}",
            t.admitted, t.denied, t.estimated, t.used
        );
        // Settling charged what was really used: never more than the allowance, except for the
        // last response's overrun, which the key still owes.
        assert!(t.used <= allowance + 1_200, "{key} used more than its plan");
    }
    let (bob, carol) = (&tally["key-bob"], &tally["key-carol"]);
    println!(
        "the free keys were admitted for {} estimated tokens and charged the {} they used: \
         the refunds made room for requests their estimates alone would have shut out",
        bob.estimated + carol.estimated,
        bob.used + carol.used,
    );
}
