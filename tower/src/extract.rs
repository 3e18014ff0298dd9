//! Keys: what a request is counted under, and the extractors that find it.

#[cfg(doc)]
use super::MissingKey;
use super::X_FORWARDED_FOR;
use arrayvec::ArrayString;
use http::header::HeaderName;
use http::request::Parts;
use http::{Extensions, HeaderMap};
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::ops::Deref;

/// The key a [`KeyExtractor`] found: borrowed from the request, formatted inline (IP
/// addresses, hashes: no allocation), or owned.
///
/// # Examples
///
/// ```
/// use hotlimit_tower::Key;
/// use std::net::{IpAddr, Ipv4Addr};
///
/// assert_eq!(Key::from("alice").as_str(), "alice");
/// assert_eq!(Key::from(String::from("bob")).as_str(), "bob");
/// assert_eq!(Key::from(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7))).as_str(), "203.0.113.7");
/// ```
#[derive(Clone)]
pub struct Key<'a>(Repr<'a>);

#[derive(Clone)]
enum Repr<'a> {
    Borrowed(&'a str),
    Owned(String),
    Inline(Inline),
}

/// Room for the longest IPv6 text form with a prefix length (45 + 4) and for a hashed key.
const INLINE: usize = 56;

/// The bits of an IPv6 address that key a client by default: a subscriber usually holds a
/// whole /64, so keyed by whole addresses it could take a fresh budget with each of 2^64.
const DEFAULT_IPV6_PREFIX: u8 = 64;

/// A short key kept on the stack.
pub(super) type Inline = ArrayString<INLINE>;

/// Writes an IPv4 address as `Display` does, without the formatting machinery (which
/// costs more than the limiter's check).
fn write_v4(buf: &mut Inline, ip: std::net::Ipv4Addr) -> fmt::Result {
    for (i, o) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            buf.try_push('.').map_err(|_| fmt::Error)?;
        }
        let digits = [b'0' + o / 100, b'0' + o / 10 % 10, b'0' + o % 10];
        let skip = match o {
            100.. => 0,
            10..=99 => 1,
            _ => 2,
        };
        for &d in &digits[skip..] {
            buf.try_push(char::from(d)).map_err(|_| fmt::Error)?;
        }
    }
    Ok(())
}

impl<'a> Key<'a> {
    /// A key formatted on the stack (an IP address, a hash).
    pub(super) fn inline(key: Inline) -> Key<'static> {
        Key(Repr::Inline(key))
    }

    /// The key as a string slice.
    #[inline]
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Borrowed(s) => s,
            Repr::Owned(s) => s,
            Repr::Inline(i) => i.as_str(),
        }
    }

    /// `prefix` and this key: on the stack when both fit, else owned.
    fn prefixed(self, prefix: &str) -> Key<'a> {
        let mut inline = Inline::new();
        match (
            inline.try_push_str(prefix),
            inline.try_push_str(self.as_str()),
        ) {
            (Ok(()), Ok(())) => Key::inline(inline),
            _ => Key::from(format!("{prefix}{}", self.as_str())),
        }
    }

    /// An IP address, masked to `ipv6_prefix` bits when it is IPv6 and the prefix is below 128
    /// (then written `addr/prefix`, so it never equals a single address's key).
    fn ip(ip: IpAddr, ipv6_prefix: u8) -> Key<'static> {
        use fmt::Write;
        let mut inline = Inline::new();
        // IPv4-mapped IPv6 (`::ffff:203.0.113.7`) is the IPv4 client: one key, not two.
        let ip = ip.to_canonical();
        // No form exceeds INLINE bytes, so the writes cannot fail.
        let _ = match ip {
            IpAddr::V4(v4) => write_v4(&mut inline, v4),
            IpAddr::V6(v6) if ipv6_prefix < 128 => {
                let bits = u128::from(v6);
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(ipv6_prefix))
                    .unwrap_or(0);
                write!(inline, "{}/{}", Ipv6Addr::from(bits & mask), ipv6_prefix)
            }
            ip => write!(inline, "{ip}"),
        };
        Key::inline(inline)
    }
}

