//! Envoy's rate limit service, v3: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code as PbCode, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;

use crate::config::Unit;
use crate::service::{Code, Descriptor, Op, Request, Response, Service, ServiceError};

/// The gRPC service over a [`Service`].
pub struct Rls(pub Arc<Service>);

impl Rls {
    /// The tonic server for it: a message larger than the service's `max_body_bytes` is
    /// refused (`RESOURCE_EXHAUSTED`) before it is decoded.
    pub fn server(service: Arc<Service>) -> RateLimitServiceServer<Rls> {
        let max = service.settings().limits.max_body_bytes;
        RateLimitServiceServer::new(Rls(service)).max_decoding_message_size(max)
    }
}

/// A request off the wire. A descriptor's own `hits_addend` overrides the request's (0:
/// check without counting); a descriptor with `is_negative_hits` is answered OK and counts
/// nothing (refunds go through the JSON API's take and settle). A per-descriptor `limit`
/// override is ignored: the configured rules decide.
pub fn request_from_pb(r: RateLimitRequest) -> Request {
    Request {
        domain: r.domain,
        descriptors: r
            .descriptors
            .into_iter()
            .map(|d| Descriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                hits: d.hits_addend.map(|h| h.value),
                negative: d.is_negative_hits,
            })
            .collect(),
        hits: r.hits_addend,
    }
}

fn unit(u: Unit) -> PbUnit {
    match u {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn code(c: Code) -> i32 {
    match c {
        Code::Ok => PbCode::Ok as i32,
        Code::OverLimit => PbCode::OverLimit as i32,
    }
}

/// A response onto the wire.
pub fn response_to_pb(r: Response) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(r.overall_code),
        statuses: r
            .statuses
            .into_iter()
            .map(|s| DescriptorStatus {
                code: code(s.code),
                current_limit: s.current_limit.map(|l| PbRateLimit {
                    name: l.name,
                    requests_per_unit: l.requests_per_unit,
                    unit: unit(l.unit) as i32,
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s.duration_until_reset.map(|d| PbDuration {
                    seconds: d.as_secs() as i64,
                    nanos: d.subsec_nanos() as i32,
                }),
                ..Default::default()
            })
            .collect(),
        response_headers_to_add: r
            .headers
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key,
                value,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let request = request_from_pb(request.into_inner());
        match self.0.decide(&request, Op::Check).await {
            Ok(response) => Ok(tonic::Response::new(response_to_pb(response))),
            Err(e @ ServiceError::Invalid(..)) => {
                Err(tonic::Status::invalid_argument(e.to_string()))
            }
            Err(e) => Err(tonic::Status::unavailable(e.to_string())),
        }
    }
}
