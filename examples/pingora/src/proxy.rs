//! The proxy's request phases: key the request, decide it, answer 429 (or 400) itself or pass
//! it on, and add the rate-limit headers to the upstream's response.

use async_trait::async_trait;
use hotlimit::headers::{Action, HeaderField, Mode, RateLimitHeaders, Verdict};
use hotlimit::{QuotaError, Ticket};
use hotlimit::{RateLimiter, Requests};
use hotlimit_tower::{ForwardedIp, Key, KeyExtractor};
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH};

/// `X-Forwarded-For`, to which the proxy appends the client's address for the upstream.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
use pingora::http::ResponseHeader;
use pingora::prelude::{HttpPeer, RequestHeader, Session};
use pingora::proxy::ProxyHttp;
use std::net::SocketAddr;

/// The request header that tells the upstream, in shadow mode, what the limiter decided:
/// `denied` or `allowed`.
pub const SHADOW_HEADER: HeaderName = HeaderName::from_static("hotlimit-shadow");

/// What a request is keyed by.
#[derive(Debug, Clone, Copy)]
pub enum KeyArg {
    /// The client's address from the connection (`session.client_addr()`).
    Ip,
    /// The client's address in `X-Forwarded-For`, behind trusted proxies.
    Forwarded(ForwardedIp),
}

impl KeyArg {
    /// Parses `ip` or `forwarded:<n>`, `n` ≥ 1 the number of trusted proxies in front.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if s == "ip" => Ok(KeyArg::Ip),
            Some(("forwarded", n)) => match n.parse::<usize>() {
                Ok(n @ 1..) => Ok(KeyArg::Forwarded(ForwardedIp::x_forwarded_for(n))),
                _ => Err(format!(
                    "bad proxy count `{n}` (expected the number of trusted proxies, at least 1)"
                )),
            },
            _ => Err(format!("unknown key `{s}` (expected ip or forwarded:<n>)")),
        }
    }
}

impl KeyArg {
    /// The request's key: the peer's address as text (formatted on the stack), or the
    /// forwarded client's address from the head (pingora's `RequestHeader` is an
    /// `http::request::Parts`, which the tower layer's extractors read).
    fn key<'a>(&self, session: &'a Session) -> Option<Key<'a>> {
        match self {
            KeyArg::Ip => session
                .client_addr()
                .and_then(|a| a.as_inet())
                .map(|a| Key::from(a.ip())),
            KeyArg::Forwarded(k) => k.extract(session.req_header()),
        }
    }
}

/// Settle at response time: a provisional cost taken from the request, settled with the real
/// one from the upstream's response (hotlimit's take and settle).
#[derive(Debug, Clone, Default)]
pub struct SettleArgs {
    /// The request header with the provisional cost (default 1).
    pub cost_header: Option<HeaderName>,
    /// The response header with the real cost (the upstream's usage report); without it, or
    /// without a valid number in it, the provisional cost stands.
    pub settle_header: Option<HeaderName>,
    /// Only responses with this status count (401: failed logins); the others are refunded.
    pub count_status: Option<u16>,
}

impl SettleArgs {
    /// Whether any settle option is set.
    pub fn enabled(&self) -> bool {
        self.cost_header.is_some() || self.settle_header.is_some() || self.count_status.is_some()
    }

