//! Envoy's rate limit service, v3: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code as PbCode, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, SERVICE_NAME,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::config::Unit;
use crate::http::Bounds;
use crate::service::{Code, Descriptor, Op, Request, Response, Service, ServiceError};

/// The gRPC service over a [`Service`].
pub struct Rls(pub Arc<Service>);

impl Rls {
    /// The tonic service for it: a message larger than the service's `max_body_bytes` is
    /// refused (`OUT_OF_RANGE`, tonic's code) before it is read whole, and one past its other limits
    /// (descriptors, entries) before it is decoded ([`RlsServer`]).
    pub fn server(service: Arc<Service>) -> RlsServer {
        let max_message = service.settings().limits.max_body_bytes;
        RlsServer {
            rls: Arc::new(Rls(service)),
            max_message,
        }
    }
}

/// `ShouldRateLimit` served as envoy-types' generated `RateLimitServiceServer` serves it,
/// with one difference: each request's protobuf wire form is read first, and one whose
/// descriptors or entries are past the limits is refused then, as the service refuses it
/// decoded (`INVALID_ARGUMENT`, the same message), without being decoded. Decoded, an empty
/// descriptor or entry takes 50-odd bytes for its 2 on the wire: a message of
/// `--max-body-bytes` of them took 14 MB, on every thread at once. (The generated server's
/// codec is fixed; tonic's `Grpc` takes any.)
#[derive(Clone)]
pub struct RlsServer {
    rls: Arc<Rls>,
    max_message: usize,
}

impl tonic::server::NamedService for RlsServer {
    const NAME: &'static str = SERVICE_NAME;
}

impl<B> tonic::codegen::Service<tonic::codegen::http::Request<B>> for RlsServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::codegen::http::Request<B>) -> Self::Future {
        if request.uri().path() != "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" {
            return Box::pin(async { Ok(tonic::Status::unimplemented("").into_http()) });
        }
        let (rls, max) = (self.rls.clone(), self.max_message);
        Box::pin(async move {
            let codec = Bounded(rls.0.clone());
            let mut grpc =
                tonic::server::Grpc::new(codec).apply_max_message_size_config(Some(max), None);
            Ok(grpc.unary(Call(rls), request).await)
        })
    }
}

/// One `ShouldRateLimit` call.
struct Call(Arc<Rls>);

impl tonic::server::UnaryService<RateLimitRequest> for Call {
    type Response = RateLimitResponse;
    type Future = tonic::codegen::BoxFuture<tonic::Response<RateLimitResponse>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let rls = self.0.clone();
        Box::pin(async move { rls.should_rate_limit(request).await })
    }
}

/// prost's codec, each request's wire form read first ([`Service::admit_wire`]).
struct Bounded(Arc<Service>);

type Prost = tonic_prost::ProstCodec<RateLimitResponse, RateLimitRequest>;

impl tonic::codec::Codec for Bounded {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = tonic_prost::ProstEncoder<RateLimitResponse>;
    type Decoder = BoundedDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        Prost::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        BoundedDecoder(self.0.clone(), Prost::default().decoder())
    }
}

struct BoundedDecoder(Arc<Service>, tonic_prost::ProstDecoder<RateLimitRequest>);

impl tonic::codec::Decoder for BoundedDecoder {
    type Item = RateLimitRequest;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<RateLimitRequest>, tonic::Status> {
        use tonic_prost::prost::bytes::Buf as _;
        // The message whole, in one buffer (tonic reads it whole before decoding).
        let message = src.chunk();
        if message.len() == src.remaining() && !self.0.admit_wire(message).map_err(status_of)? {
            // As tonic answers prost's own refusal of it, without decoding what came before
            // the fault.
            return Err(tonic::Status::internal(
                "failed to decode Protobuf message: malformed",
            ));
        }
        self.1.decode(src)
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.1.buffer_settings()
    }
}

/// A service error as the gRPC port answers it.
fn status_of(e: ServiceError) -> tonic::Status {
    match e {
        ServiceError::Invalid(..) => tonic::Status::invalid_argument(e.to_string()),
        e => tonic::Status::unavailable(e.to_string()),
    }
}

