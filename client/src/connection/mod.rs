//! The connection layer: one way to reach Redis (a single server, a Redis Cluster, or the
//! primary that Redis Sentinel names; plain TCP, TLS or a unix socket) for a
//! [`crate::Limiter`] and for the rate limit service alike.
//!
//! ```text
//! ConnectionConfig ──connect()──► Connection (cheap clone)
//!                                   │ call(cmd, deadline) / ConnectionLike
//!                                   ▼
//!                 pool: N slots, each a multiplexed connection ──► a background task per slot:
//!                                                                  connect, watch, reconnect
//!                 sentinel: a query task + a +switch-master subscriber per sentinel
//! ```
//!
//! The rules (issue 31.4–6, 35.1, 35.6):
//! * **Deadlines.** [`Connection::call`] takes the caller's deadline and ends by it, whatever
//!   Redis does: a call never connects and never waits behind another call's connection
//!   attempt. It takes a live connection of the pool; when none is live it waits for one until
//!   its deadline while an attempt is under way, and fails at once when the latest attempt
//!   failed (a refused connection, a certificate problem, a connect timeout: known, so
//!   waiting would only spend the caller's time). The [`redis::aio::ConnectionLike`]
//!   implementation (what the [`crate::Limiter`] uses) is cancel-safe: the limiter's timeout
//!   drops it, and it waits for a live connection at most `connect_timeout` on its own.
//! * **Background reconnection.** Each slot's task owns its connection and runs its driver:
//!   when Redis closes the connection (or it breaks) the task knows at once, without a call
//!   failing first, and connects again: at once, then after a jittered backoff from 10 ms
//!   doubling to at most 200 ms while attempts fail. Nothing is ever sent twice: a call that
//!   was sent on a connection that broke fails; it is not retried.
//! * **Lazy start.** [`ConnectionConfig::connect`] never waits for Redis: a service starts
//!   while Redis is away, answers with its failure policy, and serves from Redis as soon as a
//!   connection is up. [`Connection::ready`] waits for the first connection when a caller
//!   wants to.
//! * **Sentinel.** The primary's address comes from the sentinels (`SENTINEL
//!   get-master-addr-by-name`, asked again whenever a connection breaks or an attempt fails,
//!   and every second), and from `+switch-master`, which every sentinel publishes and a task
//!   per sentinel subscribes to. A new address drops every connection to the old one at once
//!   (a demoted primary that was stopped and resumes still says `role:master` for seconds and
//!   runs what is in its socket: nothing more is written to it), and a connection is used only
//!   after `ROLE` says `master`.
//! * **TLS** ([`TlsConfig`]): rustls, with the system's roots plus an optional private CA,
//!   client certificates (mTLS), and "verify the chain but not the host name". A certificate
//!   problem is an error of its own kind ([`ErrorKind::Tls`]) naming what was wrong.
//! * **Cluster**: redis-rs's cluster client (it follows the slots and reconnects itself),
//!   connected in the background like the rest.

mod sentinel;
mod tls;

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, IntoConnectionInfo, Pipeline, RedisConnectionInfo, RedisError,
    RedisFuture, ServerErrorKind, Value,
};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

pub use tls::TlsConfig;

/// What went wrong, by kind: the callers decide on the kind, never on the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// No live connection (refused, closed, being made and not made in time), or Redis said it
    /// cannot serve now (`LOADING`, `CLUSTERDOWN`, `MASTERDOWN`, `TRYAGAIN`).
    Unavailable,
    /// The caller's deadline (or the connect timeout) passed before an answer.
    Timeout,
    /// The TLS handshake failed: the server's certificate was refused (its CA, its name, its
    /// dates) or the server refused ours. Redis is unreachable as configured.
    Tls,
    /// Redis answered with an error (a script error, OOM at maxmemory, an ACL refusal, a
    /// wrong argument): it is there and answering.
    Reply,
}

