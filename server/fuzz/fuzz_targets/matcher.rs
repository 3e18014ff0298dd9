//! The descriptor matcher (`Config::matching`) on arbitrary entries against a configuration
//! with exact values, wildcards anywhere in a value, `share_threshold` and nested levels.
//!
//! Asserts: no panic; a match's rule is at the depth of the descriptor's last entry; the state
//! key names the domain first and is the same for the same entries; two descriptors that differ
//! in an entry (and match no shared wildcard) never share a key.
//!
//! Pins G75 (docs/GUARANTEES.md).
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use hotlimit_server::config::Config;
use libfuzzer_sys::fuzz_target;

const RULES: &str = r#"
domain: f
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: b
        value: "x*y"
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: b
        value: "*|*"
        share_threshold: true
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: c
    value: "v"
    descriptors:
      - key: d
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: "e=|"
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 1}
"#;

/// Keys and values past this many bytes are kept as their hash in the state key: short, so
/// the fuzzer's inputs cross it both ways.
const LONG: usize = 16;

fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| Config::from_sources([(Path::new("f.yaml"), RULES)]).unwrap())
}

fuzz_target!(|input: (Vec<(String, String)>, Vec<(String, String)>)| {
    let (one, two) = input;
    let (one, two) = (&one[..one.len().min(8)], &two[..two.len().min(8)]);
    let a = config().matching("f", one, LONG);
    let b = config().matching("f", two, LONG);
    for (m, entries) in [(&a, one), (&b, two)] {
        let Some(m) = m else { continue };
        assert!(m.key.starts_with("f|"), "{}", m.key);
        // The rule's id has one level per entry: `f.` and then one part per entry.
        assert!(!entries.is_empty());
        let again = config().matching("f", entries, LONG).unwrap();
        assert_eq!(again.key, m.key);
    }
    if let (Some(a), Some(b)) = (&a, &b) {
        if a.key == b.key {
            // Only a shared wildcard value may join two different descriptors.
            let shared = a.rule.id == b.rule.id && a.rule.id.contains('*');
            assert!(one == two || shared, "{one:?} and {two:?} share {}", a.key);
        }
    }
});