    /// The request's provisional cost.
    fn provisional(&self, req: &RequestHeader) -> u64 {
        self.cost_header
            .as_ref()
            .and_then(|h| req.headers.get(h)?.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    }

    /// The real cost the response reports; `None`: as taken.
    fn actual(&self, resp: &ResponseHeader, charged: u64) -> Option<u64> {
        if let Some(code) = self.count_status {
            if resp.status.as_u16() != code {
                return Some(0);
            }
        }
        match &self.settle_header {
            Some(h) => resp.headers.get(h)?.to_str().ok()?.parse().ok(),
            None => Some(charged),
        }
    }
}

/// A reverse proxy to one upstream, limiting each client with any hotlimit limiter keyed by
/// text: this process's own (`CasLimiter<String, Gcra>`) or the fleet's
/// (`hotlimit::redis::HybridLimiter<Gcra>`, whose decisions are as local).
#[derive(Debug)]
pub struct RateLimitProxy<L> {
    limiter: L,
    key: KeyArg,
    headers: RateLimitHeaders,
    upstream: SocketAddr,
    settle: SettleArgs,
}

impl<L> RateLimitProxy<L> {
    /// A proxy to `upstream` that limits with `limiter`, keyed by `key`, its answers and header
    /// fields as `headers` says (mode, draft, legacy fields), settling at response time as
    /// `settle` says.
    pub fn new(
        limiter: L,
        key: KeyArg,
        headers: RateLimitHeaders,
        upstream: SocketAddr,
        settle: SettleArgs,
    ) -> Self {
        Self {
            limiter,
            key,
            headers,
            upstream,
            settle,
        }
    }
}

/// What `request_filter` leaves for the later phases of a request it let through.
#[derive(Debug, Default)]
pub struct Ctx {
    /// The limiter's verdict; `None` for a request without a key in dry-run or shadow mode
    /// (let through uncounted).
    verdict: Option<Verdict>,
    /// With settle: the key and the ticket of the provisional charge.
    open: Option<(String, Ticket)>,
}

// `check` must not block: it runs on pingora's async worker threads. Both limiters decide in
// memory (the hybrid one syncs with Redis on a thread of its own).
#[async_trait]
impl<L: RateLimiter<str> + Requests<str> + 'static> ProxyHttp for RateLimitProxy<L> {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<bool> {
        // An empty key is a missing one: one bucket for every client that sends nothing would
        // be a key nobody chose. 400 as the tower layer's `MissingKey::Reject`; uncounted in
        // the other modes, which never deny.
        let key = match self.key.key(session) {
            Some(key) if !key.as_str().is_empty() => key,
            _ if self.headers.mode == Mode::Enforce => {
                answer(session, 400, std::iter::empty()).await?;
                return Ok(true);
            }
            _ => return Ok(false),
        };
        let decision = if self.settle.enabled() {
            let cost = self.settle.provisional(session.req_header());
            match self.limiter.request(key.as_str()).cost(cost).take() {
                Ok(ticket) => {
                    let decision = ticket.decision();
                    if decision.is_allowed() {
                        ctx.open = Some((key.as_str().to_owned(), ticket));
                    }
                    decision
                }
                // A cost no burst can admit: 429, as a too-large request; in the modes that
                // never deny, let through uncounted (and said).
                Err(_) if self.headers.mode == Mode::Enforce => {
                    let fields = self.headers.too_large().fields().collect::<Vec<_>>();
                    answer(session, 429, fields.into_iter()).await?;
                    return Ok(true);
                }
                Err(e) => {
                    eprintln!("{}: would refuse {}: {e}", self.headers.mode, key.as_str());
                    return Ok(false);
                }
            }
        } else {
            self.limiter.check(key.as_str())
        };
        if decision.is_denied() && self.headers.mode != Mode::Enforce {
            eprintln!(
                "{}: would deny {} (retry after {:?})",
                self.headers.mode,
                key.as_str(),
                decision.retry_after()
            );
        }
        let verdict = self.headers.verdict(decision);
        if let Action::Answer(status) = verdict.action {
            answer(session, status.as_u16(), verdict.fields()).await?;
            return Ok(true);
        }
        ctx.verdict = Some(verdict);
        Ok(false)
    }

    async fn upstream_peer(&self, _: &mut Session, _: &mut Ctx) -> pingora::Result<Box<HttpPeer>> {
        // Plain HTTP: no TLS, no SNI.
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        // As proxies do, the upstream learns the client: this hop's peer is appended to
        // `X-Forwarded-For` (what `--key forwarded:<n>` reads one proxy further on).
        // The lines are joined as bytes: one a client poisoned with a non-ASCII byte keeps
        // what a proxy in front appended to it.
        if let Some(peer) = session.client_addr().and_then(|a| a.as_inet()) {
            let mut chain = Vec::new();
            for line in upstream_request.headers.get_all(X_FORWARDED_FOR) {
                chain.extend_from_slice(line.as_bytes());
                chain.extend_from_slice(b", ");
            }
            chain.extend_from_slice(peer.ip().to_string().as_bytes());
            // Header bytes and an address: always a valid value.
            if let Ok(chain) = HeaderValue::from_bytes(&chain) {
                upstream_request.insert_header(X_FORWARDED_FOR, chain)?;
            }
        }
        // Shadow mode: the upstream decides what a denial means (answer as usual but skip the
        // work, log it, ...). A client's own `hotlimit-shadow` is replaced, never trusted, and
        // removed in every other mode (or where there is no decision).
        match ctx.verdict.map(|v| v.action) {
            Some(Action::Shadow(d)) if self.headers.mode == Mode::Shadow => {
                let value = if d.is_denied() { "denied" } else { "allowed" };
                upstream_request.insert_header(SHADOW_HEADER, value)?;
            }
            _ => {
                upstream_request.remove_header(&SHADOW_HEADER);
            }
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        if let Some((key, mut ticket)) = ctx.open.take() {
            if let Some(cost) = self.settle.actual(upstream_response, ticket.charged()) {
                // Units not used come back; an overrun is a debt paid before the next
                // admission. The ticket is this limiter's, for this key: it settles. A count
                // past the debt the algorithm can hold (a broken upstream's) is charged that
                // most, not dropped: a larger count never costs less.
                if let Err(e) = self.limiter.request(key.as_str()).settle(&mut ticket, cost) {
                    if let QuotaError::ExceedsCapacity { capacity, .. } = e.into() {
                        let _ = self
                            .limiter
                            .request(key.as_str())
                            .settle(&mut ticket, capacity);
                    }
                }
            }
        }
        if let Some(verdict) = ctx.verdict {
            for field in verdict.fields() {
                set(upstream_response, field)?;
            }
        }
        Ok(())
    }
}

/// Sets one rate-limit field on a response: a list field is appended (after the upstream's
/// own policies, if any), the others replace the upstream's value.
fn set(resp: &mut ResponseHeader, field: HeaderField) -> pingora::Result<()> {
    if field.list {
        resp.append_header(field.name, field.value)?;
    } else {
        resp.insert_header(field.name, field.value)?;
    }
    Ok(())
}

/// Answers the request with `status`, the header `fields` and no body.
async fn answer(
    session: &mut Session,
    status: u16,
    fields: impl Iterator<Item = HeaderField>,
) -> pingora::Result<()> {
    let mut resp = ResponseHeader::build(status, None)?;
    for field in fields {
        set(&mut resp, field)?;
    }
    resp.insert_header(CONTENT_LENGTH, HeaderValue::from_static("0"))?;
    session.write_response_header(Box::new(resp), true).await
}