/// A call's or a connection attempt's error.
#[derive(Clone, Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    /// Redis's own error, for [`ErrorKind::Reply`] (and the server-side outages).
    redis: Option<RedisError>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into(), redis: None }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Redis could not answer (any kind but [`ErrorKind::Reply`]): the failure policy applies.
    pub fn is_unavailable(&self) -> bool {
        self.kind != ErrorKind::Reply
    }

    /// The server's error kind, when Redis answered an error.
    pub fn server_kind(&self) -> Option<ServerErrorKind> {
        match self.redis.as_ref().map(RedisError::kind) {
            Some(redis::ErrorKind::Server(k)) => Some(k),
            _ => None,
        }
    }

    /// Redis's own error, when there is one.
    pub fn redis_error(&self) -> Option<&RedisError> {
        self.redis.as_ref()
    }

    fn timeout(what: &str) -> Error {
        Error::new(ErrorKind::Timeout, what)
    }

    /// The error as redis-rs's, for [`ConnectionLike`]: replies unchanged, the rest as IO
    /// errors (what the limiter counts as outages).
    fn into_redis(self) -> RedisError {
        match (self.kind, self.redis) {
            (_, Some(e)) => e,
            (ErrorKind::Timeout, None) => {
                RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, self.message))
            }
            (_, None) => RedisError::from(std::io::Error::new(std::io::ErrorKind::NotConnected, self.message)),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ErrorKind::Reply => write!(f, "{}", self.message),
            ErrorKind::Tls => write!(f, "TLS: {}", self.message),
            ErrorKind::Timeout | ErrorKind::Unavailable => write!(f, "{}", self.message),
        }
    }
}

impl std::error::Error for Error {}

/// redis-rs's error, by kind.
pub(crate) fn classify(e: RedisError) -> Error {
    use redis::ErrorKind as K;
    let kind = match e.kind() {
        K::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::TryAgain,
        ) => ErrorKind::Unavailable,
        K::Server(_) | K::Extension | K::Parse | K::Client | K::InvalidClientConfig => ErrorKind::Reply,
        _ if e.is_timeout() => ErrorKind::Timeout,
        _ => match tls::describe(&e) {
            Some(m) => return Error::new(ErrorKind::Tls, m),
            None => ErrorKind::Unavailable,
        },
    };
    let message = e.to_string();
    Error { kind, message, redis: Some(e) }
}

/// A configuration error (at start: a bad URL, an unreadable certificate file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// A server's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Addr {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Addr::Tcp { host, port } => write!(f, "{host}:{port}"),
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// A URL (`redis://`, `rediss://`, `unix://`) or a bare `host:port` as an address, whether it
/// asks for TLS, and its connection settings (user, password, database).
fn parse_url(url: &str) -> Result<(Addr, bool, RedisConnectionInfo), ConfigError> {
    let full = if url.contains("://") { url.to_string() } else { format!("redis://{url}") };
    let info =
        full.as_str().into_connection_info().map_err(|e| ConfigError(format!("invalid Redis URL '{url}': {e}")))?;
    let (addr, tls) = match info.addr() {
        ConnectionAddr::Tcp(host, port) => (Addr::Tcp { host: host.clone(), port: *port }, false),
        ConnectionAddr::TcpTls { host, port, insecure, .. } => {
            if *insecure {
                return Err(ConfigError(format!(
                    "Redis URL '{url}': '#insecure' turns off certificate verification; use TLS settings \
                     (skip_hostname_verification verifies the chain but not the name)"
                )));
            }
            (Addr::Tcp { host: host.clone(), port: *port }, true)
        }
        ConnectionAddr::Unix(p) => (Addr::Unix(p.clone()), false),
        _ => return Err(ConfigError(format!("invalid Redis URL '{url}': unsupported address"))),
    };
    Ok((addr, tls, info.redis_settings().clone()))
}

/// Where Redis is.
#[derive(Clone, Debug)]
enum Target {
    Single(String),
    Cluster(Vec<String>),
    Sentinel { master: String, sentinels: Vec<String> },
}

/// How to reach Redis: [`ConnectionConfig::single`], [`ConnectionConfig::cluster`] or
/// [`ConnectionConfig::sentinel`], then the optional settings, then
/// [`ConnectionConfig::connect`] (in a tokio runtime). Its `Display` (and `Debug`) shows no
/// password.
#[derive(Clone)]
pub struct ConnectionConfig {
    target: Target,
    tls: Option<TlsConfig>,
    pool_size: usize,
    connect_timeout: Duration,
    auth: Option<(Option<String>, String)>,
    sentinel_auth: Option<(Option<String>, String)>,
}

