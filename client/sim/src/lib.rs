//! A deterministic discrete-event simulator of local reservations (leases) against the
//! module's own pure core. See docs/local-reservations.md for the model, the scenarios, the
//! bound and its proof.
//!
//! The simulator's virtual time is raw `i64` nanoseconds (its event arithmetic and models); the
//! core's and the client's [`redis_ratelimit_core::Nanos`] at their APIs (`lease::at`).

pub mod cli;
pub mod engine;
pub mod lease;
pub mod metrics;
pub mod model;
pub mod net;
pub mod rng;
pub mod scenarios;
pub mod server;
