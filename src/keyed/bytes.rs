//! `String` keys as a [`Map`](super::Map) keeps them: the bytes inline in the map's node up
//! to [`INLINE`] bytes, so a look-up compares the key where it found the node, without
//! following a `String`'s pointer to another allocation (one dependent cache miss fewer a
//! check among keys that do not fit the cache, and one allocation fewer a key).
//!
//! A look-up names its key by `&Q` (`str` or `String`), which cannot be downcast; both hash
//! as `str` does, one `write` of the bytes and a `write_u8(0xff)` (a byte UTF-8 never holds,
//! so the stream is the key, one to one). [`KeyView`] reads the key from that stream to hash,
//! compare and copy it, and [`KeyBytes`] hashes as that stream: the unit tests pin it.

use papaya::Equivalent;
use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

/// Bytes a key keeps inline: with its length byte and the tag, as large as a `String`.
pub(crate) const INLINE: usize = 22;

/// Whether a map of `K` keys may hold them as [`KeyBytes`], as far as the compiler can tell
/// from sizes (a `String`'s): a constant when the code is generated, so that a map of any
/// other key compiles none of this route's code beside its own, which changed what the
/// compiler inlined (the compact table's one-key check: 177 instructions to 193).
pub(crate) const fn may_hold<K>() -> bool {
    std::mem::size_of::<K>() == std::mem::size_of::<String>()
        && std::mem::align_of::<K>() == std::mem::align_of::<String>()
}

/// The byte that ends a `str`'s hash stream.
const END: u8 = 0xff;

/// Whether a `str` hashes as this module reads it, asked of the running build once per
/// limiter: one `write` of its bytes, then `write_u8(0xff)` (std's `Hasher::write_str`
/// default). A toolchain whose `str` streamed otherwise would find no key it holds, and so
/// reset every limit; on one, a map of `String` keys keeps them as `String`s instead.
pub(crate) fn str_streams_its_bytes() -> bool {
    /// The calls a hasher gets, as bytes: a `write`'s own, `[0, n]` for a `write_u8(n)`;
    /// any other call (a length prefix) comes as a `write` of its bytes, by its default.
    #[derive(Default)]
    struct Calls(Vec<u8>);
    impl Hasher for Calls {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.extend_from_slice(bytes);
        }
        fn write_u8(&mut self, n: u8) {
            self.0.extend_from_slice(&[0, n]);
        }
    }
    let mut calls = Calls::default();
    "ab".hash(&mut calls);
    calls.0 == [b'a', b'b', 0, END]
}

/// A key's bytes as the map holds them.
#[derive(Clone, PartialEq, Eq)]
pub enum KeyBytes {
    /// Up to [`INLINE`] bytes, in the node.
    Inline(u8, [u8; INLINE]),
    /// A longer key, in an allocation of its own (as a `String`'s).
    Boxed(Box<[u8]>),
}

impl KeyBytes {
    #[inline]
    fn as_bytes(&self) -> &[u8] {
        match self {
            KeyBytes::Inline(len, bytes) => &bytes[..usize::from(*len)],
            KeyBytes::Boxed(bytes) => bytes,
        }
    }
}

impl std::fmt::Debug for KeyBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        String::from_utf8_lossy(self.as_bytes()).fmt(f)
    }
}

/// As the key's `str` hashes (its stream, call by call), so that a [`KeyView`] of the same
/// key finds it.
impl Hash for KeyBytes {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.as_bytes());
        state.write_u8(END);
    }
}

/// A key to look up among [`KeyBytes`]: the caller's `&str` or `&String`, read through its
/// hash stream.
// Not `Debug`: a handle that lives inside one request, never shown.
#[allow(missing_debug_implementations)]
pub struct KeyView<'a, Q: ?Sized>(pub(crate) &'a Q);

impl<Q: ?Sized> Clone for KeyView<'_, Q> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Q: ?Sized> Copy for KeyView<'_, Q> {}

/// The key's own stream, passed on call by call: the same calls as [`KeyBytes`]' hash makes
/// for the same key, whatever the hasher does with a whole `str`.
impl<Q: Hash + ?Sized> Hash for KeyView<'_, Q> {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(&mut Forward(state));
    }
}

impl<Q: Hash + ?Sized> Equivalent<KeyBytes> for KeyView<'_, Q> {
    #[inline]
    fn equivalent(&self, key: &KeyBytes) -> bool {
        let mut compare = Compare {
            rest: Some(key.as_bytes()),
            ended: false,
        };
        self.0.hash(&mut compare);
        compare.rest == Some(&[]) && compare.ended
    }
}

/// Passes each call on to the hasher it wraps. Not `write_str` (not stable to override): a
/// `str` comes through as its default, `write` and `write_u8(0xff)`.
struct Forward<'h, H>(&'h mut H);

impl<H: Hasher> Hasher for Forward<'_, H> {
    fn finish(&self) -> u64 {
        self.0.finish()
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.0.write_u8(n);
    }
}