impl ConnectionConfig {
    fn new(target: Target) -> ConnectionConfig {
        ConnectionConfig {
            target,
            tls: None,
            pool_size: 1,
            connect_timeout: Duration::from_millis(250),
            auth: None,
            sentinel_auth: None,
        }
    }

    /// One server: `redis://[user:password@]host:port[/db]`, `rediss://…` (TLS, with
    /// [`ConnectionConfig::tls`]'s settings or the system's roots), `unix:///path`, or
    /// `host:port`.
    pub fn single(url: &str) -> ConnectionConfig {
        ConnectionConfig::new(Target::Single(url.to_string()))
    }

    /// A Redis Cluster, from seed nodes (URLs or `host:port`).
    pub fn cluster<S: AsRef<str>>(nodes: &[S]) -> ConnectionConfig {
        ConnectionConfig::new(Target::Cluster(nodes.iter().map(|s| s.as_ref().to_string()).collect()))
    }

    /// The primary that Redis Sentinel names `master`, from sentinels (`host:port`, or URLs:
    /// `rediss://` dials them with TLS).
    pub fn sentinel<S: AsRef<str>>(master: &str, sentinels: &[S]) -> ConnectionConfig {
        ConnectionConfig::new(Target::Sentinel {
            master: master.to_string(),
            sentinels: sentinels.iter().map(|s| s.as_ref().to_string()).collect(),
        })
    }

    /// envoyproxy/ratelimit's form: `REDIS_TYPE` (`single`, `cluster`, `sentinel`) and
    /// `REDIS_URL` (one address; comma-separated nodes; `<master name>,<sentinel>,...`).
    pub fn from_type_and_url(kind: &str, url: &str) -> Result<ConnectionConfig, ConfigError> {
        let parts: Vec<&str> = url.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        match kind.to_ascii_lowercase().as_str() {
            "single" => Ok(ConnectionConfig::single(url.trim())),
            "cluster" if !parts.is_empty() => Ok(ConnectionConfig::cluster(&parts)),
            "sentinel" if parts.len() >= 2 => Ok(ConnectionConfig::sentinel(parts[0], &parts[1..])),
            "sentinel" => Err(ConfigError(format!(
                "REDIS_URL '{url}': expected the master name and the sentinels: <master name>,<host:port>,..."
            ))),
            "cluster" => Err(ConfigError("REDIS_URL: no cluster nodes".into())),
            other => Err(ConfigError(format!("invalid REDIS_TYPE '{other}': expected single, cluster or sentinel"))),
        }
    }

    /// TLS for every connection (the sentinels' too), whatever the URLs' schemes.
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Connections to a single server or to the primary (each multiplexed). Default 1.
    pub fn pool_size(mut self, n: usize) -> Self {
        self.pool_size = n.max(1);
        self
    }

    /// Bounds each connection attempt (TCP, TLS, the handshake and, for Sentinel, `ROLE`).
    /// Default 250 ms. It bounds no call: calls end by their own deadline.
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// The data nodes' credentials (also taken from the URL's `user:password@`).
    pub fn auth(mut self, user: Option<&str>, password: &str) -> Self {
        self.auth = Some((user.map(str::to_string), password.to_string()));
        self
    }

    /// The sentinels' own credentials (envoyproxy/ratelimit's `REDIS_SENTINEL_AUTH`).
    pub fn sentinel_auth(mut self, user: Option<&str>, password: &str) -> Self {
        self.sentinel_auth = Some((user.map(str::to_string), password.to_string()));
        self
    }

    pub fn connect_timeout_length(&self) -> Duration {
        self.connect_timeout
    }

