//! Cost: what a request costs, in the limiter's units.

#[cfg(doc)]
use super::Mode;
use http::request::Parts;

/// The cost of a request, in the limiter's units (1 per request by default; bytes, tokens...).
///
/// Implemented by [`UnitCost`] and by every closure `Fn(&Parts) -> u64 + Send + Sync +
/// 'static`. A cost of 0 lets the request through uncounted (health checks, say); a cost above
/// the limiter's capacity could never pass and is answered `413` in [`Mode::Enforce`].
///
/// # Examples
///
/// ```
/// use hotlimit_tower::RequestCost;
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