/// A key borrowed from the request (a header value, a path segment).
impl<'a> From<&'a str> for Key<'a> {
    fn from(key: &'a str) -> Self {
        Key(Repr::Borrowed(key))
    }
}

/// A key built for this request.
impl From<String> for Key<'static> {
    fn from(key: String) -> Self {
        Key(Repr::Owned(key))
    }
}

impl From<IpAddr> for Key<'static> {
    fn from(ip: IpAddr) -> Self {
        Key::ip(ip, 128)
    }
}

impl fmt::Debug for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Key").field(&self.as_str()).finish()
    }
}

/// Finds the rate-limiting key of a request.
///
/// Implemented by [`PeerIp`], [`ForwardedIp`], [`HeaderKey`], [`Or`], and by every closure
/// `Fn(&Parts) -> Option<String> + Send + Sync + 'static`. Implement it yourself to borrow the
/// key from the request without allocating.
///
/// # Examples
///
/// ```
/// use hotlimit_tower::{HeaderKey, KeyExtractor, PeerIp};
/// use http::{request::Parts, Request};
///
/// // A closure: the first path segment (a tenant id), owned.
/// let tenant = |parts: &Parts| parts.uri.path().split('/').nth(1).map(str::to_owned);
/// let (parts, ()) = Request::get("/acme/orders").body(()).unwrap().into_parts();
/// assert_eq!(tenant.extract(&parts).unwrap().as_str(), "acme");
///
/// // An API key if the client sent one, else the connection's address.
/// let key = HeaderKey::from_static("x-api-key").or(PeerIp::default());
/// assert!(key.extract(&parts).is_none()); // neither here
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key of the request whose head is `parts`, or `None` if it has none.
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>>;

    /// This extractor's key, or else `other`'s, the two kept apart: `other`'s keys are
    /// written `~:` and the key, and this one's that begin with `~` get one more `~` (see
    /// [`Or`]).
    fn or<B: KeyExtractor>(self, other: B) -> Or<Self, B>
    where
        Self: Sized,
    {
        Or(self, other)
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        self(parts).map(Key::from)
    }
}

/// The first extractor's key, or else the second's; see [`KeyExtractor::or`].
///
/// The two never share a key: with `HeaderKey::from_static("x-api-key").or(PeerIp::default())`
/// a client sending another client's address as its API key would otherwise spend that
/// client's budget. So the second's keys are written `~:` and the key (`~:203.0.113.7`), and
/// the first's are kept as they are (no allocation for a borrowed one) unless they begin with
/// `~`, which gets one more (`~~…`). Nested, each `or` keeps its two sides apart the same way.
///
/// ```
/// use hotlimit_tower::{HeaderKey, KeyExtractor, PeerIp};
/// use std::net::SocketAddr;
///
/// let key = HeaderKey::from_static("x-api-key").or(PeerIp::default());
/// let mut req = http::Request::get("/").header("x-api-key", "203.0.113.7").body(())?;
/// req.extensions_mut().insert("203.0.113.7:4711".parse::<SocketAddr>()?);
/// let (mut parts, ()) = req.into_parts();
/// assert_eq!(key.extract(&parts).unwrap().as_str(), "203.0.113.7");
/// parts.headers.clear();
/// assert_eq!(key.extract(&parts).unwrap().as_str(), "~:203.0.113.7");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Or<A, B>(A, B);

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        match self.0.extract(parts) {
            Some(key) if key.as_str().starts_with('~') => Some(key.prefixed("~")),
            Some(key) => Some(key),
            None => self.1.extract(parts).map(|key| key.prefixed("~:")),
        }
    }
}