    /// Starts connecting in the background and returns at once (it never waits for Redis).
    /// Errors are configuration errors only: a URL that does not parse, a certificate or key
    /// file that cannot be read or parsed, no tokio runtime.
    pub fn connect(self) -> Result<Connection, ConfigError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| ConfigError("Connection: connect() needs a tokio runtime".into()))?;
        let with_auth = |mut info: RedisConnectionInfo, auth: &Option<(Option<String>, String)>| {
            if let Some((user, pass)) = auth {
                if let Some(u) = user {
                    info = info.set_username(u);
                }
                info = info.set_password(pass);
            }
            info
        };
        let tls_for = |wants: bool| -> Result<Option<Arc<tls::Connector>>, ConfigError> {
            match (&self.tls, wants) {
                (Some(t), _) => Ok(Some(Arc::new(t.build()?))),
                (None, true) => Ok(Some(Arc::new(TlsConfig::default().build()?))),
                (None, false) => Ok(None),
            }
        };
        let (closed_tx, closed_rx) = watch::channel(false);
        let (state_tx, _) = watch::channel(State::default());
        let state = Arc::new(state_tx);
        let core = match &self.target {
            Target::Single(url) => {
                let (addr, wants_tls, info) = parse_url(url)?;
                let tls = tls_for(wants_tls)?;
                let (master_tx, master_rx) = watch::channel(Some(addr));
                Kind::Node(Arc::new(Node {
                    info: with_auth(info, &self.auth),
                    tls,
                    master: master_rx,
                    _fixed: Some(master_tx),
                    sentinel: None,
                }))
            }
            Target::Sentinel { master, sentinels } => {
                let mut addrs = Vec::new();
                let mut wants_tls = false;
                let mut sentinel_info = RedisConnectionInfo::default();
                for s in sentinels {
                    let (a, t, info) = parse_url(s)?;
                    wants_tls |= t;
                    sentinel_info = info;
                    addrs.push(a);
                }
                let tls = tls_for(wants_tls)?;
                let (master_tx, master_rx) = watch::channel(None);
                let tracker = Arc::new(sentinel::Tracker::new(
                    master.clone(),
                    addrs,
                    with_auth(sentinel_info.set_db(0), &self.sentinel_auth),
                    tls.clone(),
                    self.connect_timeout,
                    master_tx,
                ));
                tracker.clone().spawn(&runtime, closed_rx.clone());
                Kind::Node(Arc::new(Node {
                    info: with_auth(RedisConnectionInfo::default(), &self.auth),
                    tls,
                    master: master_rx,
                    _fixed: None,
                    sentinel: Some(tracker),
                }))
            }
            Target::Cluster(nodes) => {
                let mut urls = Vec::new();
                let mut wants_tls = self.tls.is_some();
                for n in nodes {
                    let (_, t, _) = parse_url(n)?;
                    wants_tls |= t;
                    urls.push(if n.contains("://") { n.clone() } else { format!("redis://{n}") });
                }
                let client =
                    tls::cluster_client(&urls, wants_tls, self.tls.as_ref(), &self.auth, self.connect_timeout)?;
                Kind::Cluster(Arc::new(client))
            }
        };
        let slots = match core {
            Kind::Node(_) => self.pool_size,
            Kind::Cluster(_) => 1,
        };
        state.send_modify(|s| s.slots = vec![SlotState::Connecting; slots]);
        for i in 0..slots {
            let task = SlotTask {
                index: i,
                kind: core.clone(),
                state: state.clone(),
                closed: closed_rx.clone(),
                connect_timeout: self.connect_timeout,
            };
            runtime.spawn(task.run());
        }
        Ok(Connection {
            inner: Arc::new(Inner {
                kind: core,
                state,
                next: AtomicUsize::new(0),
                connect_timeout: self.connect_timeout,
                _closed: closed_tx,
            }),
        })
    }
}

/// A URL without its password, for logs.
fn mask(u: &str) -> String {
    match (u.find("://"), u.rfind('@')) {
        (Some(s), Some(a)) if a > s => format!("{}*****{}", &u[..s + 3], &u[a..]),
        _ => u.to_string(),
    }
}

