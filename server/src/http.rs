//! The HTTP side: a JSON API for any language, health and metrics.
//!
//! - `POST /json` and `POST /v1/check`: decide and count. The body is Envoy's
//!   `RateLimitRequest` in protobuf's JSON mapping, as envoyproxy/ratelimit's `/json` takes it:
//!   `{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}],
//!   "hitsAddend": 1}`; the answer is its `RateLimitResponse`, `429` when over the limit.
//! - `POST /v1/peek`: the same answer, counting nothing.
//! - `POST /v1/take`: the same, charged, with a `ticket`; `POST /v1/settle` with
//!   `{"ticket": "<token>", "actual": 3}` refunds what was not used or charges the excess as a
//!   debt. The ticket is a signed token ([`crate::tickets`]).
//! - `GET /healthcheck`: `OK` (with `--health-checks-backend`, a 503 while the backend does
//!   not answer). `GET /metrics`: Prometheus' text format.
//!
//! Every error is JSON `{"error": "..."}`, a body past `--max-body-bytes` a 413; the server
//! handles at most `--max-concurrent` API requests at once (503 beyond, never a queue) and
//! answers 503 to one that takes longer than `--request-timeout-ms`. It keeps at most
//! `--max-connections` connections open (one more is closed as it is accepted), and closes
//! one whose next request's headers have not all come within `--header-timeout-ms` (idle
//! ones too): a slow client holds no connection, and no request slot, for long. Health and
//! metrics are outside the request limit, so API requests held open cannot fail a probe.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use futures_util::StreamExt;

use crate::service::{Code, Descriptor, Op, Rejection, Request, Response, Service, ServiceError};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    domain: String,
    #[serde(default)]
    descriptors: Kept<JsonDescriptor>,
    /// A `uint32` in Envoy's protocol: a number or, as protobuf's JSON writers may send it, a
    /// string; above 2^32 − 1 refused.
    #[serde(default, alias = "hits_addend")]
    #[serde(rename = "hitsAddend")]
    hits_addend: Option<Number>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Kept<JsonEntry>,
    /// A `UInt64Value`: a number or a string (protobuf's JSON form of 64-bit integers).
    #[serde(default, alias = "hits_addend")]
    #[serde(rename = "hitsAddend")]
    hits_addend: Option<Number>,
}

/// The most descriptors of a JSON request, and entries of a descriptor, that are decoded; the
/// rest are counted, not kept. An empty descriptor (`{}`) is 3 bytes of a body and 50-odd
/// decoded: a body of `--max-body-bytes` of them decoded to about 20 times its size before its
/// limits were checked. Past this the request is refused, as the service refuses it whole
/// (the limits are lower: 64 and 16 by default).
pub const KEPT: usize = 4096;

/// A JSON array's first [`KEPT`] items, and how many it has in all.
struct Kept<T> {
    items: Vec<T>,
    total: usize,
}

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Kept {
            items: Vec::new(),
            total: 0,
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Kept<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Items<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Items<T> {
            type Value = Kept<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<S: serde::de::SeqAccess<'de>>(
                self,
                mut seq: S,
            ) -> Result<Kept<T>, S::Error> {
                let mut kept = Kept::default();
                while kept.items.len() < KEPT {
                    match seq.next_element()? {
                        Some(item) => kept.items.push(item),
                        None => break,
                    }
                }
                kept.total = kept.items.len();
                if kept.total == KEPT {
                    // Read (their JSON is still checked), counted, not kept.
                    while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                        kept.total += 1;
                    }
                }
                Ok(kept)
            }
        }
        d.deserialize_seq(Items(std::marker::PhantomData))
    }
}

impl JsonRequest {
    /// Whether more descriptors, or entries of one, came than were kept.
    fn cut(&self) -> bool {
        let cut = |total: usize, kept: usize| total > kept;
        cut(self.descriptors.total, self.descriptors.items.len())
            || self
                .descriptors
                .items
                .iter()
                .any(|d| cut(d.entries.total, d.entries.items.len()))
    }
}

