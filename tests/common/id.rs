//! A `u64` key of the tests' own: a `CasLimiter` or `MutexLimiter` of `u64` keys is the
//! compact table (`store::Map`), of any other key type the papaya map, so the tests of the
//! papaya store key it by `Id`.

/// A `u64` held by the papaya map, bounded or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Id(pub u64);

impl From<u64> for Id {
    fn from(k: u64) -> Self {
        Id(k)
    }
}