impl fmt::Display for ConnectionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &[String]| v.iter().map(|u| mask(u)).collect::<Vec<_>>().join(",");
        match &self.target {
            Target::Single(u) => write!(f, "single server {}", mask(u))?,
            Target::Cluster(n) => write!(f, "cluster, seeds {}", list(n))?,
            Target::Sentinel { master, sentinels } => {
                write!(f, "sentinel master '{master}', sentinels {}", list(sentinels))?
            }
        }
        if let Some(t) = &self.tls {
            write!(f, ", TLS ({t:?})")?;
        }
        write!(f, ", pool {}, connect timeout {:?}", self.pool_size, self.connect_timeout)
    }
}

impl fmt::Debug for ConnectionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConnectionConfig({self})")
    }
}

/// A data node (single server or Sentinel's primary) and how to reach it.
struct Node {
    info: RedisConnectionInfo,
    tls: Option<Arc<tls::Connector>>,
    /// The address to connect to (fixed for a single server; the sentinels' primary).
    master: watch::Receiver<Option<Addr>>,
    /// Keeps a fixed address's channel open.
    _fixed: Option<watch::Sender<Option<Addr>>>,
    sentinel: Option<Arc<sentinel::Tracker>>,
}

#[derive(Clone)]
enum Kind {
    Node(Arc<Node>),
    Cluster(Arc<redis::cluster::ClusterClient>),
}

/// A live connection.
#[derive(Clone)]
enum Link {
    Node { conn: MultiplexedConnection, addr: Arc<str> },
    Cluster(ClusterConnection),
}

/// One pool slot's state, as calls see it.
#[derive(Clone, Default)]
enum SlotState {
    /// An attempt is under way and none failed since the last live connection: calls wait
    /// (until their deadline).
    #[default]
    Connecting,
    Live(Link),
    /// The latest attempt failed: calls fail at once with its error.
    Failed(Error),
}

#[derive(Clone, Default)]
struct State {
    slots: Vec<SlotState>,
    /// Connections made live so far.
    made: u64,
}

struct Inner {
    kind: Kind,
    state: Arc<watch::Sender<State>>,
    next: AtomicUsize,
    connect_timeout: Duration,
    /// Dropped with the last handle: the background tasks stop.
    _closed: watch::Sender<bool>,
}

/// The connection layer's handle (see the module docs). Cheap to clone: clones share the pool
/// and its tasks, which stop when the last clone is dropped.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

/// What the layer is doing, for health checks: [`Connection::status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub state: StatusState,
    /// The server connected to or being connected to (the primary, with Sentinel).
    pub address: Option<String>,
    /// The latest error, or Sentinel's latest event.
    pub detail: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusState {
    /// At least one live connection.
    Connected,
    /// No live connection; one is being made (at start, after a connection broke, after a
    /// failover).
    Connecting,
    /// No live connection, and the latest attempt failed.
    Unavailable,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.state {
            StatusState::Connected => "connected to",
            StatusState::Connecting => "connecting to",
            StatusState::Unavailable => "unavailable:",
        };
        write!(f, "{what} {}", self.address.as_deref().unwrap_or("no address known"))?;
        if let Some(d) = &self.detail {
            write!(f, " ({d})")?;
        }
        Ok(())
    }
}

impl Connection {
    /// Sends one command to Redis (on a cluster, to the node of its key) and waits for its
    /// answer until `deadline` (see the module docs). An error reply is
    /// `Err(`[`ErrorKind::Reply`]`)`.
    pub async fn call(&self, cmd: &Cmd, deadline: Instant) -> Result<Value, Error> {
        self.call_routed(cmd, None, deadline).await
    }

