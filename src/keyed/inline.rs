//! Which keys a bounded [`Map`](super::Map) holds in the compact table: those whose slot there
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

use crate::algo::Algorithm;
use crate::clock::Clock;
use crate::compact::{At as CompactAt, Compact};
use crate::decision::Decision;
use crate::error::{BuildError, CostError};
use crate::limiter::Variant;
use crate::ops::sealed::{Lookup, Table};
use crate::shared::{Core, KeyState, Options};
use crate::stats::Metrics;
use crate::sweeper::Sweeper;
use std::any::TypeId;
use std::hash::{Hash, Hasher};
use std::net::Ipv4Addr;

/// Whether keys of type `K` have a 64-bit form the compact table holds exactly (a constant
/// once monomorphized).
#[inline(always)]
pub(crate) fn narrow<K: 'static>() -> bool {
    let k = TypeId::of::<K>();
    k == TypeId::of::<u64>() || k == TypeId::of::<u32>() || k == TypeId::of::<Ipv4Addr>()
}

/// Where a bounded map holds a state type beside 64-bit keys: for a one-word state (`u64`)
/// the compact table, for any other [`Never`], so that a map of such states compiles no table
/// code and its route costs nothing (its `Compact` variant cannot exist). Sealed with
/// [`State`](crate::algo::State).
pub trait Narrow: Sized + 'static {
    /// The table.
    type Table<A: Algorithm<State = Self>, C: Clock, V: Variant<A>>: Table64<A, C, V>;
}

impl Narrow for u64 {
    type Table<A: Algorithm<State = u64>, C: Clock, V: Variant<A>> = Compact<u64, A, C, V>;
}

macro_rules! never_narrow {
    ($($t:ty $(, <$($g:ident),*>)?);*) => {
        $(impl$(<$($g: crate::algo::State),*>)? Narrow for $t {
            type Table<A: Algorithm<State = Self>, C: Clock, V: Variant<A>> = Never;
        })*
    };
}
never_narrow!(u128; crate::algo::LogState; crate::algo::BucketState; crate::algo::PairState<X, Y>, <X, Y>);

/// No table: what a map of states the compact table cannot hold lock-free routes to.
#[derive(Debug)]
pub enum Never {}

/// A compact table of 64-bit key forms, as a [`Map`](super::Map) reaches it.
pub trait Table64<A: Algorithm, C: Clock, V: Variant<A>>: Sized + Send + Sync + 'static {
    /// A key's slot, located once.
    type At<'a>: KeyState<A::State>;

    /// The table, or the algorithm and clock back where there is none.
    #[allow(clippy::type_complexity)]
    fn build(
        algo: A,
        clock: C,
        options: &Options,
    ) -> Result<Result<(Self, Option<Sweeper>), BuildError>, (A, C)>;
    fn core(&self) -> &Core<A, C>;
    fn table(&self) -> &'static str;
    fn keys(&self) -> usize;
    fn sweep(&self) -> Metrics;
    fn sweep_totals(&self) -> Metrics;
    fn at(&self, form: u64) -> Self::At<'_>;
    fn check(&self, form: u64, cost: u64) -> Decision;
    fn decide(&self, algo: &A, form: u64, cost: u64, now: u64) -> Decision;
    fn peek(&self, algo: &A, form: u64, cost: u64, now: u64) -> Decision;
    fn decide_batch<'k, Q: ?Sized + 'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k Q, u64)>,
        form: impl Fn(&Q) -> u64,
        valid: impl Fn(u64) -> Result<(), CostError>,
        emit: impl FnMut(Result<Decision, CostError>),
    );
}

impl<A: Algorithm, C: Clock, V: Variant<A>> Table64<A, C, V> for Compact<u64, A, C, V> {
    type At<'a> = CompactAt<'a, u64, A, C, V>;

    fn build(
        algo: A,
        clock: C,
        options: &Options,
    ) -> Result<Result<(Self, Option<Sweeper>), BuildError>, (A, C)> {
        Ok(<Self as Table>::build(algo, clock, options))
    }

    #[inline(always)]
    fn core(&self) -> &Core<A, C> {
        Table::core(self)
    }

    fn table(&self) -> &'static str {
        Table::table(self)
    }

    fn keys(&self) -> usize {
        Table::keys(self)
    }

    fn sweep(&self) -> Metrics {
        Table::sweep(self)
    }

    fn sweep_totals(&self) -> Metrics {
        Table::sweep_totals(self)
    }

    #[inline(always)]
    fn at(&self, form: u64) -> Self::At<'_> {
        CompactAt::new(&self.0, &form)
    }

    #[inline(always)]
    fn check(&self, form: u64, cost: u64) -> Decision {
        Lookup::check(self, &form, cost)
    }

    #[inline(always)]
    fn decide(&self, algo: &A, form: u64, cost: u64, now: u64) -> Decision {
        Lookup::decide(self, algo, &form, cost, now)
    }

    #[inline]
    fn peek(&self, algo: &A, form: u64, cost: u64, now: u64) -> Decision {
        Lookup::peek(self, algo, &form, cost, now)
    }

    #[inline(always)]
    fn decide_batch<'k, Q: ?Sized + 'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k Q, u64)>,
        form: impl Fn(&Q) -> u64,
        valid: impl Fn(u64) -> Result<(), CostError>,
        emit: impl FnMut(Result<Decision, CostError>),
    ) {
        let locate = |key: &Q| self.0.locate(&form(key));
        self.decide_batch_by(requests, locate, valid, emit);
    }
}

impl<S> KeyState<S> for Never {
    fn apply<T>(&self, _: impl FnMut(&mut S) -> T) -> T {
        match *self {}
    }

    fn key_print(&self) -> u64 {
        match *self {}
    }
}

impl<A: Algorithm, C: Clock, V: Variant<A>> Table64<A, C, V> for Never {
    type At<'a> = Never;

    fn build(
        algo: A,
        clock: C,
        _: &Options,
    ) -> Result<Result<(Self, Option<Sweeper>), BuildError>, (A, C)> {
        Err((algo, clock))
    }
    fn core(&self) -> &Core<A, C> {
        match *self {}
    }
    fn table(&self) -> &'static str {
        match *self {}
    }
    fn keys(&self) -> usize {
        match *self {}
    }
    fn sweep(&self) -> Metrics {
        match *self {}
    }
    fn sweep_totals(&self) -> Metrics {
        match *self {}
    }
    fn at(&self, _: u64) -> Never {
        match *self {}
    }
    fn check(&self, _: u64, _: u64) -> Decision {
        match *self {}
    }
    fn decide(&self, _: &A, _: u64, _: u64, _: u64) -> Decision {
        match *self {}
    }
    fn peek(&self, _: &A, _: u64, _: u64, _: u64) -> Decision {
        match *self {}
    }
    fn decide_batch<'k, Q: ?Sized + 'k>(
        &self,
        _: impl IntoIterator<Item = (&'k Q, u64)>,
        _: impl Fn(&Q) -> u64,
        _: impl Fn(u64) -> Result<(), CostError>,
        _: impl FnMut(Result<Decision, CostError>),
    ) {
        match *self {}
    }
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

/// The 64-bit form of a key of a type [`compact`] takes: the integer its `Hash` writes.
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