/// Serves the gRPC service over `service` on `listener` within `bounds` until `shutdown`
/// completes, then lets the calls under way finish. As tonic's own `serve` does, bounded as
/// the HTTP port is: at most `bounds.max_connections` connections (one more is closed as it
/// is accepted), a connection whose HTTP/2 preface has not all come within
/// `bounds.header_timeout` is closed (tonic sets no such deadline: a client that connects and
/// never speaks held its connection forever), and one that stays silent that long is pinged
/// and closed if the ping is not answered within as long (a peer gone without a word).
/// `bounds.max_concurrent` calls at once in all, as on the HTTP port (beyond,
/// `RESOURCE_EXHAUSTED` at once, never a queue), each within `bounds.timeout`. A connection
/// `bounds.max_connection_age` old is sent GOAWAY (its client connects again), and closed
/// `bounds.max_connection_age_grace` later whatever it is doing.
pub async fn serve(
    listener: TcpListener,
    service: Arc<Service>,
    bounds: Bounds,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let open = Arc::new(tokio::sync::Semaphore::new(bounds.max_connections.max(1)));
    // Owned by the server's accept loop, and dropped (the port closed) when it stops.
    let incoming = futures_util::stream::unfold(listener, move |listener| {
        let open = open.clone();
        async move {
            loop {
                let tcp = match listener.accept().await {
                    Ok((tcp, _)) => tcp,
                    // Out of descriptors, or a connection reset before it was accepted: the
                    // listener stays; a pause keeps a lasting error from spinning.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Over the cap: closed at once (dropped), before anything is read from it.
                let Ok(slot) = open.clone().try_acquire_owned() else {
                    continue;
                };
                // As tonic's own `serve` does: a small answer is sent at once, not after
                // Nagle's delay.
                let _ = tcp.set_nodelay(true);
                let held = Held {
                    tcp,
                    _slot: slot,
                    preface: Some((PREFACE, Box::pin(tokio::time::sleep(bounds.header_timeout)))),
                    end: bounds.max_connection_age.map(|age| {
                        Box::pin(tokio::time::sleep(
                            age.saturating_add(bounds.max_connection_age_grace),
                        ))
                    }),
                };
                return Some((Ok::<_, io::Error>(held), listener));
            }
        }
    });
    // One limit for every connection's calls (tonic's own is per connection: 1,024 a
    // connection, times every connection, was no bound), shed at once, never queued.
    let overloaded = |e: tower::BoxError| -> tower::BoxError {
        if e.is::<tower::load_shed::error::Overloaded>() {
            Box::new(tonic::Status::resource_exhausted(
                "overloaded: too many requests at once",
            ))
        } else {
            e
        }
    };
    let limit = tower::ServiceBuilder::new()
        .map_err(overloaded)
        .load_shed()
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
            bounds.max_concurrent.max(1),
        ))
        .into_inner();
    let mut server = tonic::transport::Server::builder()
        // tonic sets none (hyper's own is 100): a connection's streams, without bound.
        .max_concurrent_streams(Some(bounds.grpc_max_streams))
        .timeout(bounds.timeout)
        .http2_keepalive_interval(Some(bounds.header_timeout))
        .http2_keepalive_timeout(Some(bounds.header_timeout));
    if let Some(age) = bounds.max_connection_age {
        // GOAWAY at its age, then the connection's calls finish. Not tonic's grace as well:
        // with one, tonic 0.14 sends no GOAWAY at all and drops the connection at the age
        // plus the grace, calls and all; `Held` ends it then instead, the GOAWAY long sent.
        server = server.max_connection_age(age);
    }
    server
        .layer(limit)
        .add_service(Rls::server(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// The HTTP/2 client preface's length (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`).
const PREFACE: usize = 24;

/// An accepted gRPC connection: its place under the cap, given back when it closes; until its
/// client's preface has come whole, the bytes still to come and their deadline; and the end
/// of its age and grace, from which every read and write fails (so hyper drops it).
struct Held {
    tcp: TcpStream,
    _slot: OwnedSemaphorePermit,
    preface: Option<(usize, Pin<Box<tokio::time::Sleep>>)>,
    end: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Held {
    /// Whether the connection's end has come (its timer polled, so that it wakes the
    /// connection's task when it does).
    fn ended(&mut self, cx: &mut Context<'_>) -> bool {
        self.end
            .as_mut()
            .is_some_and(|end| end.as_mut().poll(cx).is_ready())
    }
}

/// What a read or write of a connection past its end gets.
fn past_its_age<T>() -> Poll<io::Result<T>> {
    Poll::Ready(Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "past its max connection age and grace",
    )))
}

impl AsyncRead for Held {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.ended(cx) {
            return past_its_age();
        }
        let Some((left, deadline)) = &mut this.preface else {
            return Pin::new(&mut this.tcp).poll_read(cx, buf);
        };
        // Polled on every read until the preface is in: its timer wakes the connection's
        // task, whose next read fails, and the connection is closed.
        if deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.tcp).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            let n = buf.filled().len() - before;
            *left = left.saturating_sub(n);
            // In whole, or the end of the stream (hyper sees it next).
            if *left == 0 || n == 0 {
                this.preface = None;
            }
        }
        read
    }
}

impl AsyncWrite for Held {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.ended(cx) {
            return past_its_age();
        }
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.ended(cx) {
            return past_its_age();
        }
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.ended(cx) {
            return past_its_age();
        }
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl Connected for Held {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.tcp.connect_info()
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
            Err(e) => Err(status_of(e)),
        }
    }
}
