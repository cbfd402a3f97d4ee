//! Async Rust client for redis-ratelimit (the `RL.*` module commands),
//! on tokio with the `redis` crate, single server and Redis Cluster.
//!
//! * [`Decision`] and friends: the limiter replies, typed (RESP2 and RESP3).
//! * [`headers`]: their HTTP headers as `http` types, in the current IETF draft's form, the
//!   older three-field form or `X-RateLimit-*` ([`Decision::headers`], [`Outcome::headers`],
//!   [`LimitStatus`] for any other decision).
//! * [`commands`]: one typed async call per command, over any `redis::aio::ConnectionLike`.
//! * Local reservations, sans IO (virtual time, no clock reads, no tokio): [`lease`] (per key),
//!   [`batch`] (adaptive batch size), [`breaker`] (circuit breaker), [`policy`] (failure
//!   policies), [`engine`] (all of them over a map of keys, with shadow mode and [`metrics`]).
//! * [`Limiter`]: the tokio driver of the engine.
//!
//! The overshoot bound and the simulation that measures it: docs/local-reservations.md.
//!
//! The crate's README (below) is compiled with it: its sample is a doc test.
#![doc = include_str!("../README.md")]

pub mod batch;
pub mod breaker;
mod clock;
pub mod commands;
pub mod connection;
pub mod decision;
pub mod engine;
pub mod headers;
pub mod lease;
pub mod limiter;
pub mod metrics;
pub mod policy;
mod sightings;
mod slab;
pub mod spec;
mod wheel;

/// A seeded xorshift64 for the unit tests' random sequences (reproducible, no dependency).
#[cfg(test)]
pub(crate) fn test_rng(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

pub use connection::{Connection, ConnectionConfig, TlsConfig};
pub use decision::{Decision, MultiDecision, ThrottleDecision};
pub use engine::{CallError, Claim, Engine, EngineConfig, Outcome, Return, Source, Step, Waiter};
pub use headers::{HeaderFormat, LimitStatus, XReset};
/// The `http` crate the headers are built with.
pub use http;
pub use lease::LeaseConfig;
pub use limiter::{check_all, AllOutcome, Limiter, LimiterConfig, LimiterConfigError};
pub use metrics::MetricsSnapshot;
pub use policy::FailurePolicy;
/// The `redis` crate this client is built on (use it to open connections).
pub use redis;
/// The one time type of every crate (the core's).
pub use redis_ratelimit_core::Nanos;
pub use spec::{Algorithm, Limit, LimitError};
