//! Which keys a [`Map`](super::Map) holds in the compact table: those whose slot there
//! is lock-free, as the map's cell is. A key type the compact store holds exactly in 64 bits
//! (`u64`, `u32`, `Ipv4Addr`), told apart by `TypeId`, under an algorithm whose state is one
//! 64-bit word (GCRA, EARRRL, the fixed window, in-flight): key and state share one 128-bit
//! word, updated by one CAS. (A 128-bit key or state takes a per-slot lock in the table,
//! where the map's cell is a 16-byte CAS: those stay in the map.) The key's 64-bit form is
//! read from its own `Hash` stream.
//!
//! Why the `Hash` stream: a look-up names the key by `&Q` where `K: Borrow<Q>`, and `Q` may be
//! unsized, so it cannot be downcast; but `Borrow` requires `Q` to hash as `K` does, and each
//! of these types hashes as one integer, which the [`Capture`] hasher keeps whole. The unit
//! tests pin each type's stream.

use crate::algo::sealed::Sealed;
use std::any::TypeId;
use std::hash::{Hash, Hasher};
use std::net::Ipv4Addr;

/// Whether a map of `K` keys and `S` states may be the compact table, as far as the
/// compiler can tell from sizes: a one-word state, a key of at most 8 bytes. A constant when
/// the code is generated, so a map of any other compiles no table code (`if const`: its
/// branches are never generated), which would otherwise stand beside the algorithm's step
/// and change what the compiler inlines (the direct limiter's sliding window check in the
/// instruction bench went from 173 to 237 with it).
pub(crate) const fn may_route<K, S: Sealed>() -> bool {
    S::WORD64 && std::mem::size_of::<K>() <= 8
}

/// Whether keys of type `K` have a 64-bit form the compact table holds exactly: `u64`,
/// `u32`, `Ipv4Addr` (a constant once monomorphized).
#[inline(always)]
pub(crate) fn narrow<K: 'static>() -> bool {
    let k = TypeId::of::<K>();
    k == TypeId::of::<u64>() || k == TypeId::of::<u32>() || k == TypeId::of::<Ipv4Addr>()
}

/// A hasher that keeps the last integer it is fed (bytes written raw are appended to it).
#[derive(Default)]
struct Capture(u64);

impl Hasher for Capture {
    fn finish(&self) -> u64 {
        self.0
    }

    /// Not how these types hash; appended, so that a short stream of raw bytes still maps one
    /// to one.
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    #[inline(always)]
    fn write_u8(&mut self, n: u8) {
        self.0 = n.into();
    }

    #[inline(always)]
    fn write_u16(&mut self, n: u16) {
        self.0 = n.into();
    }

    #[inline(always)]
    fn write_u32(&mut self, n: u32) {
        self.0 = n.into();
    }

    #[inline(always)]
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    #[inline(always)]
    fn write_usize(&mut self, n: usize) {
        self.0 = n as u64;
    }
}

/// The 64-bit form of a key of a type [`narrow`] accepts: the integer its `Hash` writes.
#[inline(always)]
pub(crate) fn form<Q: Hash + ?Sized>(key: &Q) -> u64 {
    let mut c = Capture::default();
    key.hash(&mut c);
    c.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::net::{IpAddr, Ipv6Addr};

    #[test]
    fn only_one_word_states_beside_small_keys_may_route() {
        assert!(may_route::<u64, u64>());
        assert!(may_route::<Ipv4Addr, u64>());
        assert!(!may_route::<u64, u128>());
        assert!(!may_route::<String, u64>());
    }

    #[test]
    fn only_keys_of_64_bits_have_a_narrow_form() {
        assert!(narrow::<u64>());
        assert!(narrow::<u32>());
        assert!(narrow::<Ipv4Addr>());
        // 128 bits: a locked slot in the table, a CAS in the map.
        assert!(!narrow::<u128>());
        assert!(!narrow::<Ipv6Addr>());
        assert!(!narrow::<IpAddr>());
        assert!(!narrow::<i64>());
        assert!(!narrow::<String>());
        assert!(!narrow::<(u32, u32)>());
    }

    /// The forms are the keys themselves, one to one.
    #[test]
    fn forms_are_exact() {
        for k in [0u64, 1, 7, u64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(form(&k), k);
            assert_eq!(form(&(k as u32)), u64::from(k as u32));
        }
        let fours = [
            Ipv4Addr::new(203, 0, 113, 7),
            Ipv4Addr::new(7, 113, 0, 203),
            Ipv4Addr::new(203, 0, 113, 8),
            Ipv4Addr::BROADCAST,
            Ipv4Addr::UNSPECIFIED,
        ];
        let mut seen = HashSet::new();
        for a in fours {
            assert!(seen.insert(form(&a)), "{a}: two addresses, one form");
            assert!(
                form(&a) <= u64::from(u32::MAX),
                "{a}: more than its 32 bits"
            );
        }
    }
}
