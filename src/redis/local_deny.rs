//! The local fast path of the Redis clients: keys denied recently, denied again without a
//! round trip until their wait is over (`RedisBuilder::local_deny`).

use crate::decision::Decision;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Recently denied keys: `key → (deny until, cost, explicit timeline)`.
pub(super) struct LocalDeny {
    max: usize,
    map: Mutex<HashMap<String, (u64, u64, bool)>>,
    origin: Instant,
}

impl LocalDeny {
    /// Remembering at most `max` keys.
    pub(super) fn new(max: usize) -> Self {
        LocalDeny {
            max,
            map: Mutex::new(HashMap::new()),
            origin: Instant::now(),
        }
    }

    pub(super) fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub(super) fn lookup(
        &self,
        key: &str,
        cost: u64,
        now: u64,
        explicit: bool,
    ) -> Option<Decision> {
        let map = self.map.lock();
        let &(until, c, e) = map.get(key)?;
        (c == cost && e == explicit && until > now)
            .then(|| Decision::denied(Duration::from_nanos(until - now)))
    }

    /// The keys it holds.
    pub(super) fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub(super) fn forget(&self, key: &str) {
        let mut map = self.map.lock();
        if !map.is_empty() {
            map.remove(key);
        }
    }

    pub(super) fn remember(&self, key: &str, cost: u64, until: u64, explicit: bool) {
        let mut map = self.map.lock();
        if map.len() >= self.max && !map.contains_key(key) {
            let now = self.now();
            map.retain(|_, &mut (u, _, e)| if e { true } else { u > now });
            if map.len() >= self.max {
                // Still full: forget everything rather than grow (only round trips are lost).
                map.clear();
            }
        }
        map.insert(key.to_owned(), (until, cost, explicit));
    }
}
