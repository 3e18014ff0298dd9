//! The parts the limiters' signatures name: [`Builder`], the one builder shape of every
//! limiter; the [`Variant`] and [`CompactVariant`] of a store; the key types of the compact
//! store; what a sweep reports. The limiters themselves are at the crate root.

pub use crate::compact::{
    CompactKey, CompactState, CompactVariant, KeyRepr, ProbeStats, Slot, DEFAULT_MAX_KEYS,
};
pub use crate::keyed::Pinned;
pub use crate::limiter::Variant;
pub use crate::shared::{Builder, KeyedStore};
pub use crate::sweeper::{SweepReport, SweepTotals};
