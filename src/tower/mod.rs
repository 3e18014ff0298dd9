//! A [`tower`](https://docs.rs/tower) layer that rate-limits HTTP requests: for servers built
//! on tower (axum, hyper, tonic). Enabled by the `tower` feature (off by default); it depends
//! only on `http`, `tower-layer` and `tower-service`, never on a runtime or a server.
//!
//! ```
//! use hotlimit::{algo::Gcra, tower::{HeaderKey, RateLimitLayer}, CasLimiter, ManualClock};
//! use http::{header::RETRY_AFTER, Request, Response, StatusCode};
//! use std::{convert::Infallible, sync::Arc};
//! use tower::{Layer, ServiceExt};
//!
//! // 5 requests per second per API key, bursts of 5; a manual clock so the example is exact.
//! let clock = ManualClock::new();
//! let limiter = Arc::new(CasLimiter::<String, _, _>::with_clock("5/s burst 5".parse::<Gcra>()?, clock));
//! let layer = RateLimitLayer::builder(limiter, HeaderKey::from_static("x-api-key")).build();
//! let app = layer.layer(tower::service_fn(|_req: Request<String>| async {
//!     Ok::<_, Infallible>(Response::new(String::from("hello")))
//! }));
//!
//! let rt = tokio::runtime::Builder::new_current_thread().build()?;
//! let send = |key: &str| {
//!     let req = Request::builder().header("x-api-key", key).body(String::new()).unwrap();
//!     rt.block_on(app.clone().oneshot(req)).unwrap()
//! };
//! for _ in 0..5 {
//!     assert_eq!(send("alice").status(), StatusCode::OK);
//! }
//! let denied = send("alice");
//! assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(denied.headers()[RETRY_AFTER], "1"); // 200 ms, rounded up to whole seconds
//! assert_eq!(denied.headers()["ratelimit-policy"], r#""default";q=5;w=1"#);
//! assert_eq!(denied.headers()["ratelimit"], r#""default";r=0;t=1"#);
//! assert_eq!(send("bob").status(), StatusCode::OK); // keys are independent
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What it does
//!
//! For each request, [`RateLimit`] (the service the layer wraps around yours):
//!
//! 1. asks the cost function for the request's cost (default: [`UnitCost`], 1). A cost of 0
//!    means free: the request passes, uncounted, without rate-limit headers;
//! 2. extracts the key with a [`KeyExtractor`]: the client IP from the connection ([`PeerIp`])
//!    or from a trusted forwarded header ([`ForwardedIp`]), a header value such as an API key
//!    ([`HeaderKey`]), or any closure `Fn(&Parts) -> Option<String>`; extractors combine with
//!    [`KeyExtractor::or`]. A request without a key follows [`MissingKey`]; a key longer than
//!    [`Builder::max_key_len`] (default [`DEFAULT_MAX_KEY_LEN`] bytes) follows
//!    [`OversizedKey`], so a hostile header never becomes a huge key;
//! 3. decides it with the limiter, any [`RateLimiter<str>`](crate::RateLimiter): every
//!    algorithm and variant of the crate, a [`ManualClock`](crate::ManualClock) one in tests,
//!    or a `dyn RateLimiter<str>`;
//! 4. acts according to the [`Mode`]: enforce (deny with `429 Too Many Requests`), dry-run
//!    (never deny, report what would have happened) or shadow (let every request through and
//!    tell the handler, which decides).
//!
//! # Headers
//!
//! The header fields follow
//! [draft-ietf-httpapi-ratelimit-headers-10](https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/10/)
//! (the `RateLimit-Policy` / `RateLimit` pair, structured fields with a quoted policy name):
//!
//! | field | value | from |
//! |---|---|---|
//! | `Retry-After` (denials only) | whole seconds, rounded up, at least 1 | [`Decision::retry_after`] |
//! | `RateLimit-Policy` | `"default";q=<quota>;w=<window seconds>` | [`QuotaPolicy`], by default the algorithm's ([`AdvertisedQuota`]) |
//! | `RateLimit` | `"default";r=<remaining>;t=<seconds>` | [`Decision::remaining`], [`Decision::reset_after`] rounded up |
//! | `X-RateLimit-Limit` (legacy, opt-in) | the quota | [`QuotaPolicy`] |
//! | `X-RateLimit-Remaining` (legacy, opt-in) | remaining | [`Decision::remaining`] |
//! | `X-RateLimit-Reset` (legacy, opt-in) | seconds until reset (a delay, not a timestamp) | [`Decision::reset_after`] |
//!
//! `t` is the time until the key is back to its full quota (`reset_after`): by then the whole
//! quota is available again, so it is never early; the draft's "additional quota" may come
//! sooner (GCRA returns one unit per emission interval). A field whose value the algorithm
//! does not know is left out (EARRRL and exponential know no `remaining`, so they send no
//! `RateLimit`).
//! All values come from the very [`Decision`] that decided the request. Denials always carry
//! the headers; allowed responses carry them when [`Builder::headers_on_allowed`] is set;
//! dry-run responses always carry them (that is how a dry run reports). The two IETF fields
//! are lists and are appended, so nested layers (per IP, then per API key) advertise both
//! policies: give them distinct names ([`QuotaPolicy::named`]).
//!
//! # Responses the layer makes itself
//!
//! In [`Mode::Enforce`] only; in the other modes every request reaches the inner service.
//!
//! | status | when |
//! |---|---|
//! | `429 Too Many Requests` | the limiter denied the request |
//! | `400 Bad Request` | no key ([`MissingKey::Reject`]) or a key over the length bound ([`OversizedKey::Reject`]) |
//! | `413 Content Too Large` | the request's cost exceeds the limiter's capacity: it could never pass |
//!
//! Their body is the response body type's `Default` (empty for axum's `Body`).
//!
//! # Cost when unused
//!
//! The feature is off by default, so the core crate builds without `http` or tower. On the
//! allowed path without headers the layer allocates nothing for header and IP keys: the key is
//! borrowed from the request or formatted on the stack. Each response that carries headers
//! allocates one small buffer per header field. `cargo bench --features tower --bench tower`
//! measures the layer against the bare limiter: on one thread its own cost is a few tens of
//! nanoseconds on top of the limiter's check (a header lookup, moving the request head out
//! and back, wrapping the inner future).

