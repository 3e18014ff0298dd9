//! The key types the compact store holds inline.

use super::slot::KeyRepr;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A key type the compact store can hold inline: it maps to a fixed-size form (`u64` or
/// `u128`). Sealed: a key type of your own is held as a [`Hashed`] key.
///
/// Implemented for `u32`, `u64`, `u128`, [`Ipv4Addr`], [`Ipv6Addr`], [`IpAddr`] (IPv4 as its
/// IPv4-mapped IPv6 address, so `203.0.113.7` and `::ffff:203.0.113.7` are one key) — all
/// exact — and for [`Hashed<T>`], a 64-bit keyed hash of any `T: Hash`.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CompactLimiter, ManualClock, RateLimiter};
///
/// let l = CompactLimiter::<u64, Gcra, _>::with_clock("1/s".parse()?, ManualClock::default());
/// assert!(l.check(&42).is_allowed());
/// assert!(l.check(&42).is_denied());
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait CompactKey: sealed::Inline {}

impl<K: sealed::Inline> CompactKey for K {}

/// How a key type becomes its inline form: the crate's own (sealed; a type of yours is a
/// [`Hashed`] key).
pub(crate) mod sealed {
    use super::KeyRepr;

    /// A key type's inline form and how to compute it.
    pub trait Inline: 'static {
        /// The inline form.
        type Repr: KeyRepr;
        /// What a request names the key by (`str` for a `Hashed<str>`).
        type Lookup: ?Sized;
        /// The inline form of `key`. `hasher` is the limiter's seeded hasher, used by
        /// [`Hashed`](super::Hashed).
        fn repr(key: &Self::Lookup, hasher: &ahash::RandomState) -> Self::Repr;

        /// The 64-bit hash that places `repr` in the table (its home line and first slot):
        /// `repr` hashed with the limiter's seeded `hasher`. A [`Hashed`](super::Hashed) key
        /// is such a hash already and is its own placement, so a check hashes it once.
        #[inline(always)]
        fn place(repr: Self::Repr, hasher: &ahash::RandomState) -> u64 {
            hasher.hash_one(repr)
        }
    }
}

use sealed::Inline;

impl Inline for u64 {
    type Repr = u64;
    type Lookup = u64;
    #[inline(always)]
    fn repr(key: &u64, _: &ahash::RandomState) -> u64 {
        *key
    }
}

impl Inline for u32 {
    type Repr = u64;
    type Lookup = u32;
    #[inline(always)]
    fn repr(key: &u32, _: &ahash::RandomState) -> u64 {
        u64::from(*key)
    }
}

impl Inline for u128 {
    type Repr = u128;
    type Lookup = u128;
    #[inline(always)]
    fn repr(key: &u128, _: &ahash::RandomState) -> u128 {
        *key
    }
}

impl Inline for Ipv4Addr {
    type Repr = u64;
    type Lookup = Ipv4Addr;
    #[inline(always)]
    fn repr(key: &Ipv4Addr, _: &ahash::RandomState) -> u64 {
        u64::from(key.to_bits())
    }
}

impl Inline for Ipv6Addr {
    type Repr = u128;
    type Lookup = Ipv6Addr;
    #[inline(always)]
    fn repr(key: &Ipv6Addr, _: &ahash::RandomState) -> u128 {
        key.to_bits()
    }
}

impl Inline for IpAddr {
    type Repr = u128;
    type Lookup = IpAddr;
    #[inline(always)]
    fn repr(key: &IpAddr, _: &ahash::RandomState) -> u128 {
        match key {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().to_bits(),
            IpAddr::V6(v6) => v6.to_bits(),
        }
    }
}

/// Opt-in key mode: any `T: Hash` (strings, tuples, structs), kept as a 64-bit hash keyed by
/// the limiter's per-process random seed.
///
/// Two distinct keys with the same 64-bit hash share one state (each sees the other's
/// requests). With `n` keys held at once the chance that any two collide is about
/// `n² / 2^65`: 3·10^-8 for a million keys, 3·10^-6 for ten million. The seed is secret and
/// per process, so a client cannot aim for a collision; use the papaya store
/// ([`CasLimiter`](crate::CasLimiter)) where even that is too much.
///
/// ```
/// use hotlimit::{algo::Gcra, store::Hashed, CompactLimiter, ManualClock, RateLimiter};
///
/// let l = CompactLimiter::<Hashed<str>, Gcra, _>::with_clock("10/s burst 1".parse()?, ManualClock::default());
/// assert!(l.check("alice").is_allowed());
/// assert!(l.check("alice").is_denied());
/// assert!(l.check("bob").is_allowed());
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub struct Hashed<T: ?Sized>(PhantomData<fn(&T)>);

impl<T: ?Sized> fmt::Debug for Hashed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hashed")
    }
}

impl<T: Hash + ?Sized + 'static> Inline for Hashed<T> {
    type Repr = u64;
    type Lookup = T;
    #[inline(always)]
    fn repr(key: &T, hasher: &ahash::RandomState) -> u64 {
        hasher.hash_one(key)
    }

    /// Already a seeded 64-bit hash: uniform and unknown to clients, so used as is.
    #[inline(always)]
    fn place(repr: u64, _: &ahash::RandomState) -> u64 {
        repr
    }
}
