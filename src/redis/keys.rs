//! The key space: a client key's Redis key, escaped into one hash tag.

/// `prefix{escaped key}`: the Redis key of a client key (see the module docs).
pub(super) fn redis_key(prefix: &str, key: &str) -> String {
    let mut k = String::with_capacity(prefix.len() + key.len() + 2);
    push_redis_key(&mut k, prefix, key);
    k
}

/// [`redis_key`] appended to `k`.
pub(super) fn push_redis_key(k: &mut String, prefix: &str, key: &str) {
    k.push_str(prefix);
    k.push('{');
    escape(key, k);
    k.push('}');
}

/// Appends `key` with `%` as `%25` and `}` as `%7D`, and the empty key as a lone `%` (which
/// escaping never yields): injective, and the hash tag is never empty (an empty `{}` would
/// hash the whole key instead).
fn escape(key: &str, out: &mut String) {
    if key.is_empty() {
        out.push('%');
        return;
    }
    // Copied in runs between the two escaped bytes (both ASCII, so every cut is a char
    // boundary): the sync thread escapes every key of every round.
    let mut last = 0;
    for (i, b) in key.bytes().enumerate() {
        let esc = match b {
            b'%' => "%25",
            b'}' => "%7D",
            _ => continue,
        };
        out.push_str(&key[last..i]);
        out.push_str(esc);
        last = i + 1;
    }
    out.push_str(&key[last..]);
}
