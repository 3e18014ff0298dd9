//! The HTTP side: a JSON API for any language, health and metrics.
//!
//! - `POST /json` and `POST /v1/check`: decide and count. The body is Envoy's
//!   `RateLimitRequest` in protobuf's JSON mapping, as envoyproxy/ratelimit's `/json` takes it:
//!   `{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}],
//!   "hitsAddend": 1}`; the answer is its `RateLimitResponse`, `429` when over the limit.
//! - `POST /v1/peek`: the same answer, counting nothing.
//! - `POST /v1/take`: the same, charged, with a `ticket`; `POST /v1/settle` with
//!   `{"ticket": 1, "actual": 3}` refunds what was not used or charges the excess as a debt.
//! - `GET /healthcheck`: `OK`. `GET /metrics`: Prometheus' text format.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::service::{Code, Descriptor, Op, Request, Response, Service, ServiceError};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend")]
    #[serde(rename = "hitsAddend")]
    hits_addend: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default, alias = "hits_addend")]
    #[serde(rename = "hitsAddend")]
    hits_addend: Option<u64>,
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
    ticket: Option<u64>,
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
    ticket: u64,
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

fn error(e: ServiceError) -> HttpResponse {
    let status = match e {
        ServiceError::Invalid(_) => StatusCode::BAD_REQUEST,
        ServiceError::Unavailable(_) | ServiceError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
        ServiceError::Ticket(_) => StatusCode::NOT_FOUND,
    };
    (status, Json(serde_json::json!({ "error": e.to_string() }))).into_response()
}

async fn decide(service: &Service, body: JsonRequest, op: Op) -> HttpResponse {
    let request = Request {
        domain: body.domain,
        descriptors: body
            .descriptors
            .into_iter()
            .map(|d| Descriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                hits: d.hits_addend,
                negative: false,
            })
            .collect(),
        hits: body.hits_addend,
    };
    match service.decide(&request, op).await {
        Ok(r) => to_json(r).into_response(),
        Err(e) => error(e),
    }
}

/// The body as JSON, whatever its `Content-Type` (curl's default form type included).
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ServiceError> {
    serde_json::from_slice(body).map_err(|e| ServiceError::Invalid(e.to_string()))
}

async fn check(State(s): State<Arc<Service>>, body: Bytes) -> HttpResponse {
    match parse(&body) {
        Ok(body) => decide(&s, body, Op::Check).await,
        Err(e) => error(e),
    }
}

async fn peek(State(s): State<Arc<Service>>, body: Bytes) -> HttpResponse {
    match parse(&body) {
        Ok(body) => decide(&s, body, Op::Peek).await,
        Err(e) => error(e),
    }
}

async fn take(State(s): State<Arc<Service>>, body: Bytes) -> HttpResponse {
    match parse(&body) {
        Ok(body) => decide(&s, body, Op::Take).await,
        Err(e) => error(e),
    }
}

async fn settle(State(s): State<Arc<Service>>, body: Bytes) -> HttpResponse {
    let result = match parse::<SettleRequest>(&body) {
        Ok(body) => s.settle(body.ticket, body.actual).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => Json(serde_json::json!({ "settled": true })).into_response(),
        Err(e) => error(e),
    }
}

async fn health() -> &'static str {
    "OK"
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

/// The HTTP routes over a [`Service`].
pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/json", post(check))
        .route("/v1/check", post(check))
        .route("/v1/peek", post(peek))
        .route("/v1/take", post(take))
        .route("/v1/settle", post(settle))
        .route("/healthcheck", get(health))
        .route("/metrics", get(metrics))
        .with_state(service)
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
