//! A deterministic discrete-event simulator of local reservations (leases) against the
//! module's own pure core. See docs/local-reservations.md for the model, the scenarios, the
//! bound and its proof.

pub mod cli;
pub mod engine;
pub mod lease;
pub mod metrics;
pub mod model;
pub mod net;
pub mod rng;
pub mod scenarios;
pub mod server;

pub use redis_ratelimit_core::Nanos;
