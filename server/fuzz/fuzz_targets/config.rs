//! envoyproxy/ratelimit's YAML configuration on arbitrary text: the parser and its checks
//! (`Config::from_sources`, serde-saphyr within its budget).
//!
//! Asserts: no panic, no hang (libFuzzer's timeout); a refusal names the file and has a
//! reason, and its line and column, where given, are 1-based; an accepted configuration's
//! rules each have a domain and an id under it.
//!
//! Pins G75 (docs/GUARANTEES.md).
#![no_main]

use std::path::Path;

use hotlimit_server::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_sources([(Path::new("f.yaml"), text)]) {
        Ok(config) => {
            for rule in config.rules() {
                assert!(!rule.domain.is_empty());
                assert!(rule.id.starts_with(&format!("{}.", rule.domain)), "{}", rule.id);
            }
        }
        Err(e) => {
            assert_eq!(e.file, Path::new("f.yaml"));
            assert!(!e.reason.is_empty());
            if let Some((line, column)) = e.location {
                assert!(line >= 1 && column >= 1, "{e}");
            }
        }
    }
});