use crate::algo::{
    Algorithm, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::CostError;
use crate::keyed::KeyedLimiter;
use crate::limiter::{RateLimiter, Variant};
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::request::Parts;
use http::{Extensions, HeaderMap, Request, Response, StatusCode};
use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// The default bound on a key's length in bytes; see [`Builder::max_key_len`].
///
/// Long enough for IP addresses, UUIDs and typical API keys, short enough that a flood of
/// distinct keys costs little memory. Longer keys (a JWT, say) are hashed by default
/// ([`OversizedKey::Hash`]).
pub const DEFAULT_MAX_KEY_LEN: usize = 256;

/// `RateLimit-Policy`, from draft-ietf-httpapi-ratelimit-headers.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`, from draft-ietf-httpapi-ratelimit-headers.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The legacy `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// The legacy `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// The legacy `X-RateLimit-Reset` (seconds from now, not a timestamp).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `X-Forwarded-For`, which [`ForwardedIp`] reads.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

// ---------------------------------------------------------------------------------------------
// Keys

/// The key a [`KeyExtractor`] found: borrowed from the request, formatted inline (IP
/// addresses, hashes: no allocation), or owned.
///
/// # Examples
///
/// ```
/// use hotlimit::tower::Key;
/// use std::net::{IpAddr, Ipv4Addr};
///
/// assert_eq!(Key::borrowed("alice").as_str(), "alice");
/// assert_eq!(Key::owned(String::from("bob")).as_str(), "bob");
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

/// A short key kept on the stack.
type Inline = Buf<INLINE>;

/// Up to `N` (at most 255) bytes of text on the stack, written with `fmt::Write`.
#[derive(Clone, Copy)]
struct Buf<const N: usize> {
    len: u8,
    buf: [u8; N],
}

impl<const N: usize> Buf<N> {
    const fn new() -> Self {
        Self {
            len: 0,
            buf: [0; N],
        }
    }

    #[inline]
    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }

    #[inline]
    fn as_str(&self) -> &str {
        // Only whole `str`s and ASCII digits are written, so this never fails.
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }

    /// Writes an IPv4 address as `Display` does, without the formatting machinery (which
    /// costs more than the limiter's check).
    fn write_v4(&mut self, ip: std::net::Ipv4Addr) -> fmt::Result {
        for (i, o) in ip.octets().into_iter().enumerate() {
            if i > 0 {
                self.push(b".")?;
            }
            let digits = [b'0' + o / 100, b'0' + o / 10 % 10, b'0' + o % 10];
            let skip = match o {
                100.. => 0,
                10..=99 => 1,
                _ => 2,
            };
            self.push(&digits[skip..])?;
        }
        Ok(())
    }

    /// Writes `n` in decimal, without the formatting machinery.
    fn push_u64(&mut self, mut n: u64) -> fmt::Result {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[at..])
    }

    #[inline]
    fn push(&mut self, bytes: &[u8]) -> fmt::Result {
        let start = self.len as usize;
        let end = start + bytes.len();
        if end > N.min(u8::MAX as usize) {
            return Err(fmt::Error);
        }
        self.buf[start..end].copy_from_slice(bytes);
        self.len = end as u8;
        Ok(())
    }
}

impl<const N: usize> fmt::Write for Buf<N> {
    #[inline]
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes())
    }
}

impl<'a> Key<'a> {
    /// A key borrowed from the request (a header value, a path segment).
    pub fn borrowed(key: &'a str) -> Self {
        Key(Repr::Borrowed(key))
    }

    /// A key built for this request.
    pub fn owned(key: String) -> Self {
        Key(Repr::Owned(key))
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

    /// An IP address, masked to `ipv6_prefix` bits when it is IPv6 and the prefix is below 128
    /// (then written `addr/prefix`, so it never equals a single address's key).
    fn ip(ip: IpAddr, ipv6_prefix: u8) -> Key<'static> {
        use fmt::Write;
        let mut inline = Inline::new();
        // IPv4-mapped IPv6 (`::ffff:203.0.113.7`) is the IPv4 client: one key, not two.
        let ip = ip.to_canonical();
        // No form exceeds INLINE bytes, so the writes cannot fail.
        let _ = match ip {
            IpAddr::V4(v4) => inline.write_v4(v4),
            IpAddr::V6(v6) if ipv6_prefix < 128 => {
                let bits = u128::from(v6);
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(ipv6_prefix))
                    .unwrap_or(0);
                write!(inline, "{}/{}", Ipv6Addr::from(bits & mask), ipv6_prefix)
            }
            ip => write!(inline, "{ip}"),
        };
        Key(Repr::Inline(inline))
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
/// use hotlimit::tower::{HeaderKey, KeyExtractor, PeerIp};
/// use http::{request::Parts, Request};
///
/// // A closure: the first path segment (a tenant id), owned.
/// let tenant = |parts: &Parts| parts.uri.path().split('/').nth(1).map(str::to_owned);
/// let (parts, ()) = Request::get("/acme/orders").body(()).unwrap().into_parts();
/// assert_eq!(tenant.extract(&parts).unwrap().as_str(), "acme");
///
/// // An API key if the client sent one, else the connection's address.
/// let key = HeaderKey::from_static("x-api-key").or(PeerIp::new());
/// assert!(key.extract(&parts).is_none()); // neither here
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key of the request whose head is `parts`, or `None` if it has none.
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>>;