    /// [`Connection::call`] to the primary of a cluster slot (`slot` is ignored off a cluster).
    pub async fn call_routed(&self, cmd: &Cmd, slot: Option<Slot>, deadline: Instant) -> Result<Value, Error> {
        let link = self.link(deadline).await?;
        let answer = async {
            match (link, slot) {
                (Link::Node { mut conn, .. }, _) => conn.req_packed_command(cmd).await,
                (Link::Cluster(mut c), Some(s)) => {
                    let route = SingleNodeRoutingInfo::SpecificNode(Route::with_slot(s, SlotAddr::Master));
                    c.route_command(cmd.clone(), RoutingInfo::SingleNode(route)).await
                }
                (Link::Cluster(mut c), None) => c.req_packed_command(cmd).await,
            }
        };
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(v)) => v.extract_error().map_err(classify),
            Ok(Err(e)) => Err(classify(e)),
            Err(_) => Err(Error::timeout("no answer from Redis before the deadline")),
        }
    }

    /// A pipeline (on a cluster, its commands' keys must share a slot), until `deadline`.
    pub async fn pipeline(&self, pipe: &Pipeline, deadline: Instant) -> Result<Vec<Value>, Error> {
        let link = self.link(deadline).await?;
        let answer = async {
            match link {
                Link::Node { mut conn, .. } => pipe.query_async::<Vec<Value>>(&mut conn).await,
                Link::Cluster(mut c) => pipe.query_async::<Vec<Value>>(&mut c).await,
            }
        };
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(r) => r.map_err(classify),
            Err(_) => Err(Error::timeout("no answer from Redis before the deadline")),
        }
    }

    /// Waits until a connection is live, or the latest attempt failed (its error), or
    /// `deadline`.
    pub async fn ready(&self, deadline: Instant) -> Result<(), Error> {
        self.link(deadline).await.map(|_| ())
    }

    /// How many connections were made so far: it grows when one is made after a break (a
    /// circuit breaker that opened before can try Redis again at once).
    pub fn connections_made(&self) -> u64 {
        self.inner.state.borrow().made
    }

    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.kind, Kind::Cluster(_))
    }

    /// What the layer is doing (for `/healthcheck`).
    pub fn status(&self) -> Status {
        let state = self.inner.state.borrow();
        let live = state.slots.iter().find_map(|s| match s {
            SlotState::Live(Link::Node { addr, .. }) => Some(Some(addr.to_string())),
            SlotState::Live(Link::Cluster(_)) => Some(None),
            _ => None,
        });
        let failed = state.slots.iter().find_map(|s| match s {
            SlotState::Failed(e) => Some(e.to_string()),
            _ => None,
        });
        let all_failed = state.slots.iter().all(|s| matches!(s, SlotState::Failed(_)));
        drop(state);
        let (sentinel_note, wanted) = match &self.inner.kind {
            Kind::Node(n) => {
                (n.sentinel.as_ref().and_then(|t| t.note()), n.master.borrow().as_ref().map(Addr::to_string))
            }
            Kind::Cluster(_) => (None, Some("the cluster".to_string())),
        };
        match live {
            Some(addr) => Status { state: StatusState::Connected, address: addr.or(wanted), detail: sentinel_note },
            None if all_failed => {
                Status { state: StatusState::Unavailable, address: wanted, detail: failed.or(sentinel_note) }
            }
            None => Status { state: StatusState::Connecting, address: wanted, detail: sentinel_note.or(failed) },
        }
    }

    /// A live connection: round robin over the live slots; when none is live, wait (until
    /// `deadline`) while an attempt is under way, or fail with the latest attempt's error.
    async fn link(&self, deadline: Instant) -> Result<Link, Error> {
        let mut rx = self.inner.state.subscribe();
        loop {
            {
                let state = rx.borrow_and_update();
                let n = state.slots.len();
                let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
                let mut waiting = false;
                let mut failure = None;
                for k in 0..n {
                    match &state.slots[(start + k) % n] {
                        SlotState::Live(l) => return Ok(l.clone()),
                        SlotState::Connecting => waiting = true,
                        SlotState::Failed(e) => failure = Some(e),
                    }
                }
                if !waiting {
                    return Err(failure
                        .cloned()
                        .unwrap_or_else(|| Error::new(ErrorKind::Unavailable, "no connection to Redis")));
                }
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(Error::new(ErrorKind::Unavailable, "connection closed")),
                Err(_) => return Err(Error::timeout("no connection to Redis before the deadline (connecting)")),
            }
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let link = self.link(Instant::now() + self.inner.connect_timeout).await.map_err(Error::into_redis)?;
            match link {
                Link::Node { mut conn, .. } => conn.req_packed_command(cmd).await,
                Link::Cluster(mut c) => c.req_packed_command(cmd).await,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let link = self.link(Instant::now() + self.inner.connect_timeout).await.map_err(Error::into_redis)?;
            match link {
                Link::Node { mut conn, .. } => conn.req_packed_commands(cmd, offset, count).await,
                Link::Cluster(mut c) => c.req_packed_commands(cmd, offset, count).await,
            }
        })
    }

    fn get_db(&self) -> i64 {
        match &self.inner.kind {
            Kind::Node(n) => n.info.db(),
            Kind::Cluster(_) => 0,
        }
    }
}

