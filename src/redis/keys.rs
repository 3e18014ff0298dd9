//! The key space: a client key's Redis key, escaped into one hash tag.

/// `prefix{escaped key}`: the Redis key of a client key (see the module docs).
pub(super) fn redis_key(prefix: &str, key: &str) -> String {
    let mut k = String::with_capacity(prefix.len() + key.len() + 2);
    k.push_str(prefix);
    k.push('{');
    escape(key, &mut k);
    k.push('}');
    k
}

/// Appends `key` with `%` as `%25` and `}` as `%7D`, and the empty key as a lone `%` (which
/// escaping never yields): injective, and the hash tag is never empty (an empty `{}` would
/// hash the whole key instead).
fn escape(key: &str, out: &mut String) {
    if key.is_empty() {
        out.push('%');
        return;
    }
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}