/// The client's IP address, from the connection: the socket address the server put in the
/// request's extensions.
///
/// [`PeerIp::default`] reads a `std::net::SocketAddr` extension (insert one yourself when you
/// serve with hyper directly). axum puts `axum::extract::ConnectInfo<SocketAddr>` there when
/// the app is served with `into_make_service_with_connect_info::<SocketAddr>()`; read it with
/// [`PeerIp::from_extension`]:
///
/// ```
/// use axum::extract::ConnectInfo;
/// use hotlimit_tower::{KeyExtractor, PeerIp};
/// use std::net::SocketAddr;
///
/// let key = PeerIp::from_extension::<ConnectInfo<SocketAddr>>();
/// # let mut req = http::Request::new(());
/// # req.extensions_mut().insert(ConnectInfo("203.0.113.7:4711".parse::<SocketAddr>().unwrap()));
/// # let (parts, ()) = req.into_parts();
/// # assert_eq!(key.extract(&parts).unwrap().as_str(), "203.0.113.7");
/// ```
///
/// Behind a reverse proxy every request comes from the proxy's address: use [`ForwardedIp`].
///
/// # Examples
///
/// ```
/// use hotlimit_tower::{KeyExtractor, PeerIp};
/// use std::net::SocketAddr;
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert("[2001:db8::7]:4711".parse::<SocketAddr>()?);
/// let (parts, ()) = req.into_parts();
/// assert_eq!(PeerIp::default().extract(&parts).unwrap().as_str(), "2001:db8::/64");
/// assert_eq!(PeerIp::default().ipv6_prefix(128).extract(&parts).unwrap().as_str(), "2001:db8::7");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy)]
pub struct PeerIp {
    lookup: fn(&Extensions) -> Option<SocketAddr>,
    ipv6_prefix: u8,
}

impl PeerIp {
    /// Reads an extension of type `T` that dereferences to a `SocketAddr`, such as axum's
    /// `ConnectInfo<SocketAddr>`.
    pub fn from_extension<T>() -> Self
    where
        T: Deref<Target = SocketAddr> + Send + Sync + 'static,
    {
        fn lookup<T: Deref<Target = SocketAddr> + Send + Sync + 'static>(
            ext: &Extensions,
        ) -> Option<SocketAddr> {
            ext.get::<T>().map(|t| **t)
        }
        Self {
            lookup: lookup::<T>,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Keys IPv6 clients by their first `bits` bits: by default 64 (one subscriber usually
    /// holds a whole /64, so per-address keys would let it multiply its quota by 2^64, and the
    /// limit would stop no one); 128 keys whole addresses. At most 128; IPv4 addresses are
    /// always whole.
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }
}

/// Reads a `SocketAddr` from the request's extensions.
impl Default for PeerIp {
    fn default() -> Self {
        Self {
            lookup: |ext| ext.get::<SocketAddr>().copied(),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

impl fmt::Debug for PeerIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerIp")
            .field("ipv6_prefix", &self.ipv6_prefix)
            .finish_non_exhaustive()
    }
}

impl KeyExtractor for PeerIp {
    #[inline]
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        (self.lookup)(&parts.extensions).map(|addr| Key::ip(addr.ip(), self.ipv6_prefix))
    }
}

/// Which forwarded header [`ForwardedIp`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the de facto standard).
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239); the `for=` parameter of each element.
    Forwarded,
}

