//! Helpers the benches share (`mod common;` in each; not a bench target itself). Each bench
//! uses a part, hence the `dead_code` allowance.
#![allow(dead_code)]

use hotlimit::algo::Gcra;

/// A quota no benchmark exhausts: 1 event per ns with a burst of 2^40, so every request
/// takes the write path (a CAS or a locked store).
pub fn gcra() -> Gcra {
    "1000000000/s burst 1099511627776".parse().unwrap()
}

/// This process's resident set size in bytes (Linux `/proc/self/statm`; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
