//! The service's Redis connections: the client crate's connection layer
//! ([`redis_ratelimit_client::connection`]: deadline-bound calls, background reconnection,
//! Sentinel, TLS, the cluster), shared by the backend's per-request commands and the leases'
//! limiters, and its errors told apart by kind ([`BackendError`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::cluster_routing::Slot;
use redis::{Cmd, Pipeline, ServerErrorKind, Value};
use redis_ratelimit_client::connection::{Connection, ConnectionConfig, Error};
use tokio::time::Instant;

/// Where Redis is and how to reach it (from the settings).
pub type Target = ConnectionConfig;

/// Why Redis gave no verdict, by kind (never by the message's text): what the service does
/// next depends on it (docs/service.md, Failures).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendError {
    /// Redis could not answer in time or at all: connection refused or lost, the deadline,
    /// TLS refused, the breaker open, or Redis saying it cannot serve now (`LOADING`,
    /// `CLUSTERDOWN`, `MASTERDOWN`, `TRYAGAIN`). The breaker counts it.
    Unavailable(String),
    /// Redis answered an error about its own state (`OOM` at maxmemory, `NOPERM`, `READONLY`,
    /// `BUSY`, a script aborted): there, answering, and refusing.
    Reply(String),
    /// The script is not in Redis's cache (`NOSCRIPT`): send it whole.
    NoScript,
    /// Redis found our request invalid (`ERR`: wrong arguments, or a command it does not know:
    /// the module missing), or answered what the command never answers: a bug of the service
    /// unless the module is missing (the backend tells which, logs and counts it).
    Invalid(String),
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Unavailable(m) => write!(f, "redis unavailable: {m}"),
            BackendError::Reply(m) => write!(f, "redis error: {m}"),
            BackendError::NoScript => write!(f, "redis error: NOSCRIPT"),
            BackendError::Invalid(m) => write!(f, "invalid request to redis: {m}"),
        }
    }
}

impl From<redis::ParsingError> for BackendError {
    /// A reply that is not what the command answers (the service's or the module's bug).
    fn from(e: redis::ParsingError) -> BackendError {
        BackendError::Invalid(format!("unexpected reply: {e}"))
    }
}

/// The connection layer's error, by kind (the layer's [`Error::kind`], then redis-rs's
/// [`redis::ErrorKind`] of Redis's own answer).
pub(crate) fn classify(e: Error) -> BackendError {
    use redis::ErrorKind as K;
    if e.is_unavailable() {
        return BackendError::Unavailable(e.to_string());
    }
    match e.redis_error().map(redis::RedisError::kind) {
        Some(K::Server(ServerErrorKind::NoScript)) => BackendError::NoScript,
        // `ERR` (the generic code: arguments refused, unknown command), a command sent across
        // slots, a reply redis-rs could not read, or a misuse of the client: our request.
        Some(
            K::Server(ServerErrorKind::ResponseError | ServerErrorKind::CrossSlot)
            | K::Parse
            | K::UnexpectedReturnType
            | K::Client,
        ) => BackendError::Invalid(e.to_string()),
        _ => BackendError::Reply(e.to_string()),
    }
}

/// The connections of the service (one layer: a pool to a single server or to Sentinel's
/// primary, or the cluster).
pub(crate) struct Conns {
    conn: Connection,
    /// [`Connection::connections_made`] when the breaker last opened.
    made_at_open: AtomicU64,
}

impl Conns {
    /// Starts connecting in the background (it never waits for Redis): `pool_size`
    /// connections to a single server or the primary, each attempt bounded by the target's
    /// connect timeout (`REDIS_CONNECT_TIMEOUT`); calls are bounded by their deadline.
    pub(crate) fn new(target: &Target, pool_size: usize, _call_timeout: Duration) -> Result<Conns, String> {
        let conn = target.clone().pool_size(pool_size).connect().map_err(|e| e.to_string())?;
        Ok(Conns { conn, made_at_open: AtomicU64::new(0) })
    }

    /// The breaker opened: [`Conns::reconnected_since_breaker_opened`] counts from now.
    pub(crate) fn breaker_opened(&self) {
        self.made_at_open.store(self.conn.connections_made(), Ordering::Relaxed);
    }

    /// A connection was made since the breaker opened: Redis answered its handshake, so a call
    /// may try it before the breaker's cool-down is over (Redis is back within moments of a
    /// restart, not a cool-down later).
    pub(crate) fn reconnected_since_breaker_opened(&self) -> bool {
        self.conn.connections_made() > self.made_at_open.load(Ordering::Relaxed)
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.conn
    }

    /// One command (to a cluster slot's primary), answered by `deadline`.
    pub(crate) async fn call(&self, cmd: &Cmd, slot: Option<Slot>, deadline: Instant) -> Result<Value, BackendError> {
        self.conn.call_routed(cmd, slot, deadline).await.map_err(classify)
    }

    /// A pipeline, answered by `deadline`.
    pub(crate) async fn pipeline(&self, pipe: &Pipeline, deadline: Instant) -> Result<Vec<Value>, BackendError> {
        self.conn.pipeline(pipe, deadline).await.map_err(classify)
    }
}
