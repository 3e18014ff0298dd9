//! Configuration: the mode, what to do with missing and oversized keys, the report, the
//! builder.

use super::plan::{NoPlans, PlanLimiter, Plans, RequestPlan};
#[cfg(doc)]
use super::{AdvertisedQuota, DEFAULT_MAX_KEY_LEN};
use super::{KeyExtractor, RateLimitLayer, RequestCost, UnitCost};
use hotlimit::headers::{Mode, RateLimitHeaders};
use hotlimit::AsyncRateLimiter;
use hotlimit::Decision;
use http::request::Parts;
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

/// What to do with a request that has no key (no connection address, no such header).
///
/// # Examples
///
/// ```
/// use hotlimit_tower::MissingKey;
///
/// let anonymous = MissingKey::Fallback("anonymous".into()); // all keyless requests share one budget
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

/// What to do with a key longer than [`LayerBuilder::max_key_len`].
///
/// Either way the limiter never stores more than the bound per key, whatever the client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OversizedKey {
    /// Key the request by the first 128 bits of the key's SHA-256 (written `#` and 32 hex
    /// digits): distinct long keys (JWTs, say) stay distinct, no client can aim its key at
    /// another's hash, and the hash is the same on every instance and after a restart, so a
    /// shared backend counts a long key once for the whole fleet. The default.
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

/// What [`LayerBuilder::on_decision`] is told about each decided request.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Report<'a> {
    /// The key the request was counted under (after [`MissingKey`] and [`OversizedKey`]).
    pub key: &'a str,
    /// The request's cost.
    pub cost: u64,
    /// The limiter's decision: a denial was answered 429 in [`Mode::Enforce`], "would have
    /// been denied" in the other modes.
    pub decision: Decision,
    /// The layer's mode.
    pub mode: Mode,
}

type OnDecision = Box<dyn Fn(&Report<'_>) + Send + Sync>;
type ShadowHook = Box<dyn Fn(&Decision, &mut Parts) + Send + Sync>;

/// Everything a layer and its services share.
pub(super) struct Shared<L: ?Sized, X, C, P> {
    pub(super) limiter: Arc<L>,
    pub(super) key: X,
    pub(super) cost: C,
    /// How a request's quota is picked.
    pub(super) plan: P,
    /// The mode, the policy and which fields go out.
    pub(super) headers: RateLimitHeaders,
    pub(super) missing: MissingKey,
    pub(super) max_key_len: usize,
    pub(super) oversized: OversizedKey,
    pub(super) on_decision: Option<OnDecision>,
    pub(super) shadow_hook: Option<ShadowHook>,
}

/// Configures a [`RateLimitLayer`]; from [`RateLimitLayer::builder`].
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::FixedWindow, headers::Mode, CasLimiter};
/// use hotlimit_tower::{ForwardedIp, MissingKey, RateLimitLayer};
/// use std::{sync::{atomic::{AtomicU64, Ordering}, Arc}, time::Duration};
///
/// let limiter = Arc::new(CasLimiter::<String, _>::new(FixedWindow::new(100, Duration::from_secs(60))?));
/// let would_deny = Arc::new(AtomicU64::new(0));
/// let counter = would_deny.clone();
/// let layer = RateLimitLayer::builder(limiter, ForwardedIp::x_forwarded_for(1))
///     .headers(|h| (h.mode, h.legacy) = (Mode::DryRun, true))
///     .on_decision(move |r| if r.decision.is_denied() { counter.fetch_add(1, Ordering::Relaxed); })
///     .missing_key(MissingKey::Fallback("unknown-client".into()))
///     .build();
/// # let _ = layer;
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[must_use]
pub struct LayerBuilder<L: ?Sized, X, C = UnitCost, P = NoPlans> {
    pub(super) shared: Shared<L, X, C, P>,
}

impl<L: ?Sized, X, C, P> fmt::Debug for LayerBuilder<L, X, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerBuilder")
            .field("config", &ConfigView(&self.shared))
            .finish()
    }
}

/// The plain settings of a [`Shared`], for `Debug`.
pub(super) struct ConfigView<'a, L: ?Sized, X, C, P>(pub(super) &'a Shared<L, X, C, P>);

impl<L: ?Sized, X, C, P> fmt::Debug for ConfigView<'_, L, X, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        f.debug_struct("Config")
            .field("headers", &s.headers)
            .field("missing_key", &s.missing)
            .field("max_key_len", &s.max_key_len)
            .field("oversized_key", &s.oversized)
            .field("on_decision", &s.on_decision.is_some())
            .field("shadow_hook", &s.shadow_hook.is_some())
            .finish_non_exhaustive()
    }
}

