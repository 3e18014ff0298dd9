//! A hierarchy: one request counted against several levels at once (a user inside an
//! organisation), each with its own limiter and key, all or nothing, through the core's
//! [`check_all`](hotlimit::check_all).

use super::extract::Key;
use super::layer::Outcome;
use super::options::{ConfigView, Shared};
use super::plan::NoPlans;
use super::{AdvertisedQuota, KeyExtractor, LayerBuilder, RequestCost};
use hotlimit::headers::{QuotaPolicy, Verdict};
use hotlimit::{QuotaError, RateLimiter, Requests};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

impl<L, X, C> LayerBuilder<L, X, C, NoPlans>
where
    L: RateLimiter<str> + Requests<str> + AdvertisedQuota,
    X: KeyExtractor,
    C: RequestCost,
{
    /// The layer, counting each request against this builder's limiter and key *and* every
    /// level of `outer` (each a limiter with its own quota and a key extractor; innermost
    /// first, outermost last), all or nothing: a user inside an organisation inside a region.
    ///
    /// One [`check_all`](hotlimit::check_all) per request: admitted only if every level
    /// admits it, and then charged on each; denied by one, charged on none (each level is
    /// read first; one that denies alone is the only one touched). Each level is charged by
    /// its own atomic step, and refunded by another if a later one denies after all, so
    /// concurrent requests never overspend any level; between the two steps a concurrent
    /// request on that level may be denied for a charge that is then refunded, never
    /// admitted beyond its quota.
    ///
    /// The headers are one level's, the one `check_all` returns: on a denial, the first level
    /// that denied, with a `Retry-After` long enough for every later level too; on an
    /// admission, the tightest level (the least remaining). `RateLimit-Policy` is that
    /// level's limiter's quota ([`AdvertisedQuota`]) under the name of the layer's policy,
    /// the builder's own for the first level (none at all if [`LayerBuilder::headers`] set
    /// `quota = None`). A cost above a level's capacity is `413` with that level's policy.
    ///
    /// Every option of the builder applies to every level: the cost, the mode, the headers;
    /// [`MissingKey`](crate::MissingKey), [`LayerBuilder::max_key_len`] and
    /// [`OversizedKey`](crate::OversizedKey) to each level's
    /// key (a request whose key is refused at any level is refused, and charged nowhere);
    /// [`LayerBuilder::on_decision`] is told the deciding level's key and decision. Plans
    /// do not combine with it (`within` is on a builder without them): each level's quota is
    /// its limiter's.
    ///
    /// Every level has the builder's limiter type `L` and extractor type `X`: no boxing and
    /// no new trait on the request path, and the common case (a header per level,
    /// [`HeaderKey`](crate::HeaderKey)) is one type. To mix extractors (an IP inside an API
    /// key's tenant), use your own enum implementing [`KeyExtractor`], or boxed closures
    /// (`Box<dyn Fn(&Parts) -> Option<String> + Send + Sync>` is one). For limiters that
    /// decide in the call ([`RateLimiter`]): every level is decided in `call`. Each request
    /// allocates two small vectors (the keys, the levels), one entry per level.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
    /// use hotlimit_tower::{HeaderKey, RateLimitLayer};
    /// use http::{Request, Response, StatusCode};
    /// use std::{convert::Infallible, sync::Arc};
    /// use tower::{Layer, ServiceExt};
    ///
    /// // 3 requests per user, 5 per organisation (bursts on a frozen clock: exact).
    /// let clock = ManualClock::default();
    /// let users = Arc::new(CasLimiter::<String, Gcra, _>::with_clock("1/h burst 3".parse()?, clock.clone()));
    /// let orgs = Arc::new(CasLimiter::<String, Gcra, _>::with_clock("1/h burst 5".parse()?, clock));
    /// let layer = RateLimitLayer::builder(users, HeaderKey::from_static("x-user"))
    ///     .within([(orgs, HeaderKey::from_static("x-org"))]);
    /// let app = layer.layer(tower::service_fn(|_req: Request<()>| async {
    ///     Ok::<_, Infallible>(Response::new(String::new()))
    /// }));
    ///
    /// let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// let send = |user: &str, org: &str| {
    ///     let req = Request::builder().header("x-user", user).header("x-org", org).body(()).unwrap();
    ///     rt.block_on(app.clone().oneshot(req)).unwrap().status()
    /// };
    /// for _ in 0..3 {
    ///     assert_eq!(send("alice", "acme"), StatusCode::OK);
    /// }
    /// assert_eq!(send("alice", "acme"), StatusCode::TOO_MANY_REQUESTS); // alice's 3, spent
    /// assert_eq!(send("bob", "acme"), StatusCode::OK);
    /// assert_eq!(send("bob", "acme"), StatusCode::OK);
    /// assert_eq!(send("bob", "acme"), StatusCode::TOO_MANY_REQUESTS); // acme's 5, spent
    /// assert_eq!(send("carol", "other"), StatusCode::OK);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn within<I>(self, outer: I) -> HierarchyLayer<L, X, C>
    where
        I: IntoIterator<Item = (Arc<L>, X)>,
    {
        let outer = outer
            .into_iter()
            .map(|(limiter, key)| Outer {
                policy: limiter.advertised_quota(),
                limiter,
                key,
            })
            .collect();
        HierarchyLayer {
            shared: Arc::new(Levels {
                shared: self.shared,
                outer,
            }),
        }
    }
}

/// A level around the builder's own: its limiter, its key, the policy it advertises.
struct Outer<L, X> {
    limiter: Arc<L>,
    key: X,
    policy: Option<QuotaPolicy>,
}

