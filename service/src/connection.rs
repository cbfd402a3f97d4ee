//! The service's Redis connections (moved out of backend.rs unchanged, issue 35): where Redis
//! is ([`Target`]), a pool of lazily (re)connected connections to one server or a cluster
//! connection ([`Conns`]), a connection for one call ([`Conn`]), and how a redis-rs error is
//! told apart ([`BackendError`], [`classify`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Cmd, ErrorKind, ServerErrorKind, Value};
use tokio::sync::Mutex;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendError {
    /// No answer: connection refused or lost, timeout, breaker open.
    Unavailable(String),
    /// Redis answered an error (OOM at maxmemory, a script error, an ACL refusal).
    Reply(String),
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Unavailable(m) => write!(f, "redis unavailable: {m}"),
            BackendError::Reply(m) => write!(f, "redis error: {m}"),
        }
    }
}

pub(crate) fn classify(e: redis::RedisError) -> BackendError {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        BackendError::Unavailable(e.to_string())
    } else {
        match e.kind() {
            ErrorKind::Server(
                ServerErrorKind::ClusterDown | ServerErrorKind::MasterDown | ServerErrorKind::TryAgain,
            ) => BackendError::Unavailable(e.to_string()),
            ErrorKind::Server(ServerErrorKind::NoScript) => BackendError::Reply(format!("NOSCRIPT {e}")),
            _ => BackendError::Reply(e.to_string()),
        }
    }
}

/// Where Redis is.
#[derive(Clone, Debug)]
pub enum Target {
    /// One server (a redis:// or unix:// URL).
    Single(String),
    /// Redis Cluster seed nodes (redis:// URLs).
    Cluster(Vec<String>),
}

/// A lazily (re)connected ConnectionManager: Redis may be down when the service starts.
pub(crate) struct Lazy {
    client: redis::Client,
    conn: Mutex<Option<ConnectionManager>>,
    timeout: Duration,
}

impl Lazy {
    async fn get(&self) -> Result<ConnectionManager, BackendError> {
        let mut g = self.conn.lock().await;
        if let Some(c) = g.as_ref() {
            return Ok(c.clone());
        }
        // Reconnect backoff of 20 ms, then 40 ms (each jittered up to twice that), at most
        // 200 ms: redis-rs's default waits seconds, long after Redis is back. (redis 0.27's
        // first delay ignored these settings: 1–2 s.)
        let cfg = ConnectionManagerConfig::new()
            .set_min_delay(Duration::from_millis(20))
            .set_exponent_base(2.0)
            .set_max_delay(Duration::from_millis(200))
            .set_number_of_retries(2)
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let fut = ConnectionManager::new_with_config(self.client.clone(), cfg);
        match tokio::time::timeout(self.timeout.saturating_mul(4), fut).await {
            Ok(Ok(c)) => {
                *g = Some(c.clone());
                Ok(c)
            }
            Ok(Err(e)) => Err(BackendError::Unavailable(e.to_string())),
            Err(_) => Err(BackendError::Unavailable("connect timed out".into())),
        }
    }
}

pub(crate) enum Conns {
    Single { pool: Vec<Lazy>, next: AtomicUsize },
    // Boxed: redis 1.x's ClusterClient holds its whole configuration (over 500 bytes).
    Cluster { client: Box<redis::cluster::ClusterClient>, conn: Mutex<Option<ClusterConnection>>, timeout: Duration },
}

/// A connection for one call: routed to a slot's primary on a cluster.
// Short-lived (one per call): its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(crate) async fn query(&mut self, cmd: &Cmd, slot: Option<Slot>) -> redis::RedisResult<Value> {
        match (self, slot) {
            (Conn::Single(c), _) => c.req_packed_command(cmd).await,
            (Conn::Cluster(c), Some(s)) => {
                // redis 1.x takes the command by value (0.27 cloned it inside).
                c.route_command(
                    cmd.clone(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_slot(s, SlotAddr::Master))),
                )
                .await
            }
            (Conn::Cluster(c), None) => c.req_packed_command(cmd).await,
        }
    }
}

impl Conns {
    pub(crate) fn new(target: &Target, pool_size: usize, timeout: Duration) -> Result<Conns, String> {
        Ok(match target {
            Target::Single(url) => {
                let client =
                    redis::Client::open(url.as_str()).map_err(|e| format!("invalid Redis URL '{url}': {e}"))?;
                let pool = (0..pool_size.max(1))
                    .map(|_| Lazy { client: client.clone(), conn: Mutex::new(None), timeout })
                    .collect();
                Conns::Single { pool, next: AtomicUsize::new(0) }
            }
            Target::Cluster(nodes) => {
                let client = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(2)
                    .min_retry_wait(5)
                    .max_retry_wait(100)
                    .build()
                    .map_err(|e| format!("invalid Redis Cluster nodes {nodes:?}: {e}"))?;
                Conns::Cluster { client: Box::new(client), conn: Mutex::new(None), timeout }
            }
        })
    }

    pub(crate) async fn get(&self) -> Result<Conn, BackendError> {
        match self {
            Conns::Single { pool, next } => {
                let i = next.fetch_add(1, Ordering::Relaxed) % pool.len();
                pool[i].get().await.map(Conn::Single)
            }
            Conns::Cluster { client, conn, timeout } => {
                let mut g = conn.lock().await;
                if let Some(c) = g.as_ref() {
                    return Ok(Conn::Cluster(c.clone()));
                }
                match tokio::time::timeout(timeout.saturating_mul(4), client.get_async_connection()).await {
                    Ok(Ok(c)) => {
                        *g = Some(c.clone());
                        Ok(Conn::Cluster(c))
                    }
                    Ok(Err(e)) => Err(BackendError::Unavailable(e.to_string())),
                    Err(_) => Err(BackendError::Unavailable("cluster connect timed out".into())),
                }
            }
        }
    }
}