/// The client's IP address from a forwarded header written by reverse proxies you trust.
///
/// Each proxy appends the address it received the request from, so with `n` trusted proxies
/// in front of this server the client is the `n`-th address from the right; anything to its
/// left was written by the client and is ignored. Several header lines count as one list.
/// Fewer than `n` entries, or an entry that is not an IP address (`unknown`, an obfuscated
/// RFC 7239 name), mean no key ([`MissingKey`] decides).
///
/// **Spoofing.** This is only sound when every request reaches the server through those `n`
/// proxies, and each of them appends to the header (not just passes it on). A client that can
/// reach the server directly, or through fewer proxies, chooses its own key, and so its own
/// quota. Count the proxies exactly: one too many trusts an address the client wrote.
///
/// # Examples
///
/// ```
/// use hotlimit_tower::{ForwardedIp, KeyExtractor};
///
/// // One load balancer in front; the client tried to pass itself off as 10.0.0.1.
/// let req = http::Request::get("/").header("x-forwarded-for", "10.0.0.1, 198.51.100.23").body(())?;
/// let (parts, ()) = req.into_parts();
/// assert_eq!(ForwardedIp::x_forwarded_for(1).extract(&parts).unwrap().as_str(), "198.51.100.23");
/// assert_eq!(ForwardedIp::x_forwarded_for(2).extract(&parts).unwrap().as_str(), "10.0.0.1");
/// assert!(ForwardedIp::x_forwarded_for(3).extract(&parts).is_none());
///
/// let req = http::Request::get("/").header("forwarded", r#"for="[2001:db8::1]:4711";proto=https"#).body(())?;
/// let (parts, ()) = req.into_parts();
/// assert_eq!(ForwardedIp::forwarded(1).extract(&parts).unwrap().as_str(), "2001:db8::/64");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ForwardedIp {
    header: ForwardedHeader,
    trusted_proxies: usize,
    ipv6_prefix: u8,
}

impl ForwardedIp {
    /// Reads `header`, behind `trusted_proxies` proxies (0 is taken as 1: the header is only
    /// there because a proxy wrote it).
    fn new(header: ForwardedHeader, trusted_proxies: usize) -> Self {
        Self {
            header,
            trusted_proxies: trusted_proxies.max(1),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Reads `X-Forwarded-For` behind `trusted_proxies` proxies (0 is taken as 1: the header
    /// is only there because a proxy wrote it).
    pub fn x_forwarded_for(trusted_proxies: usize) -> Self {
        Self::new(ForwardedHeader::XForwardedFor, trusted_proxies)
    }

    /// Reads `Forwarded` (RFC 7239) behind `trusted_proxies` proxies.
    pub fn forwarded(trusted_proxies: usize) -> Self {
        Self::new(ForwardedHeader::Forwarded, trusted_proxies)
    }

    /// Keys IPv6 clients by their first `bits` bits; see [`PeerIp::ipv6_prefix`].
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// The `n`-th entry from the right (1-based) across the header's lines, as bytes. Walks
    /// from the right and stops there, so a huge client-written prefix costs nothing.
    fn nth_from_right<'a>(&self, headers: &'a HeaderMap, n: usize) -> Option<&'a [u8]> {
        let name = match self.header {
            ForwardedHeader::XForwardedFor => X_FORWARDED_FOR,
            ForwardedHeader::Forwarded => http::header::FORWARDED,
        };
        let mut seen = 0;
        // The right-most entries are in the last line.
        for line in headers.get_all(name).iter().rev() {
            for entry in line.as_bytes().rsplit(|&b| b == b',') {
                seen += 1;
                if seen == n {
                    return Some(entry);
                }
            }
        }
        None
    }
}

/// Parses one forwarded node: `203.0.113.7`, `203.0.113.7:443`, `2001:db8::1`,
/// `[2001:db8::1]:443`, optionally quoted.
fn parse_node(node: &[u8]) -> Option<IpAddr> {
    let node = std::str::from_utf8(node).ok()?.trim();
    let node = node
        .strip_prefix('"')
        .and_then(|n| n.strip_suffix('"'))
        .unwrap_or(node);
    if let Some(rest) = node.strip_prefix('[') {
        // `[v6]` or `[v6]:port`.
        return rest
            .split(']')
            .next()?
            .parse::<Ipv6Addr>()
            .ok()
            .map(IpAddr::V6);
    }
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    // `v4:port` (a bare IPv6 address has parsed above).
    let (host, port) = node.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// The `for=` parameter of one RFC 7239 element (`for=...;proto=...`).
fn forwarded_for(element: &[u8]) -> Option<&[u8]> {
    element.split(|&b| b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let eq = pair.iter().position(|&b| b == b'=')?;
        pair[..eq]
            .trim_ascii()
            .eq_ignore_ascii_case(b"for")
            .then(|| &pair[eq + 1..])
    })
}

impl KeyExtractor for ForwardedIp {
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        let entry = self.nth_from_right(&parts.headers, self.trusted_proxies)?;
        let node = match self.header {
            ForwardedHeader::XForwardedFor => entry,
            ForwardedHeader::Forwarded => forwarded_for(entry)?,
        };
        parse_node(node).map(|ip| Key::ip(ip, self.ipv6_prefix))
    }
}