/// An unsigned integer as protobuf's JSON mapping writes one: a number or a decimal string.
/// Read by a visitor of its own, not serde's `untagged` (which buffers the whole value
/// before trying each form: an array of 256 KiB of `0,` as a `hitsAddend` was 16 times its
/// size in memory): any other value is refused at its first byte.
enum Number {
    Int(u64),
    Text(String),
}

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Number;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an unsigned integer, or one as a string")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Number, E> {
                Ok(Number::Int(n))
            }
            fn visit_str<E: serde::de::Error>(self, t: &str) -> Result<Number, E> {
                Ok(Number::Text(t.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

impl Number {
    fn value(&self, field: &str) -> Result<u64, ServiceError> {
        match self {
            Number::Int(n) => Ok(*n),
            Number::Text(t) => t.parse().map_err(|_| {
                ServiceError::Invalid(
                    Rejection::Malformed,
                    format!("{field}: `{t}` is not an unsigned integer"),
                )
            }),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonResponse {
    overall_code: &'static str,
    statuses: Vec<JsonStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<JsonHeader>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ticket: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonStatus {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<JsonLimit>,
    limit_remaining: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonLimit {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    requests_per_unit: u32,
    unit: &'static str,
}

#[derive(Serialize)]
struct JsonHeader {
    key: String,
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleRequest {
    ticket: String,
    actual: u64,
}

fn code(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    }
}

/// protobuf's JSON form of a duration: seconds with up to 9 decimals and an `s`.
fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    match d.subsec_nanos() {
        0 => format!("{secs}s"),
        n => format!("{secs}.{}s", format!("{n:09}").trim_end_matches('0')),
    }
}

fn to_json(r: Response) -> (StatusCode, Json<JsonResponse>) {
    let status = match r.overall_code {
        Code::Ok => StatusCode::OK,
        Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
    };
    let body = JsonResponse {
        overall_code: code(r.overall_code),
        statuses: r
            .statuses
            .into_iter()
            .map(|s| JsonStatus {
                code: code(s.code),
                current_limit: s.current_limit.map(|l| JsonLimit {
                    name: l.name,
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit.name(),
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s.duration_until_reset.map(duration),
            })
            .collect(),
        response_headers_to_add: r
            .headers
            .into_iter()
            .map(|(key, value)| JsonHeader { key, value })
            .collect(),
        ticket: r.ticket,
    };
    (status, Json(body))
}

/// Every error as JSON, its status in one place: 400 for a bad request, 413 for a body
/// over the bound (or a take whose ticket would be), 404 for a ticket that settles nothing, 503 when the backend failed.
fn error(e: ServiceError) -> HttpResponse {
    let status = match e {
        ServiceError::Invalid(Rejection::BodyTooLarge | Rejection::TicketTooLarge, _) => {
            StatusCode::PAYLOAD_TOO_LARGE
        }
        ServiceError::Invalid(..) => StatusCode::BAD_REQUEST,
        ServiceError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        ServiceError::Ticket(_) => StatusCode::NOT_FOUND,
    };
    (status, Json(serde_json::json!({ "error": e.to_string() }))).into_response()
}

fn request(body: JsonRequest) -> Result<Request, ServiceError> {
    let hits = match &body.hits_addend {
        Some(n) => n.value("hitsAddend")?,
        None => 0,
    };
    let hits = u32::try_from(hits).map_err(|_| {
        ServiceError::Invalid(
            Rejection::Cost,
            format!("hitsAddend {hits} is above 4294967295 (a uint32)"),
        )
    })?;
    let descriptors = body
        .descriptors
        .items
        .into_iter()
        .map(|d| {
            Ok(Descriptor {
                entries: d
                    .entries
                    .items
                    .into_iter()
                    .map(|e| (e.key, e.value))
                    .collect(),
                hits: d
                    .hits_addend
                    .as_ref()
                    .map(|n| n.value("hitsAddend"))
                    .transpose()?,
                negative: false,
            })
        })
        .collect::<Result<_, ServiceError>>()?;
    Ok(Request {
        domain: body.domain,
        descriptors,
        hits,
    })
}

/// A `RateLimitRequest` in protobuf's JSON form, as `/json` and `/v1/check` take it: the
/// request, or why it is none (a [`ServiceError::Invalid`]). The service's bounds are checked
/// when it is decided; more than [`KEPT`] descriptors, or entries in one, are refused as they
/// are read.
pub fn decode(body: &[u8]) -> Result<Request, ServiceError> {
    let json = from_json(body)?;
    if json.cut() {
        return Err(past_kept());
    }
    request(json)
}

fn from_json(body: &[u8]) -> Result<JsonRequest, ServiceError> {
    serde_json::from_slice(body)
        .map_err(|e| ServiceError::Invalid(Rejection::Malformed, e.to_string()))
}

/// What a request past [`KEPT`] gets where no lower limit refuses it first.
fn past_kept() -> ServiceError {
    ServiceError::Invalid(
        Rejection::TooManyDescriptors,
        format!("more than {KEPT} descriptors, or entries in one: not read"),
    )
}

/// [`decode`] for `service`: a request cut at [`KEPT`] gets the answer the service gives it
/// whole (its limits are lower: its count is refused, in the order the service checks).
fn parse(service: &Service, body: &[u8]) -> Result<Request, ServiceError> {
    let counted = |e: ServiceError| {
        if let ServiceError::Invalid(why, _) = &e {
            service.metrics.rejected(*why);
        }
        e
    };
    let json = from_json(body).map_err(counted)?;
    if json.cut() {
        let entries = json.descriptors.items.iter().map(|d| d.entries.total);
        service.admit_shape(&json.domain, json.descriptors.total, entries)?;
        return Err(counted(past_kept()));
    }
    request(json).map_err(counted)
}

async fn decide(service: &Service, body: Body, op: Op) -> HttpResponse {
    let parsed = read_bytes(service, body)
        .await
        .and_then(|b| parse(service, &b));
    let answer = match parsed {
        Ok(request) => service.decide(&request, op).await,
        Err(e) => Err(e),
    };
    match answer {
        Ok(r) => to_json(r).into_response(),
        Err(e) => error(e),
    }
}

/// The body as JSON, whatever its `Content-Type` (curl's default form type included), read
/// up to the service's bound: past it a 413 (what is left of it read and dropped, up to a
/// cap, so the client reads the answer instead of a reset connection).
async fn read<T: serde::de::DeserializeOwned>(
    service: &Service,
    body: Body,
) -> Result<T, ServiceError> {
    let bytes = read_bytes(service, body).await?;
    serde_json::from_slice(&bytes).map_err(|e| malformed(service, e.to_string()))
}

/// The body's bytes, up to the service's bound (past it, a 413 as [`read`] says).
async fn read_bytes(service: &Service, body: Body) -> Result<Vec<u8>, ServiceError> {
    let max = service.settings().limits.max_body_bytes;
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    let mut over = false;
    let mut drained = 0usize;
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            return Err(malformed(service, "the body could not be read".into()));
        };
        if over || bytes.len() + chunk.len() > max {
            over = true;
            drained += chunk.len();
            if drained > DRAIN_CAP {
                break;
            }
            continue;
        }
        bytes.extend_from_slice(&chunk);
    }
    if over {
        service.metrics.rejected(Rejection::BodyTooLarge);
        return Err(ServiceError::Invalid(
            Rejection::BodyTooLarge,
            format!("the body is larger than {max} bytes"),
        ));
    }
    Ok(bytes)
}

/// How much of a body past the bound is read and dropped before the answer.
const DRAIN_CAP: usize = 64 * 1024 * 1024;

fn malformed(service: &Service, e: String) -> ServiceError {
    service.metrics.rejected(Rejection::Malformed);
    ServiceError::Invalid(Rejection::Malformed, e)
}

async fn check(State(s): State<Arc<Service>>, body: Body) -> HttpResponse {
    decide(&s, body, Op::Check).await
}

async fn peek(State(s): State<Arc<Service>>, body: Body) -> HttpResponse {
    decide(&s, body, Op::Peek).await
}

async fn take(State(s): State<Arc<Service>>, body: Body) -> HttpResponse {
    decide(&s, body, Op::Take).await
}

async fn settle(State(s): State<Arc<Service>>, body: Body) -> HttpResponse {
    let result = match read::<SettleRequest>(&s, body).await {
        Ok(body) => s.settle(&body.ticket, body.actual).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => Json(serde_json::json!({ "settled": true })).into_response(),
        Err(e) => error(e),
    }
}

/// `OK`; with `--health-checks-backend`, a 503 while the backend does not answer.
async fn health(State(s): State<Arc<Service>>) -> HttpResponse {
    match s.healthy().await {
        Ok(()) => "OK".into_response(),
        Err(e) => error(e),
    }
}

async fn metrics(State(s): State<Arc<Service>>) -> HttpResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

/// How the HTTP and gRPC servers bound their work: requests at once, how long each may
/// take, and the connections they keep (see [`serve`] and [`crate::grpc::serve`]).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// API requests handled at once; more are answered 503 at once, never queued.
    pub max_concurrent: usize,
    /// A request not answered within this is answered 503.
    pub timeout: Duration,
    /// Connections open at once, on each port; one more is closed as it is accepted.
    pub max_connections: usize,
    /// An HTTP connection whose next request's headers have not all come within this is
    /// closed (an idle one too); a gRPC one whose HTTP/2 preface has not, too, and one silent
    /// this long is pinged, and closed if the ping goes unanswered as long.
    pub header_timeout: Duration,
    /// A gRPC connection this old is sent GOAWAY, and closed once its calls are done (its
    /// client connects again): envoyproxy/ratelimit's `GRPC_MAX_CONNECTION_AGE`. `None`: never.
    pub max_connection_age: Option<Duration>,
    /// How long a gRPC connection past its age has to finish its calls before it is closed
    /// whatever they are doing (`GRPC_MAX_CONNECTION_AGE_GRACE`).
    pub max_connection_age_grace: Duration,
    /// Streams open at once on one gRPC connection (HTTP/2's `MAX_CONCURRENT_STREAMS`; a
    /// client such as Envoy opens another connection past it). Without one a connection could
    /// hold streams without bound: a client that never reads its answers keeps each one's
    /// state and buffers until the connection's end.
    pub grpc_max_streams: u32,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_concurrent: 1024,
            timeout: Duration::from_secs(10),
            max_connections: 4096,
            header_timeout: Duration::from_secs(10),
            // envoyproxy/ratelimit's defaults.
            max_connection_age: Some(Duration::from_secs(24 * 3600)),
            max_connection_age_grace: Duration::from_secs(3600),
            // hyper's own default, which tonic replaces by none.
            grpc_max_streams: 100,
        }
    }
}

/// Serves `router` on `listener` within `bounds` until `shutdown` completes, then lets the
/// requests under way finish. As `axum::serve` does, but with hyper's header read timer
/// (`axum::serve` sets no timer, so hyper's header timeout never runs: a client that sends
/// its headers a byte at a time, or never, held its connection forever) and a cap on open
/// connections.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    bounds: Bounds,
    shutdown: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let open = Arc::new(tokio::sync::Semaphore::new(bounds.max_connections.max(1)));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                // Out of descriptors, or a connection reset before it was accepted: the
                // listener stays; a pause keeps a lasting error from spinning.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Over the cap: closed at once (dropped), before anything is read from it.
        let Ok(slot) = open.clone().try_acquire_owned() else {
            continue;
        };
        // As `axum::serve` does: a small answer is sent at once, not after Nagle's delay.
        let _ = tcp.set_nodelay(true);
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(bounds.header_timeout)
            .serve_connection(TokioIo::new(tcp), TowerToHyperService::new(router.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A connection's end, a client's or a timeout's, is no server error.
            let _ = conn.await;
            drop(slot);
        });
    }
    // No connection taken from here: the port closes, and the requests under way finish.
    drop(listener);
    graceful.shutdown().await;
}

/// The HTTP routes over a [`Service`], bounded by `bounds`.
pub fn router(service: Arc<Service>, bounds: Bounds) -> Router {
    let overload = |e: tower::BoxError| async move {
        let why = if e.is::<tower::timeout::error::Elapsed>() {
            "the request timed out"
        } else {
            "overloaded: too many requests at once"
        };
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "error": why })),
        )
    };
    // One limit for every API route together: `Router::layer` would give each route a
    // limiter of its own (`max_concurrent` a route, not in all), so the routes are wrapped
    // whole, as one service.
    let api = Router::new()
        .route("/json", post(check))
        .route("/v1/check", post(check))
        .route("/v1/peek", post(peek))
        .route("/v1/take", post(take))
        .route("/v1/settle", post(settle))
        .with_state(service.clone());
    let api = tower::ServiceBuilder::new()
        .layer(axum::error_handling::HandleErrorLayer::new(overload))
        .load_shed()
        .concurrency_limit(bounds.max_concurrent)
        .timeout(bounds.timeout)
        .service(api);
    // Outside the request limit (a probe must answer while API requests fill it), under the
    // timeout (a backend health check may hang); the connection cap bounds them.
    Router::new()
        .route("/healthcheck", get(health))
        .route("/metrics", get(metrics))
        .layer(
            tower::ServiceBuilder::new()
                .layer(axum::error_handling::HandleErrorLayer::new(overload))
                .timeout(bounds.timeout),
        )
        .with_state(service)
        .fallback_service(api)
}

#[cfg(test)]
mod tests {
    // Pins G67.
    #[test]
    fn durations_in_protobuf_json_form() {
        use std::time::Duration;
        assert_eq!(super::duration(Duration::from_secs(59)), "59s");
        assert_eq!(super::duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(
            super::duration(Duration::from_nanos(1_000_000_001)),
            "1.000000001s"
        );
    }
}