    /// This extractor's key, or else `other`'s.
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
        self(parts).map(Key::owned)
    }
}

/// The first extractor's key, or else the second's; see [`KeyExtractor::or`].
#[derive(Debug, Clone)]
pub struct Or<A, B>(A, B);

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        self.0.extract(parts).or_else(|| self.1.extract(parts))
    }
}

/// The client's IP address, from the connection: the socket address the server put in the
/// request's extensions.
///
/// [`PeerIp::new`] reads a `std::net::SocketAddr` extension (insert one yourself when you
/// serve with hyper directly). axum puts `axum::extract::ConnectInfo<SocketAddr>` there when
/// the app is served with `into_make_service_with_connect_info::<SocketAddr>()`; read it with
/// [`PeerIp::from_extension`]:
///
/// ```
/// use axum::extract::ConnectInfo;
/// use hotlimit::tower::{KeyExtractor, PeerIp};
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
/// use hotlimit::tower::{KeyExtractor, PeerIp};
/// use std::net::SocketAddr;
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert("[2001:db8::7]:4711".parse::<SocketAddr>()?);
/// let (parts, ()) = req.into_parts();
/// assert_eq!(PeerIp::new().extract(&parts).unwrap().as_str(), "2001:db8::7");
/// assert_eq!(PeerIp::new().ipv6_prefix(64).extract(&parts).unwrap().as_str(), "2001:db8::/64");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy)]
pub struct PeerIp {
    lookup: fn(&Extensions) -> Option<SocketAddr>,
    ipv6_prefix: u8,
}

impl PeerIp {
    /// Reads a `SocketAddr` from the request's extensions.
    pub fn new() -> Self {
        Self {
            lookup: |ext| ext.get::<SocketAddr>().copied(),
            ipv6_prefix: 128,
        }
    }

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
            ipv6_prefix: 128,
        }
    }

    /// Keys IPv6 clients by their first `bits` bits (64 is common: one subscriber usually
    /// holds a whole /64, so per-address keys let it multiply its quota). At most 128 (the
    /// default: whole addresses); IPv4 addresses are always whole.
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
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
pub enum ForwardedHeader {
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
/// use hotlimit::tower::{ForwardedIp, KeyExtractor};
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
/// assert_eq!(ForwardedIp::forwarded(1).extract(&parts).unwrap().as_str(), "2001:db8::1");
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
    pub fn new(header: ForwardedHeader, trusted_proxies: usize) -> Self {
        Self {
            header,
            trusted_proxies: trusted_proxies.max(1),
            ipv6_prefix: 128,
        }
    }

    /// Reads `X-Forwarded-For` behind `trusted_proxies` proxies.
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
/// visible ASCII, means no key (so `HeaderKey::from_static("x-api-key").or(PeerIp::new())`
/// falls through to the peer for `x-api-key:` with nothing after it, rather than putting every
/// such client in one bucket); the header sent several times keys by its first value.
///
/// # Examples
///
/// ```
/// use hotlimit::tower::{HeaderKey, KeyExtractor};
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
            .map(Key::borrowed)
    }
}

// ---------------------------------------------------------------------------------------------
// Cost

/// The cost of a request, in the limiter's units (1 per request by default; bytes, tokens...).
///
/// Implemented by [`UnitCost`] and by every closure `Fn(&Parts) -> u64 + Send + Sync +
/// 'static`. A cost of 0 lets the request through uncounted (health checks, say); a cost above
/// the limiter's capacity could never pass and is answered `413` in [`Mode::Enforce`].
///
/// # Examples
///
/// ```
/// use hotlimit::tower::RequestCost;
/// use http::{request::Parts, Method};
///
/// // Writes cost 5, reads 1, the health check nothing.
/// let cost = |p: &Parts| match (&p.method, p.uri.path()) {
///     (_, "/health") => 0,
///     (&Method::GET | &Method::HEAD, _) => 1,
///     _ => 5,
/// };
/// let (parts, ()) = http::Request::post("/orders").body(()).unwrap().into_parts();
/// assert_eq!(cost.cost(&parts), 5);
/// ```
pub trait RequestCost: Send + Sync + 'static {
    /// The cost of the request whose head is `parts`.
    fn cost(&self, parts: &Parts) -> u64;
}

/// Every request costs 1: the default [`RequestCost`].
#[derive(Debug, Clone, Copy, Default)]
pub struct UnitCost;

impl RequestCost for UnitCost {
    #[inline]
    fn cost(&self, _: &Parts) -> u64 {
        1
    }
}

impl<F> RequestCost for F
where
    F: Fn(&Parts) -> u64 + Send + Sync + 'static,
{
    #[inline]
    fn cost(&self, parts: &Parts) -> u64 {
        self(parts)
    }
}

// ---------------------------------------------------------------------------------------------
// Quota advertised in the headers

/// A quota policy as `RateLimit-Policy` advertises it: `quota` units per `window` whole
/// seconds, under a name (default `"default"`).
///
/// # Examples
///
/// ```
/// use hotlimit::tower::QuotaPolicy;
/// use std::time::Duration;
///
/// let p = QuotaPolicy::new(100, Duration::from_secs(60)).named("per-minute")?;
/// assert_eq!(p.to_string(), r#""per-minute";q=100;w=60"#);
/// // The draft has no sub-second windows: a window is rounded up to whole seconds.
/// assert_eq!(QuotaPolicy::new(5, Duration::from_millis(500)).to_string(), r#""default";q=5;w=1"#);
/// # Ok::<(), hotlimit::tower::InvalidPolicyName>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaPolicy {
    name: &'static str,
    quota: u64,
    window_secs: u64,
}

