//! The parts the limiters' signatures name: [`Builder`], the one builder shape of every
//! limiter; how a store keeps each key's state ([`Cas`] or [`Locked`], through [`Variant`]); the key
//! types of the compact store ([`Hashed`], [`CompactKey`]) and its table's shape
//! ([`ProbeStats`]); and what a limiter of your own is handed
//! ([`Ask`]). The limiters themselves are at the crate root.

pub use crate::compact::Compact;
pub use crate::compact::{CompactKey, Hashed, ProbeStats, DEFAULT_MAX_KEYS};
pub use crate::direct::Single;
pub use crate::keyed::Map;
pub use crate::limiter::{Cas, Locked, Variant};
pub use crate::ops::{Keys, Store};
pub use crate::request::Ask;
pub use crate::shared::{Builder, KeyedStore};