/// Follows a key's stream against a held key's bytes: `rest` is what is left of them
/// (`None` once the stream differs), `ended` whether the stream's end came, last.
struct Compare<'k> {
    rest: Option<&'k [u8]>,
    ended: bool,
}

impl Hasher for Compare<'_> {
    fn finish(&self) -> u64 {
        0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.rest = match self.rest {
            Some(rest) if !self.ended && rest.starts_with(bytes) => Some(&rest[bytes.len()..]),
            _ => None,
        };
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        if n != END || self.ended {
            self.rest = None;
        }
        self.ended = true;
    }
}

/// Collects a key's bytes from its stream (its end dropped): inline while they fit, so a
/// short key's insert allocates nothing but the map's node.
struct Collect {
    inline: [u8; INLINE],
    len: usize,
    spilled: Vec<u8>,
}

impl Hasher for Collect {
    fn finish(&self) -> u64 {
        0
    }

    fn write(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if self.spilled.is_empty() && end <= INLINE {
            self.inline[self.len..end].copy_from_slice(bytes);
        } else {
            if self.spilled.is_empty() {
                self.spilled.extend_from_slice(&self.inline[..self.len]);
            }
            self.spilled.extend_from_slice(bytes);
        }
        self.len = end;
    }

    fn write_u8(&mut self, n: u8) {
        debug_assert_eq!(
            n, END,
            "a str's stream ends with 0xff, and holds no other u8"
        );
    }
}

/// A key the papaya map's look-ups and inserts take for its keys `K`: any `Q` that `K`
/// borrows as (the map of any key), or a [`KeyView`] (the map of `String` keys, held as
/// [`KeyBytes`]).
pub(crate) trait ToKey<K>: Hash + Equivalent<K> {
    /// The key to insert.
    fn to_key(&self) -> K;
}

impl<K, Q> ToKey<K> for Q
where
    K: Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    #[inline]
    fn to_key(&self) -> K {
        self.to_owned()
    }
}

impl<Q: Hash + ?Sized> ToKey<KeyBytes> for KeyView<'_, Q> {
    fn to_key(&self) -> KeyBytes {
        let mut collect = Collect {
            inline: [0; INLINE],
            len: 0,
            spilled: Vec::new(),
        };
        self.0.hash(&mut collect);
        match u8::try_from(collect.len) {
            Ok(len) if collect.len <= INLINE => KeyBytes::Inline(len, collect.inline),
            _ => KeyBytes::Boxed(collect.spilled.into_boxed_slice()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a hasher is told, call by call.
    #[derive(Default)]
    struct Record(Vec<String>);

    impl Hasher for Record {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.push(format!("write {bytes:?}"));
        }
        fn write_u8(&mut self, n: u8) {
            self.0.push(format!("write_u8 {n}"));
        }
    }

    fn record(h: &(impl Hash + ?Sized)) -> Vec<String> {
        let mut r = Record::default();
        h.hash(&mut r);
        r.0
    }

    /// The stream this module reads keys from: a `str` and a `String` hash as one `write`
    /// of the bytes and a `write_u8(0xff)`, and a held key hashes the same.
    #[test]
    fn a_str_streams_its_bytes_and_an_end() {
        let expected = vec!["write [97, 98]".to_string(), "write_u8 255".to_string()];
        assert_eq!(record("ab"), expected);
        assert_eq!(record(&String::from("ab")), expected);
        assert_eq!(record(&KeyView("ab")), expected);
        assert_eq!(record(&KeyView("ab").to_key()), expected);
        assert_eq!(record(&KeyView("")), record(&KeyView("").to_key()));
        assert!(str_streams_its_bytes());
    }

    /// Equal keys are equivalent and hash alike, inline or boxed; a prefix, an extension or
    /// a different byte is not equivalent.
    #[test]
    fn views_find_exactly_their_keys() {
        let hasher = ahash::RandomState::new();
        let long = "k".repeat(INLINE + 1);
        for key in ["", "a", "user:0000012345", &"x".repeat(INLINE), &long] {
            let held = KeyView(key).to_key();
            assert_eq!(
                matches!(held, KeyBytes::Inline(..)),
                key.len() <= INLINE,
                "{key}"
            );
            assert_eq!(held.as_bytes(), key.as_bytes());
            assert!(KeyView(key).equivalent(&held), "{key}");
            assert!(KeyView(&key.to_string()).equivalent(&held), "{key}");
            assert_eq!(hasher.hash_one(KeyView(key)), hasher.hash_one(&held));
            for other in [
                format!("{key}a"),
                format!("a{key}"),
                key.replacen('k', "j", 1),
            ] {
                if other != key {
                    assert!(
                        !KeyView(other.as_str()).equivalent(&held),
                        "{other} ~ {key}"
                    );
                }
            }
            if let Some(shorter) = key.get(..key.len().saturating_sub(1)) {
                if shorter != key {
                    assert!(!KeyView(shorter).equivalent(&held), "{shorter} ~ {key}");
                }
            }
        }
        assert_eq!(
            std::mem::size_of::<KeyBytes>(),
            std::mem::size_of::<String>()
        );
    }
}
