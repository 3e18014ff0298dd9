//! `hotlimit-server`: a rate limit service over hotlimit, for every proxy and every language.
//!
//! - Envoy's rate limit service API (`envoy.service.ratelimit.v3`, gRPC), so Envoy, Istio,
//!   Envoy Gateway, Kuadrant and kgateway limit through it ([`grpc`]);
//! - envoyproxy/ratelimit's YAML configuration, unchanged, with a per-rule `algorithm`
//!   extension ([`config`]);
//! - a JSON HTTP API (check, peek, take and settle), health and Prometheus metrics
//!   ([`http`]);
//! - state in memory, in Redis or Redis Cluster, or in the fleet limiter ([`engine`]).
//!
//! The guide is `docs/server.md` in the hotlimit repository.

pub mod config;
pub mod engine;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod outside;
pub mod service;
pub mod tickets;
mod wire;