impl QuotaPolicy {
    /// `quota` units per `window` (rounded up to whole seconds, at least 1), named `"default"`.
    pub fn new(quota: u64, window: Duration) -> Self {
        let secs = window.as_secs() + u64::from(window.subsec_nanos() > 0);
        Self {
            name: "default",
            quota,
            window_secs: secs.max(1),
        }
    }

    /// The same policy under `name`: printable ASCII without `"` or `\` (it goes out as a
    /// structured-field string).
    pub fn named(self, name: &'static str) -> Result<Self, InvalidPolicyName> {
        if name
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\')
        {
            Ok(Self { name, ..self })
        } else {
            Err(InvalidPolicyName(name))
        }
    }

    /// The policy's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The quota, in the limiter's units.
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// The window in whole seconds.
    pub fn window_secs(&self) -> u64 {
        self.window_secs
    }
}

impl fmt::Display for QuotaPolicy {
    /// The `RateLimit-Policy` field value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "\"{}\";q={};w={}",
            self.name, self.quota, self.window_secs
        )
    }
}

/// A policy name that cannot go into a structured-field string; see [`QuotaPolicy::named`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidPolicyName(pub &'static str);

impl fmt::Display for InvalidPolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid rate-limit policy name {:?}: use printable ASCII without '\"' or '\\'",
            self.0
        )
    }
}

impl std::error::Error for InvalidPolicyName {}

/// What a limiter or algorithm advertises in `RateLimit-Policy` and `X-RateLimit-Limit`:
/// [`RateLimitLayer::builder`] reads it from the limiter.
///
/// | algorithm | quota | window |
/// |---|---|---|
/// | [`Gcra`] | the burst | the time to refill it from empty (burst × emission interval) |
/// | [`FixedWindow`], [`SlidingWindow`], [`SlidingLog`], [`SubWindow`] | the limit | the window |
/// | [`Exponential`] | the limit (rounded down) | the period |
/// | [`Earrrl`] | none: a decaying average has no quota window | |
///
/// Windows are rounded up to whole seconds. Override with [`Builder::quota`].
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, tower::{AdvertisedQuota, QuotaPolicy}};
/// use std::time::Duration;
///
/// let g: Gcra = "100/min burst 10".parse()?;
/// assert_eq!(g.advertised_quota(), Some(QuotaPolicy::new(10, Duration::from_secs(6))));
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait AdvertisedQuota {
    /// The policy to advertise, if there is one.
    fn advertised_quota(&self) -> Option<QuotaPolicy>;
}

impl AdvertisedQuota for Gcra {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        // burst × T: the time a drained bucket takes to fill (u128: no overflow).
        let t = self.emission_interval().as_nanos();
        let refill = u64::try_from(t * u128::from(self.burst())).unwrap_or(u64::MAX);
        Some(QuotaPolicy::new(self.burst(), Duration::from_nanos(refill)))
    }
}

impl AdvertisedQuota for FixedWindow {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        Some(QuotaPolicy::new(self.limit(), self.window()))
    }
}

impl AdvertisedQuota for SlidingWindow {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        Some(QuotaPolicy::new(self.limit(), self.window()))
    }
}

impl AdvertisedQuota for SlidingLog {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        Some(QuotaPolicy::new(self.limit(), self.window()))
    }
}

impl AdvertisedQuota for SubWindow {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        Some(QuotaPolicy::new(self.limit(), self.window()))
    }
}

impl AdvertisedQuota for Exponential {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        // `as` saturates; the limit is finite and positive (validated).
        Some(QuotaPolicy::new(self.limit() as u64, self.period()))
    }
}

impl AdvertisedQuota for Earrrl {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        None
    }
}

impl<K, A, C, V> AdvertisedQuota for KeyedLimiter<K, A, C, V>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm + AdvertisedQuota,
    C: Clock,
    V: Variant<A>,
{
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        self.algorithm().advertised_quota()
    }
}

/// A `dyn` limiter advertises nothing; set the policy with [`Builder::quota`].
impl AdvertisedQuota for dyn RateLimiter<str> {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration

/// What the layer does with a decision.
///
/// # Examples
///
/// ```
/// use hotlimit::tower::Mode;
///
/// assert_eq!("dry-run".parse::<Mode>(), Ok(Mode::DryRun));
/// assert_eq!(Mode::Shadow.to_string(), "shadow");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Deny: answer `429 Too Many Requests` without calling the inner service.
    #[default]
    Enforce,
    /// Never deny: every request reaches the inner service, and its response carries the
    /// rate-limit headers of the decision; [`Builder::on_decision`] sees what would have been
    /// denied. For trying a limit on live traffic.
    DryRun,
    /// Let every request through and leave the choice to the application: the layer inserts a
    /// [`ShadowDecision`] into the request's extensions and calls [`Builder::shadow_hook`], so
    /// the handler can, say, answer 200 but drop the side effect (a shadow ban). Denied
    /// requests get no rate-limit headers (they would tip the client off); allowed ones get
    /// them when [`Builder::headers_on_allowed`] is set.
    Shadow,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Enforce => "enforce",
            Mode::DryRun => "dry-run",
            Mode::Shadow => "shadow",
        })
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "enforce" => Ok(Mode::Enforce),
            "dry-run" => Ok(Mode::DryRun),
            "shadow" => Ok(Mode::Shadow),
            other => Err(format!(
                "unknown mode `{other}` (expected enforce, dry-run or shadow)"
            )),
        }
    }
}