/// A request header's value as the key: an API key, a tenant id, a user id set by an
/// authentication layer in front.
///
/// The value is used as sent, borrowed (no allocation). An empty value, or one that is not
/// visible ASCII, means no key (so `HeaderKey::from_static("x-api-key").or(PeerIp::default())`
/// falls through to the peer for `x-api-key:` with nothing after it, rather than putting every
/// such client in one bucket); the header sent several times keys by its first value.
///
/// # Spoofing
///
/// A header is what the client says. Where any value is accepted, a client picks its own key:
/// a new value each request is a new budget each request. Key by a header that something in
/// front vouches for (an authentication layer that sets it, an API key checked before the
/// limiter), or limit by address as well (a [`HierarchyLayer`](crate::HierarchyLayer) level
/// keyed by [`PeerIp`]). A credential as the key (`authorization`) is stored, and handed to
/// [`on_decision`](crate::LayerBuilder::on_decision), as sent: set
/// [`max_key_len`](crate::LayerBuilder::max_key_len) to 0 to key every value by its hash.
///
/// # Examples
///
/// ```
/// use hotlimit_tower::{HeaderKey, KeyExtractor};
///
/// let req = http::Request::get("/").header("x-api-key", "k-123").body(())?;
/// let (parts, ()) = req.into_parts();
/// assert_eq!(HeaderKey::from_static("x-api-key").extract(&parts).unwrap().as_str(), "k-123");
/// # Ok::<(), http::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys by the value of header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }

    /// Keys by the value of header `name`, a lowercase static name (as
    /// [`HeaderName::from_static`], which panics on an invalid one; use [`HeaderKey::new`]
    /// with a parsed name for names from configuration).
    pub fn from_static(name: &'static str) -> Self {
        Self::new(HeaderName::from_static(name))
    }
}

