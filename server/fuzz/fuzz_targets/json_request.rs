//! The JSON API's request decoder (`http::decode`) on arbitrary bytes: what `/json` and
//! `/v1/check` read from any client.
//!
//! Asserts: no panic; a refusal is an `Invalid` with a message; an accepted request's
//! `hitsAddend` fits its `uint32`, and its descriptors' entries are the body's.
//!
//! Pins G75 (docs/GUARANTEES.md).
#![no_main]

use hotlimit_server::http::decode;
use hotlimit_server::service::ServiceError;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match decode(data) {
        Ok(request) => {
            let n: usize = request.descriptors.iter().map(|d| d.entries.len()).sum();
            assert!(n <= data.len(), "more entries than bytes");
        }
        Err(ServiceError::Invalid(_, message)) => assert!(!message.is_empty()),
        Err(other) => panic!("a decoder error that is not Invalid: {other:?}"),
    }
});