impl<L, X, C, P> LayerBuilder<L, X, C, P>
where
    L: AsyncRateLimiter<str> + ?Sized,
    X: KeyExtractor,
    C: RequestCost,
    P: RequestPlan<L>,
{
    /// The cost function (default [`UnitCost`]).
    pub fn cost<C2: RequestCost>(self, cost: C2) -> LayerBuilder<L, X, C2, P> {
        self.rebuild(|_, plan| (cost, plan))
    }

    /// The same settings with another cost function and plan.
    fn rebuild<C2, P2>(self, f: impl FnOnce(C, P) -> (C2, P2)) -> LayerBuilder<L, X, C2, P2> {
        let s = self.shared;
        let (cost, plan) = f(s.cost, s.plan);
        LayerBuilder {
            shared: Shared {
                limiter: s.limiter,
                key: s.key,
                cost,
                plan,
                headers: s.headers,
                missing: s.missing,
                max_key_len: s.max_key_len,
                oversized: s.oversized,
                on_decision: s.on_decision,
                shadow_hook: s.shadow_hook,
            },
        }
    }

    /// A quota per request (a plan): `pick` chooses it from the request's head and key (an API
    /// key's plan, a tenant's contract), `None` for the limiter's own. The limiter decides the
    /// request under it ([`PlanLimiter`]: the in-memory keyed limiters, `AsyncRedisLimiter`),
    /// on the key's one state whatever the plan (see
    /// [`Request::quota`](hotlimit::Request::quota)), and the headers advertise the
    /// plan's policy (its [`AdvertisedQuota`], under the name of the layer's policy; none if
    /// [`RateLimitHeaders::quota`] is `None`). A plan
    /// whose quota cannot read the limiter's states (another window, say) is a
    /// misconfiguration: answered `503` in [`Mode::Enforce`], never an allow.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter};
    /// use hotlimit_tower::{HeaderKey, RateLimitLayer};
    /// use std::sync::Arc;
    ///
    /// let free: Gcra = "10/min".parse()?;
    /// let pro: Gcra = "1000/min burst 100".parse()?;
    /// let limiter = Arc::new(CasLimiter::<String, Gcra>::new(free));
    /// let layer = RateLimitLayer::builder(limiter, HeaderKey::from_static("x-api-key"))
    ///     .plans(move |_parts, key| key.starts_with("pro_").then_some(pro))
    ///     .build();
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn plans<F>(self, pick: F) -> LayerBuilder<L, X, C, Plans<F>>
    where
        L: PlanLimiter,
        F: Fn(&Parts, &str) -> Option<L::Quota> + Send + Sync + 'static,
    {
        self.rebuild(|cost, _| (cost, Plans::new(pick)))
    }

    /// The mode, the policy advertised and which fields go out, set on the layer's
    /// [`RateLimitHeaders`]: by default [`Mode::Enforce`], the limiter's
    /// [`AdvertisedQuota`] (`quota = None` leaves `RateLimit-Policy` and `X-RateLimit-Limit`
    /// out), the newest draft, no legacy fields, fields on denials only.
    ///
    /// ```
    /// # use hotlimit::{algo::Gcra, headers::{Draft, Mode}, CasLimiter};
    /// # use hotlimit_tower::{HeaderKey, RateLimitLayer};
    /// # use std::sync::Arc;
    /// # let limiter = Arc::new(CasLimiter::<String, Gcra>::new("10/s".parse()?));
    /// // A credential as the key: every value hashed (`max_key_len(0)`), never stored as sent.
    /// let layer = RateLimitLayer::builder(limiter, HeaderKey::new(http::header::AUTHORIZATION))
    ///     .max_key_len(0)
    ///     .headers(|h| (h.mode, h.draft, h.on_allowed) = (Mode::DryRun, Draft::Ietf07, true))
    ///     .build();
    /// # let _ = layer;
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    pub fn headers(mut self, set: impl FnOnce(&mut RateLimitHeaders)) -> Self {
        set(&mut self.shared.headers);
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
    /// only: a later [`LayerBuilder::headers`] setting another mode disables it.
    pub fn shadow_hook(
        mut self,
        hook: impl Fn(&Decision, &mut Parts) + Send + Sync + 'static,
    ) -> Self {
        self.shared.headers.mode = Mode::Shadow;
        self.shared.shadow_hook = Some(Box::new(hook));
        self
    }

    /// What to do with a request without a key (default [`MissingKey::Reject`]).
    pub fn missing_key(mut self, missing: MissingKey) -> Self {
        self.shared.missing = missing;
        self
    }

    /// The longest key, in bytes, used as is (default [`DEFAULT_MAX_KEY_LEN`]); longer ones
    /// follow [`LayerBuilder::oversized_key`].
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.shared.max_key_len = bytes;
        self
    }

    /// What to do with a key over [`LayerBuilder::max_key_len`] (default [`OversizedKey::Hash`]).
    pub fn oversized_key(mut self, oversized: OversizedKey) -> Self {
        self.shared.oversized = oversized;
        self
    }

    /// The layer.
    pub fn build(self) -> RateLimitLayer<L, X, C, P> {
        RateLimitLayer {
            shared: Arc::new(self.shared),
        }
    }
}