/// Reconnection delays: 10 ms doubling to 200 ms, each jittered to between half and all of
/// it (so that instances restarted together do not reconnect in step).
struct Backoff {
    next: Duration,
    rng: u64,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const CAP: Duration = Duration::from_millis(200);

    fn new(seed: u64) -> Backoff {
        let t =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(1);
        Backoff { next: Backoff::FIRST, rng: (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(t)) | 1 }
    }

    fn reset(&mut self) {
        self.next = Backoff::FIRST;
    }

    fn delay(&mut self) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let d = self.next;
        self.next = (d * 2).min(Backoff::CAP);
        let half = d.as_nanos() as u64 / 2;
        Duration::from_nanos(half + self.rng % (half + 1))
    }
}

/// A live node connection: its driver runs in a task of its own, which ends when the
/// connection closes (`done`), or when it is aborted (a failover drops the connection).
pub(crate) struct Driven {
    conn: MultiplexedConnection,
    driver: tokio::task::AbortHandle,
    done: oneshot::Receiver<()>,
}

/// Multiplexes a stream (redis-rs's handshake: AUTH, SELECT, CLIENT SETINFO) and spawns its
/// driver.
pub(crate) async fn multiplex<S>(info: &RedisConnectionInfo, stream: S) -> Result<Driven, Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // No response timeout of the connection's own (redis 1.x sets 500 ms): the caller's
    // deadline governs every call.
    let config = AsyncConnectionConfig::new().set_response_timeout(None).set_connection_timeout(None);
    let (conn, driver) = MultiplexedConnection::new_with_config(info, stream, config).await.map_err(classify)?;
    let (tx, done) = oneshot::channel();
    let task = tokio::spawn(async move {
        driver.await;
        let _ = tx.send(());
    });
    Ok(Driven { conn, driver: task.abort_handle(), done })
}

/// A connected stream: TCP (no Nagle), TLS over TCP, or a unix socket.
pub(crate) enum Stream {
    Tcp(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
    Unix(tokio::net::UnixStream),
}

/// Connects to `addr` (and does the TLS handshake when `tls` is given).
pub(crate) async fn stream(addr: &Addr, tls: Option<&tls::Connector>) -> Result<Stream, Error> {
    let refused = |e: std::io::Error| Error::new(ErrorKind::Unavailable, format!("connect to {addr}: {e}"));
    match addr {
        Addr::Tcp { host, port } => {
            let tcp = tokio::net::TcpStream::connect((host.as_str(), *port)).await.map_err(refused)?;
            let _ = tcp.set_nodelay(true);
            match tls {
                Some(t) => Ok(Stream::Tls(Box::new(t.handshake(host, tcp).await?))),
                None => Ok(Stream::Tcp(tcp)),
            }
        }
        Addr::Unix(path) => Ok(Stream::Unix(tokio::net::UnixStream::connect(path).await.map_err(refused)?)),
    }
}

/// Opens a multiplexed connection to `addr`.
pub(crate) async fn open(
    addr: &Addr,
    info: &RedisConnectionInfo,
    tls: Option<&tls::Connector>,
) -> Result<Driven, Error> {
    match stream(addr, tls).await? {
        Stream::Tcp(s) => multiplex(info, s).await,
        Stream::Tls(s) => multiplex(info, s).await,
        Stream::Unix(s) => multiplex(info, s).await,
    }
}

/// One pool slot's background task (see the module docs).
struct SlotTask {
    index: usize,
    kind: Kind,
    state: Arc<watch::Sender<State>>,
    closed: watch::Receiver<bool>,
    connect_timeout: Duration,
}

impl SlotTask {
    fn set(&self, s: SlotState) {
        self.state.send_modify(|st| {
            if matches!(s, SlotState::Live(_)) {
                st.made += 1;
            }
            if let Some(x) = st.slots.get_mut(self.index) {
                *x = s;
            }
        });
    }