/// What to do with a request that has no key (no connection address, no such header).
///
/// # Examples
///
/// ```
/// use hotlimit::tower::MissingKey;
///
/// let anonymous = MissingKey::fallback("anonymous"); // all keyless requests share one budget
/// assert_ne!(anonymous, MissingKey::Reject);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MissingKey {
    /// Answer `400 Bad Request` (in [`Mode::Enforce`]; the other modes let it through,
    /// uncounted). The default.
    #[default]
    Reject,
    /// Count it under this key, shared by every keyless request.
    Fallback(Cow<'static, str>),
}

impl MissingKey {
    /// [`MissingKey::Fallback`] to `key`.
    pub fn fallback(key: impl Into<Cow<'static, str>>) -> Self {
        MissingKey::Fallback(key.into())
    }
}

/// What to do with a key longer than [`Builder::max_key_len`].
///
/// Either way the limiter never stores more than the bound per key, whatever the client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OversizedKey {
    /// Key the request by a 128-bit keyed hash of the key (written `#` and 32 hex digits):
    /// distinct long keys (JWTs, say) stay distinct, with a per-layer random seed so clients
    /// cannot aim for collisions. The default.
    #[default]
    Hash,
    /// Answer `400 Bad Request` (in [`Mode::Enforce`]; the other modes let it through,
    /// uncounted).
    Reject,
}

/// Inserted into the request's extensions in [`Mode::Shadow`]: the limiter's decision, for
/// the handler to act on.
///
/// Requests the limiter did not decide (free, keyless or with an oversized key refused) have
/// none, so with axum read it as `Option<Extension<ShadowDecision>>` unless every request
/// has a key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShadowDecision(pub Decision);

/// What [`Builder::on_decision`] is told about each decided request.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    key: &'a str,
    cost: u64,
    decision: Decision,
    mode: Mode,
}

impl<'a> Report<'a> {
    /// The key the request was counted under (after [`MissingKey`] and [`OversizedKey`]).
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// The request's cost.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The limiter's decision.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The layer's mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether the limiter denied the request: answered 429 in [`Mode::Enforce`], "would have
    /// been denied" in the other modes.
    pub fn denied(&self) -> bool {
        self.decision.is_denied()
    }
}

type OnDecision = Box<dyn Fn(&Report<'_>) + Send + Sync>;
type ShadowHook = Box<dyn Fn(&Decision, &mut Parts) + Send + Sync>;

/// Everything a layer and its services share.
struct Shared<L: ?Sized, X, C> {
    limiter: Arc<L>,
    key: X,
    cost: C,
    mode: Mode,
    quota: Option<QuotaPolicy>,
    legacy: bool,
    on_allowed: bool,
    missing: MissingKey,
    max_key_len: usize,
    oversized: OversizedKey,
    /// Two seeds: 128 bits of keyed hash for oversized keys.
    hashers: [ahash::RandomState; 2],
    on_decision: Option<OnDecision>,
    shadow_hook: Option<ShadowHook>,
}

/// Configures a [`RateLimitLayer`]; from [`RateLimitLayer::builder`].
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::FixedWindow, tower::{ForwardedIp, MissingKey, Mode, RateLimitLayer}, CasLimiter};
/// use std::{sync::{atomic::{AtomicU64, Ordering}, Arc}, time::Duration};
///
/// let limiter = Arc::new(CasLimiter::<String, _>::new(FixedWindow::new(100, Duration::from_secs(60))?));
/// let would_deny = Arc::new(AtomicU64::new(0));
/// let counter = would_deny.clone();
/// let layer = RateLimitLayer::builder(limiter, ForwardedIp::x_forwarded_for(1))
///     .mode(Mode::DryRun)
///     .on_decision(move |r| if r.denied() { counter.fetch_add(1, Ordering::Relaxed); })
///     .missing_key(MissingKey::fallback("unknown-client"))
///     .legacy_headers(true)
///     .build();
/// # let _ = layer;
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[must_use]
pub struct Builder<L: ?Sized, X, C = UnitCost> {
    shared: Shared<L, X, C>,
}

impl<L: ?Sized, X, C> fmt::Debug for Builder<L, X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("config", &ConfigView(&self.shared))
            .finish()
    }
}

/// The plain settings of a [`Shared`], for `Debug`.
struct ConfigView<'a, L: ?Sized, X, C>(&'a Shared<L, X, C>);

impl<L: ?Sized, X, C> fmt::Debug for ConfigView<'_, L, X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        f.debug_struct("Config")
            .field("mode", &s.mode)
            .field("quota", &s.quota)
            .field("legacy_headers", &s.legacy)
            .field("headers_on_allowed", &s.on_allowed)
            .field("missing_key", &s.missing)
            .field("max_key_len", &s.max_key_len)
            .field("oversized_key", &s.oversized)
            .field("on_decision", &s.on_decision.is_some())
            .field("shadow_hook", &s.shadow_hook.is_some())
            .finish_non_exhaustive()
    }
}

