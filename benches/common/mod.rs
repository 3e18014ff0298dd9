//! Helpers the benches share (`mod common;` in each; not a bench target itself). Each bench
//! uses a part, hence the `dead_code` allowance.
#![allow(dead_code)]

use hotlimit::algo::Gcra;

/// A quota no benchmark exhausts: 1 event per ns with a burst of 2^40, so every request
/// takes the write path (a CAS or a locked store).
pub fn gcra() -> Gcra {
    "1000000000/s burst 1099511627776".parse().unwrap()
}

/// The key flood of `tests/flood.rs`, shared so the bench times what the test asserts.
#[path = "../../tests/common/flood.rs"]
pub mod flood;

/// The sharded `Mutex<HashMap>` baseline.
pub mod sharded;

#[allow(unused_imports)] // not every bench measures memory
pub use flood::rss_bytes;