    fn fail(&self, e: Error) {
        self.set(SlotState::Failed(e));
    }

    async fn run(self) {
        let mut closed = self.closed.clone();
        let mut backoff = Backoff::new(self.index as u64 + 1);
        match self.kind.clone() {
            Kind::Cluster(client) => loop {
                match tokio::time::timeout(self.connect_timeout, client.get_async_connection()).await {
                    Ok(Ok(c)) => {
                        self.set(SlotState::Live(Link::Cluster(c)));
                        // redis-rs's cluster connection reconnects by itself from here on.
                        let _ = closed.changed().await;
                        return;
                    }
                    Ok(Err(e)) => self.fail(classify(e)),
                    Err(_) => self.fail(Error::timeout("cluster: connect timed out")),
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff.delay()) => {}
                    _ = closed.changed() => return,
                }
            },
            Kind::Node(node) => {
                let mut master = node.master.clone();
                loop {
                    let Some(addr) = master.borrow_and_update().clone() else {
                        // The sentinels are being asked: calls wait (for a connect timeout, the
                        // time the sentinels have to answer), then fail at once until a master
                        // is known.
                        tokio::select! {
                            _ = master.changed() => continue,
                            _ = tokio::time::sleep(self.connect_timeout) => {}
                            _ = closed.changed() => return,
                        }
                        let why = node.sentinel.as_ref().and_then(|t| t.note()).unwrap_or_default();
                        self.fail(Error::new(ErrorKind::Unavailable, format!("no master known: {why}")));
                        tokio::select! {
                            _ = master.changed() => continue,
                            _ = closed.changed() => return,
                        }
                    };
                    let attempt = tokio::time::timeout(self.connect_timeout, self.open_checked(&node, &addr));
                    let result = tokio::select! {
                        r = attempt => r.unwrap_or_else(|_| Err(Error::timeout(&format!("connect to {addr} timed out")))),
                        _ = closed.changed() => return,
                    };
                    match result {
                        Ok(mut d) => {
                            backoff.reset();
                            self.set(SlotState::Live(Link::Node {
                                conn: d.conn.clone(),
                                addr: addr.to_string().into(),
                            }));
                            tokio::select! {
                                _ = &mut d.done => {
                                    tracing::warn!("redis connection to {addr} closed; reconnecting");
                                    self.set(SlotState::Connecting);
                                    if let Some(t) = &node.sentinel {
                                        t.ask_again();
                                    }
                                    // Reconnect at once (Redis restarted, or a proxy cut it).
                                    continue;
                                }
                                _ = master.changed() => {
                                    // A failover: drop this connection at once.
                                    d.driver.abort();
                                    self.set(SlotState::Connecting);
                                    continue;
                                }
                                _ = closed.changed() => {
                                    d.driver.abort();
                                    return;
                                }
                            }
                        }
                        Err(e) => {
                            self.fail(e);
                            if let Some(t) = &node.sentinel {
                                t.ask_again();
                            }
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff.delay()) => {}
                        _ = master.changed() => {}
                        _ = closed.changed() => return,
                    }
                }
            }
        }
    }

    /// Opens a connection; with Sentinel, only to a server whose `ROLE` is master.
    async fn open_checked(&self, node: &Node, addr: &Addr) -> Result<Driven, Error> {
        let mut d = open(addr, &node.info, node.tls.as_deref()).await?;
        if node.sentinel.is_some() {
            let role: Value = redis::cmd("ROLE").query_async(&mut d.conn).await.map_err(classify)?;
            let is_master =
                matches!(&role, Value::Array(a) if matches!(a.first(), Some(Value::BulkString(b)) if b == b"master"));
            if !is_master {
                d.driver.abort();
                return Err(Error::new(ErrorKind::Unavailable, format!("{addr} is not a master (ROLE: {role:?})")));
            }
        }
        Ok(d)
    }
}