impl<L, X, C> Builder<L, X, C>
where
    L: RateLimiter<str> + ?Sized,
    X: KeyExtractor,
    C: RequestCost,
{
    /// The cost function (default [`UnitCost`]).
    pub fn cost<C2: RequestCost>(self, cost: C2) -> Builder<L, X, C2> {
        let s = self.shared;
        Builder {
            shared: Shared {
                limiter: s.limiter,
                key: s.key,
                cost,
                mode: s.mode,
                quota: s.quota,
                legacy: s.legacy,
                on_allowed: s.on_allowed,
                missing: s.missing,
                max_key_len: s.max_key_len,
                oversized: s.oversized,
                hashers: s.hashers,
                on_decision: s.on_decision,
                shadow_hook: s.shadow_hook,
            },
        }
    }

    /// The mode (default [`Mode::Enforce`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.shared.mode = mode;
        self
    }

    /// Calls `f` for every decided request, in every mode: metrics, logs, and in
    /// [`Mode::DryRun`] the record of what would have been denied. It runs on the request's
    /// path, so keep it cheap.
    pub fn on_decision(mut self, f: impl Fn(&Report<'_>) + Send + Sync + 'static) -> Self {
        self.shared.on_decision = Some(Box::new(f));
        self
    }

    /// Sets [`Mode::Shadow`] and calls `hook` for every decided request, after the
    /// [`ShadowDecision`] is inserted, with the request's head to inspect or change (add a
    /// header for the upstream, an extension for the handler). The hook runs in shadow mode
    /// only: a later [`Builder::mode`] to another mode disables it.
    pub fn shadow_hook(
        mut self,
        hook: impl Fn(&Decision, &mut Parts) + Send + Sync + 'static,
    ) -> Self {
        self.shared.mode = Mode::Shadow;
        self.shared.shadow_hook = Some(Box::new(hook));
        self
    }

    /// The policy advertised in `RateLimit-Policy` and `X-RateLimit-Limit` (default: the
    /// limiter's [`AdvertisedQuota`]); `None` leaves those fields out.
    pub fn quota(mut self, quota: Option<QuotaPolicy>) -> Self {
        self.shared.quota = quota;
        self
    }

    /// Also send the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (default off).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.shared.legacy = on;
        self
    }

    /// Add the rate-limit headers to allowed responses too (default off: only denials, and
    /// every response in dry-run, carry them).
    pub fn headers_on_allowed(mut self, on: bool) -> Self {
        self.shared.on_allowed = on;
        self
    }

    /// What to do with a request without a key (default [`MissingKey::Reject`]).
    pub fn missing_key(mut self, missing: MissingKey) -> Self {
        self.shared.missing = missing;
        self
    }

    /// The longest key, in bytes, used as is (default [`DEFAULT_MAX_KEY_LEN`]); longer ones
    /// follow [`Builder::oversized_key`].
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.shared.max_key_len = bytes;
        self
    }

    /// What to do with a key over [`Builder::max_key_len`] (default [`OversizedKey::Hash`]).
    pub fn oversized_key(mut self, oversized: OversizedKey) -> Self {
        self.shared.oversized = oversized;
        self
    }

    /// The layer.
    pub fn build(self) -> RateLimitLayer<L, X, C> {
        RateLimitLayer {
            shared: Arc::new(self.shared),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Layer and service

/// A `tower::Layer` that rate-limits requests with a hotlimit limiter; see the
/// [module docs](self).
///
/// Cloning is cheap (one `Arc`); every service it makes shares the limiter.
pub struct RateLimitLayer<L: ?Sized, X, C = UnitCost> {
    shared: Arc<Shared<L, X, C>>,
}

impl<L: ?Sized, X, C> Clone for RateLimitLayer<L, X, C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<L: ?Sized, X, C> fmt::Debug for RateLimitLayer<L, X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("config", &ConfigView(&self.shared))
            .finish()
    }
}

impl<L, X> RateLimitLayer<L, X, UnitCost>
where
    L: RateLimiter<str> + AdvertisedQuota + ?Sized,
    X: KeyExtractor,
{
    /// A builder for a layer that limits requests with `limiter`, keyed by `key`, advertising
    /// the limiter's quota ([`AdvertisedQuota`]).
    ///
    /// For a limiter without one (a `ShardedLimiter`, your own), pass it as
    /// `Arc<dyn RateLimiter<str>>` and set the policy with [`Builder::quota`].
    pub fn builder(limiter: Arc<L>, key: X) -> Builder<L, X, UnitCost> {
        let quota = limiter.advertised_quota();
        Builder {
            shared: Shared {
                limiter,
                key,
                cost: UnitCost,
                mode: Mode::Enforce,
                quota,
                legacy: false,
                on_allowed: false,
                missing: MissingKey::Reject,
                max_key_len: DEFAULT_MAX_KEY_LEN,
                oversized: OversizedKey::Hash,
                hashers: [ahash::RandomState::new(), ahash::RandomState::new()],
                on_decision: None,
                shadow_hook: None,
            },
        }
    }
}

impl<L: ?Sized, X, C> RateLimitLayer<L, X, C> {
    /// The limiter.
    pub fn limiter(&self) -> &Arc<L> {
        &self.shared.limiter
    }
}

impl<S, L: ?Sized, X, C> tower_layer::Layer<S> for RateLimitLayer<L, X, C> {
    type Service = RateLimit<S, L, X, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The rate-limiting service [`RateLimitLayer`] wraps around an inner service.
///
/// It is ready when the inner service is. A request the layer answers itself (429, 400, 413)
/// never reaches the inner service, whose readiness then carries over to the next call.
pub struct RateLimit<S, L: ?Sized, X, C = UnitCost> {
    inner: S,
    shared: Arc<Shared<L, X, C>>,
}

impl<S: Clone, L: ?Sized, X, C> Clone for RateLimit<S, L, X, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, L: ?Sized, X, C> fmt::Debug for RateLimit<S, L, X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("config", &ConfigView(&self.shared))
            .finish()
    }
}