/// Everything a hierarchy's layer and services share: the builder's settings and first
/// level, and the levels around it.
struct Levels<L, X, C> {
    shared: Shared<L, X, C, NoPlans>,
    /// Innermost first.
    outer: Box<[Outer<L, X>]>,
}

/// A `tower::Layer` that counts each request against several levels at once, all or
/// nothing; from [`LayerBuilder::within`], whose docs say what it does. Cloning is cheap
/// (one `Arc`).
pub struct HierarchyLayer<L, X, C> {
    shared: Arc<Levels<L, X, C>>,
}

impl<L, X, C> Clone for HierarchyLayer<L, X, C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<L, X, C> fmt::Debug for HierarchyLayer<L, X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HierarchyLayer")
            .field("levels", &(1 + self.shared.outer.len()))
            .field("config", &ConfigView(&self.shared.shared))
            .finish()
    }
}

impl<S, L, X, C> tower_layer::Layer<S> for HierarchyLayer<L, X, C> {
    type Service = Hierarchy<S, L, X, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Hierarchy {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`HierarchyLayer`] wraps around an inner service. It is ready when the inner
/// service is; a request the layer answers itself never reaches it.
pub struct Hierarchy<S, L, X, C> {
    inner: S,
    shared: Arc<Levels<L, X, C>>,
}

impl<S: Clone, L, X, C> Clone for Hierarchy<S, L, X, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, L, X, C> fmt::Debug for Hierarchy<S, L, X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hierarchy")
            .field("inner", &self.inner)
            .field("levels", &(1 + self.shared.outer.len()))
            .finish_non_exhaustive()
    }
}

impl<L, X, C> Levels<L, X, C>
where
    L: RateLimiter<str> + Requests<str>,
    X: KeyExtractor,
    C: RequestCost,
{
    /// Level `i` (0: the builder's): its limiter, its key extractor, and the policy to pass
    /// to [`Shared::outcome`] (`None`: the layer's own).
    fn level(&self, i: usize) -> (&L, &X, Option<Option<QuotaPolicy>>) {
        match i.checked_sub(1).and_then(|o| self.outer.get(o)) {
            Some(o) => (&*o.limiter, &o.key, Some(o.policy)),
            None => (&*self.shared.limiter, &self.shared.key, None),
        }
    }

    /// Decides the request: every level's key, then one `check_all`.
    fn decide(&self, parts: &Parts) -> Outcome {
        let s = &self.shared;
        let cost = s.cost.cost(parts);
        if cost == 0 {
            // Free: not limited, as in the plain layer.
            return Outcome::Refuse(None);
        }
        let n = 1 + self.outer.len();
        let mut keys = Vec::with_capacity(n);
        for i in 0..n {
            match self.key_of(self.level(i).1, parts) {
                Ok(key) => keys.push(key),
                // Refused before any level is asked: nothing is charged.
                Err(status) => return s.refuse(status),
            }
        }
        let levels: Vec<_> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| (self.level(i).0, key.as_str(), None))
            .collect();
        let (i, result) = match hotlimit::check_all(&levels, cost) {
            Ok((i, decision)) => (i, Ok(decision)),
            Err(e) => (too_large_at(&levels, cost), Err(e)),
        };
        let key = keys.get(i).map_or("", Key::as_str);
        s.outcome(key, cost, self.level(i).2, result)
    }

    /// A level's key, by the plain layer's rules ([`Shared::key_by`]).
    fn key_of<'p>(&'p self, extractor: &X, parts: &'p Parts) -> Result<Key<'p>, StatusCode> {
        self.shared.key_by(extractor, parts)
    }
}

/// The level whose capacity `cost` exceeds, for the 413's policy: `check_all` says only
/// that one level's step failed. Peeks charge nothing; on the error path only.
#[cold]
fn too_large_at<L>(levels: &[(&L, &str, Option<&L::Algo>)], cost: u64) -> usize
where
    L: Requests<str>,
{
    levels
        .iter()
        .position(|&(l, key, _)| {
            let peeked = l.request(key).cost(cost).peek().map_err(Into::into);
            matches!(
                peeked,
                Err(QuotaError::ZeroCost | QuotaError::ExceedsCapacity { .. })
            )
        })
        .unwrap_or(0)
}

impl<S, L, X, C, ReqB, ResB> tower_service::Service<Request<ReqB>> for Hierarchy<S, L, X, C>
where
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Default,
    L: RateLimiter<str> + Requests<str>,
    X: KeyExtractor,
    C: RequestCost,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = HierarchyFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let levels = &*self.shared;
        let outcome = levels.decide(&parts);
        let kind = match levels.shared.admit(outcome, &mut parts) {
            Ok(fields) => Kind::Inner {
                future: self.inner.call(Request::from_parts(parts, body)),
                fields,
            },
            Err((status, fields)) => Kind::Answer { status, fields },
        };
        HierarchyFuture { kind }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Hierarchy`]: the inner service's response with the deciding
    /// level's rate-limit headers added, or the layer's own answer.
    pub struct HierarchyFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Inner { #[pin] future: F, fields: Option<Verdict> },
        Answer { status: StatusCode, fields: Option<Verdict> },
    }
}

impl<F> fmt::Debug for HierarchyFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HierarchyFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for HierarchyFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Default,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future, fields } => {
                let mut response = std::task::ready!(future.poll(cx))?;
                if let Some(fields) = fields.take() {
                    fields.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
            KindProj::Answer { status, fields } => {
                // Built here, not in `call`: a repeated poll gets the same answer.
                let mut response = Response::new(B::default());
                *response.status_mut() = *status;
                if let Some(fields) = fields {
                    fields.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
        }
    }
}
