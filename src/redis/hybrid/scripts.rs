//! The hybrid limiter's two Lua scripts (`src/redis/lua/`). Each reads Redis' `TIME` itself,
//! so every instance's reservations and publishes share the server's timeline, and each ends
//! by publishing what it wrote to every instance (see `push.rs`).

/// GCRA: leases, hand-backs and charges (`hybrid_lease.lua`).
pub(super) const LEASE: &str = include_str!("../lua/hybrid_lease.lua");

/// Merged states: publish this instance's, push the whole hashes (`hybrid_publish.lua`).
pub(super) const PUBLISH: &str = include_str!("../lua/hybrid_publish.lua");