impl<S, L: ?Sized, X, C> RateLimit<S, L, X, C> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// The headers a response gets, computed from one decision.
#[derive(Clone, Copy)]
struct HeaderPlan {
    decision: Decision,
    quota: Option<QuotaPolicy>,
    legacy: bool,
    retry_after: bool,
}

/// Whole seconds, rounded up.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl HeaderPlan {
    fn apply(self, headers: &mut HeaderMap) {
        let d = self.decision;
        if self.retry_after {
            // Honest: never earlier than the limiter's wait, and a denial never says 0.
            headers.insert(
                RETRY_AFTER,
                HeaderValue::from(ceil_secs(d.retry_after()).max(1)),
            );
        }
        let reset = d.reset_after().map(ceil_secs);
        // The two IETF fields are lists, so append: nested layers (per IP, then per API key)
        // add their policies to one list, as the draft allows (give them distinct names).
        if let Some(q) = self.quota {
            let value = header_value(|b| {
                b.push(b"\"")?;
                b.push(q.name.as_bytes())?;
                b.push(b"\";q=")?;
                b.push_u64(q.quota)?;
                b.push(b";w=")?;
                b.push_u64(q.window_secs)
            });
            headers.append(RATELIMIT_POLICY, value);
        }
        if let Some(r) = d.remaining() {
            let name = self.quota.map_or("default", |q| q.name);
            let value = header_value(|b| {
                b.push(b"\"")?;
                b.push(name.as_bytes())?;
                b.push(b"\";r=")?;
                b.push_u64(r)?;
                match reset {
                    Some(t) => {
                        b.push(b";t=")?;
                        b.push_u64(t)
                    }
                    None => Ok(()),
                }
            });
            headers.append(RATELIMIT, value);
        }
        if self.legacy {
            if let Some(q) = self.quota {
                headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(q.quota));
            }
            if let Some(r) = d.remaining() {
                headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(r));
            }
            if let Some(t) = reset {
                headers.insert(X_RATELIMIT_RESET, HeaderValue::from(t));
            }
        }
    }
}

/// A header value written by `write` (ASCII names, punctuation, digits): on the stack, so
/// the value's own buffer is the one allocation, and on the heap if it does not fit.
fn header_value(write: impl Fn(&mut dyn Sink) -> fmt::Result) -> HeaderValue {
    let mut buf = Buf::<128>::new();
    let value = match write(&mut buf) {
        Ok(()) => HeaderValue::from_bytes(buf.as_bytes()),
        Err(_) => {
            // A long policy name.
            let mut heap = Vec::new();
            let _ = write(&mut heap);
            HeaderValue::from_bytes(&heap)
        }
    };
    // The policy name is validated printable ASCII, the rest digits: this cannot fail, but an
    // empty value is better than a panic if it ever did.
    value.unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Where [`header_value`] writes: the stack buffer, or a `Vec` when that is too small.
trait Sink {
    fn push(&mut self, bytes: &[u8]) -> fmt::Result;
    fn push_u64(&mut self, n: u64) -> fmt::Result;
}

impl<const N: usize> Sink for Buf<N> {
    fn push(&mut self, bytes: &[u8]) -> fmt::Result {
        Buf::push(self, bytes)
    }

    fn push_u64(&mut self, n: u64) -> fmt::Result {
        Buf::push_u64(self, n)
    }
}

impl Sink for Vec<u8> {
    fn push(&mut self, bytes: &[u8]) -> fmt::Result {
        self.extend_from_slice(bytes);
        Ok(())
    }

    fn push_u64(&mut self, n: u64) -> fmt::Result {
        let mut b = Buf::<20>::new();
        b.push_u64(n)?;
        self.extend_from_slice(b.as_bytes());
        Ok(())
    }
}

/// What the layer decided to do with one request.
enum Outcome {
    /// Call the inner service, adding these headers to its response.
    Pass(Option<HeaderPlan>),
    /// Call the inner service in shadow mode, after telling the application.
    Shadow(Decision, Option<HeaderPlan>),
    /// Answer with this status and these headers.
    Answer(StatusCode, Option<HeaderPlan>),
}

impl<L, X, C> Shared<L, X, C>
where
    L: RateLimiter<str> + ?Sized,
    X: KeyExtractor,
    C: RequestCost,
{
    /// Refuses in enforce mode; lets through uncounted otherwise.
    fn refuse(&self, status: StatusCode) -> Outcome {
        match self.mode {
            Mode::Enforce => Outcome::Answer(status, None),
            Mode::DryRun | Mode::Shadow => Outcome::Pass(None),
        }
    }

    #[inline]
    fn decide(&self, parts: &Parts) -> Outcome {
        let cost = self.cost.cost(parts);
        if cost == 0 {
            return Outcome::Pass(None);
        }
        // An empty key from any extractor is a missing key: one shared bucket for every
        // client that sends nothing would be a key nobody chose.
        let key = match self.key.extract(parts) {
            Some(key) if !key.as_str().is_empty() => key,
            _ => match &self.missing {
                MissingKey::Fallback(k) => Key::borrowed(k),
                MissingKey::Reject => return self.refuse(StatusCode::BAD_REQUEST),
            },
        };
        let hashed;
        let key = match key.as_str() {
            k if k.len() <= self.max_key_len => k,
            k => match self.oversized {
                OversizedKey::Reject => return self.refuse(StatusCode::BAD_REQUEST),
                OversizedKey::Hash => {
                    hashed = self.hashed(k);
                    hashed.as_str()
                }
            },
        };
        let decision = if cost == 1 {
            // Cost 1 is always valid: skip the cost check.
            Ok(self.limiter.check(key))
        } else {
            self.limiter.check_n(key, cost)
        };
        let decision = match decision {
            Ok(d) => d,
            Err(CostError::Zero) => return Outcome::Pass(None), // not reached: cost > 0
            Err(CostError::ExceedsCapacity { .. }) => {
                return match self.mode {
                    Mode::Enforce => Outcome::Answer(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        self.quota.map(|quota| HeaderPlan {
                            decision: Decision::allowed(),
                            quota: Some(quota),
                            legacy: self.legacy,
                            retry_after: false,
                        }),
                    ),
                    Mode::DryRun | Mode::Shadow => Outcome::Pass(None),
                };
            }
        };
        if let Some(f) = &self.on_decision {
            f(&Report {
                key,
                cost,
                decision,
                mode: self.mode,
            });
        }
        let plan = |retry_after| HeaderPlan {
            decision,
            quota: self.quota,
            legacy: self.legacy,
            retry_after,
        };
        match self.mode {
            Mode::Enforce if decision.is_denied() => {
                Outcome::Answer(StatusCode::TOO_MANY_REQUESTS, Some(plan(true)))
            }
            Mode::Enforce => Outcome::Pass(self.on_allowed.then(|| plan(false))),
            Mode::DryRun => Outcome::Pass(Some(plan(false))),
            Mode::Shadow => Outcome::Shadow(
                decision,
                (self.on_allowed && decision.is_allowed()).then(|| plan(false)),
            ),
        }
    }

    /// `#` and 32 hex digits of a keyed 128-bit hash.
    #[cold]
    fn hashed(&self, key: &str) -> Key<'static> {
        use fmt::Write;
        let [a, b] = &self.hashers;
        let mut inline = Inline::new();
        // 33 bytes: fits INLINE.
        let _ = write!(inline, "#{:016x}{:016x}", a.hash_one(key), b.hash_one(key));
        Key(Repr::Inline(inline))
    }
}