impl KeyExtractor for HeaderKey {
    #[inline]
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        parts
            .headers
            .get(&self.name)?
            .to_str()
            .ok()
            .filter(|v| !v.is_empty())
            .map(Key::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(f: impl FnOnce(http::request::Builder) -> http::request::Builder) -> Parts {
        f(http::Request::builder()).body(()).unwrap().into_parts().0
    }

    // Pins G60.
    #[test]
    fn forwarded_nodes() {
        let ip = |s: &str| parse_node(s.as_bytes()).map(|ip| ip.to_string());
        assert_eq!(ip(" 203.0.113.7 ").as_deref(), Some("203.0.113.7"));
        assert_eq!(ip("203.0.113.7:443").as_deref(), Some("203.0.113.7"));
        assert_eq!(ip("\"[2001:db8::1]:443\"").as_deref(), Some("2001:db8::1"));
        assert_eq!(ip("2001:DB8::1").as_deref(), Some("2001:db8::1"));
        assert_eq!(ip("unknown"), None);
        assert_eq!(ip("_hidden"), None);
        assert_eq!(ip("[nope]"), None);
        assert_eq!(ip(""), None);
    }

    // Pins G60.
    #[test]
    fn forwarded_lines_count_from_the_right() {
        let p = parts(|b| {
            b.header("x-forwarded-for", "1.1.1.1, 2.2.2.2")
                .header("x-forwarded-for", "3.3.3.3")
        });
        let nth = |n| {
            ForwardedIp::x_forwarded_for(n)
                .extract(&p)
                .map(|k| k.as_str().to_owned())
        };
        assert_eq!(nth(1).as_deref(), Some("3.3.3.3"));
        assert_eq!(nth(2).as_deref(), Some("2.2.2.2"));
        assert_eq!(nth(3).as_deref(), Some("1.1.1.1"));
        assert_eq!(nth(4), None);
        assert_eq!(nth(0).as_deref(), Some("3.3.3.3")); // 0 is taken as 1
        let p = parts(|b| {
            b.header(
                "forwarded",
                "for=unknown, For=\"198.51.100.1:80\";proto=http",
            )
        });
        let fwd = |n| {
            ForwardedIp::forwarded(n)
                .extract(&p)
                .map(|k| k.as_str().to_owned())
        };
        assert_eq!(fwd(1).as_deref(), Some("198.51.100.1"));
        assert_eq!(fwd(2), None);
    }

    // Pins G60.
    #[test]
    fn ip_keys_are_canonical() {
        let k = |s: &str, prefix| Key::ip(s.parse().unwrap(), prefix).as_str().to_owned();
        assert_eq!(k("::ffff:203.0.113.7", 128), "203.0.113.7");
        assert_eq!(k("2001:db8:1:2:3:4:5:6", 64), "2001:db8:1:2::/64");
        assert_eq!(k("2001:db8:1:2:3:4:5:6", 0), "::/0");
        assert_eq!(k("203.0.113.7", 64), "203.0.113.7");
        let longest = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
        assert_eq!(
            k(longest, 127),
            format!("{}/127", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe")
        );
    }

    // Pins G60.
    #[test]
    fn ipv6_clients_are_keyed_by_their_64_unless_told_otherwise() {
        let peer = |addr: &str, x: &dyn KeyExtractor| {
            let mut req = http::Request::new(());
            req.extensions_mut()
                .insert(SocketAddr::new(addr.parse().unwrap(), 4711));
            let xff = match addr.parse::<IpAddr>().unwrap() {
                IpAddr::V6(v6) => format!("[{v6}]:4711"),
                v4 => v4.to_string(),
            };
            req.headers_mut()
                .insert(X_FORWARDED_FOR, xff.parse().unwrap());
            let (parts, ()) = req.into_parts();
            x.extract(&parts).unwrap().as_str().to_owned()
        };
        // Two addresses of one subscriber's /64, one of another's.
        let (a, b, c) = ("2001:db8:0:1::7", "2001:db8:0:1:ffff::1", "2001:db8:0:2::7");
        for x in [
            &PeerIp::default() as &dyn KeyExtractor,
            &ForwardedIp::x_forwarded_for(1),
        ] {
            assert_eq!(peer(a, x), "2001:db8:0:1::/64");
            assert_eq!(peer(a, x), peer(b, x));
            assert_ne!(peer(a, x), peer(c, x));
            // IPv4, and IPv4 mapped into IPv6, whole.
            assert_eq!(peer("203.0.113.7", x), "203.0.113.7");
            assert_eq!(peer("::ffff:203.0.113.7", x), "203.0.113.7");
        }
        for x in [
            &PeerIp::default().ipv6_prefix(128) as &dyn KeyExtractor,
            &ForwardedIp::x_forwarded_for(1).ipv6_prefix(128),
        ] {
            assert_eq!(peer(a, x), "2001:db8:0:1::7");
            assert_ne!(peer(a, x), peer(b, x));
        }
    }

    // Pins G60.
    #[test]
    fn ipv4_keys_match_display() {
        for ip in [
            [0, 0, 0, 0],
            [255, 255, 255, 255],
            [1, 22, 100, 9],
            [10, 99, 101, 255],
        ]
        .into_iter()
        .chain((0..=255).map(|o| [o, o, 7, o / 3]))
        {
            let ip = std::net::Ipv4Addr::from(ip);
            assert_eq!(Key::from(IpAddr::V4(ip)).as_str(), ip.to_string());
        }
    }
}