impl<S, L, X, C, ReqB, ResB> tower_service::Service<Request<ReqB>> for RateLimit<S, L, X, C>
where
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Default,
    L: RateLimiter<str> + ?Sized,
    X: KeyExtractor,
    C: RequestCost,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // Extractors and hooks see the head only, whatever the body type.
        let (mut parts, body) = req.into_parts();
        let shared = &*self.shared;
        let plan = match shared.decide(&parts) {
            Outcome::Pass(plan) => plan,
            Outcome::Shadow(decision, plan) => {
                parts.extensions.insert(ShadowDecision(decision));
                if let Some(hook) = &shared.shadow_hook {
                    hook(&decision, &mut parts);
                }
                plan
            }
            Outcome::Answer(status, plan) => {
                return ResponseFuture {
                    kind: Kind::Answer { status, plan },
                    _body: PhantomData,
                }
            }
        };
        ResponseFuture {
            kind: Kind::Inner {
                future: self.inner.call(Request::from_parts(parts, body)),
                plan,
            },
            _body: PhantomData,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`RateLimit`]: the inner service's, with the rate-limit headers
    /// added, or the layer's own answer.
    pub struct ResponseFuture<F, B> {
        #[pin]
        kind: Kind<F>,
        _body: PhantomData<fn() -> B>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Inner { #[pin] future: F, plan: Option<HeaderPlan> },
        Answer { status: StatusCode, plan: Option<HeaderPlan> },
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Answer { .. } => "answer",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Default,
{
    type Output = Result<Response<B>, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future, plan } => {
                let mut response = match future.poll(cx) {
                    Poll::Ready(Ok(r)) => r,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                };
                if let Some(plan) = plan.take() {
                    plan.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
            KindProj::Answer { status, plan } => {
                // Built here, not in `call`: nothing to keep, and a repeated poll gets the same.
                let mut response = Response::new(B::default());
                *response.status_mut() = *status;
                if let Some(plan) = plan {
                    plan.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(f: impl FnOnce(http::request::Builder) -> http::request::Builder) -> Parts {
        f(Request::builder()).body(()).unwrap().into_parts().0
    }

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

    #[test]
    fn integers_match_display() {
        for n in [0, 1, 9, 10, 99, 100, 12345, u64::MAX - 1, u64::MAX] {
            let mut b = Buf::<20>::new();
            b.push_u64(n).unwrap();
            assert_eq!(b.as_str(), n.to_string());
        }
    }

    #[test]
    fn long_policy_names_still_format() {
        let name = "a-policy-name-long-enough-to-overflow-the-stack-buffer-of-one-hundred-and-twenty-eight-bytes-used-for-header-values";
        let q = QuotaPolicy::new(7, Duration::from_secs(3))
            .named(name)
            .unwrap();
        let mut h = HeaderMap::new();
        let plan = HeaderPlan {
            decision: Decision::allowed().with_remaining(2).with_reset_after(1),
            quota: Some(q),
            legacy: true,
            retry_after: false,
        };
        plan.apply(&mut h);
        assert_eq!(h[RATELIMIT_POLICY], format!("\"{name}\";q=7;w=3"));
        assert_eq!(h[RATELIMIT], format!("\"{name}\";r=2;t=1"));
        assert_eq!(h[X_RATELIMIT_LIMIT], "7");
        assert_eq!(h[X_RATELIMIT_REMAINING], "2");
        assert_eq!(h[X_RATELIMIT_RESET], "1");
    }

    #[test]
    fn policy_names_are_checked() {
        let q = QuotaPolicy::new(1, Duration::from_secs(1));
        assert!(q.named("per-user 2").is_ok());
        assert_eq!(q.named("a\"b"), Err(InvalidPolicyName("a\"b")));
        assert!(q.named("tab\t").is_err());
        assert!(q.named("é").is_err());
    }

    #[test]
    fn ceil_secs_rounds_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
    }
}
