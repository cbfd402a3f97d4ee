//! The tokio driver of the reservation [`Engine`]: real time, real calls, timeouts, tasks.
//!
//! ```text
//! check(key, cost)
//!   ├─ held units cover it ─────────────► admitted locally (no await on Redis)
//!   │    └─ running low? ──► background claim (spawned; callers keep being served)
//!   ├─ over-limit cache / cost > capacity ► refused locally
//!   ├─ a claim of this key in flight ───► wait for it (one claim per key per process)
//!   ├─ breaker open ────────────────────► failure policy (fail closed / open / local limit)
//!   └─ else ────────────────────────────► claim (spawned, with a timeout), decided by its reply
//! ```
//!
//! * Keys live in shards (a `std::sync::Mutex` each, never held across an await), each with a
//!   `Notify` that wakes the requests waiting on a claim of that shard.
//! * Every Redis call runs in its own task under [`LimiterConfig::timeout`], so a caller that
//!   goes away (a dropped future) never leaves a claim half done: its units still land.
//! * A housekeeping task (every [`LimiterConfig::tick`]) expires leases, gives the units of idle
//!   keys back (RL.RETURN) and forgets idle keys. It holds only a weak reference.
//! * [`Limiter::shutdown`] gives every held unit back and waits for the returns. Dropping the
//!   last handle without it spawns the returns on the current runtime, best effort (nothing if
//!   no runtime is running; the units then expire at the server like any lease).
//! * Connections: anything `ConnectionLike + Clone + Send + Sync`. Use a
//!   `redis::aio::ConnectionManager` (or a cluster connection) so that the client reconnects
//!   after Redis restarts; a bare `MultiplexedConnection` stays broken once its socket dies.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::breaker::BreakerConfig;
use crate::commands::{self, Options};
use crate::decision::Decision;
use crate::engine::{Engine, EngineConfig, Outcome, Shared, Step};
use crate::lease::{ClaimRequest, LeaseConfig, ReturnRequest};
use crate::metrics::MetricsSnapshot;
use crate::policy::FailurePolicy;
use crate::spec::Limit;

fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// A limiter: one [`Limit`] applied to any number of keys, with its reservations, timeout,
/// breaker and failure policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LimiterConfig {
    pub limit: Limit,
    /// `L`: the longest a lease lives (from its claim's send time). Default 1 s, at most the
    /// period. The overshoot bound grows with it (docs/local-reservations.md).
    pub lease: Duration,
    /// Batch for this much demand. Default 100 ms (at most L/2).
    pub horizon: Duration,
    /// Largest claim. Default 1000.
    pub max_batch: u64,
    /// Instances sharing the limit: a claim takes at most `remaining ÷ instances` beyond the
    /// request's need. Default 1; set it to your fleet size.
    pub instances: u64,
    /// Serve from local batches (true by default, except RL.LEAKY). False: a per-request check
    /// with the over-limit cache, timeout, breaker and failure policy.
    pub batching: bool,
    /// Give a key's units back after this long without a request. Default L/2.
    pub idle_return: Duration,
    /// Per-call timeout. Default 100 ms.
    pub timeout: Duration,
    pub breaker: BreakerConfig,
    /// What to do when Redis cannot answer. Default fail closed.
    pub policy: FailurePolicy,
    /// Shadow mode: decide and count, but always let the caller through.
    pub shadow: bool,
    /// Housekeeping period. Default 50 ms.
    pub tick: Duration,
    /// Key shards (mutexes). Default 64.
    pub shards: usize,
}

impl LimiterConfig {
    pub fn new(limit: Limit) -> LimiterConfig {
        let l = LeaseConfig::new(limit);
        LimiterConfig {
            limit,
            lease: Duration::from_nanos(l.lease_ns),
            horizon: Duration::from_nanos(l.horizon_ns),
            max_batch: l.max_batch,
            instances: l.instances,
            batching: l.batching,
            idle_return: Duration::from_nanos(l.idle_return_ns),
            timeout: Duration::from_millis(100),
            breaker: BreakerConfig::default(),
            policy: FailurePolicy::FailClosed,
            shadow: false,
            tick: Duration::from_millis(50),
            shards: 64,
        }
    }

    /// Sets L, and the horizon and idle return that derive from it (at most L/2).
    pub fn lease(mut self, l: Duration) -> Self {
        self.lease = l;
        self.horizon = self.horizon.min(l / 2);
        self.idle_return = l / 2;
        self
    }
    pub fn instances(mut self, n: u64) -> Self {
        self.instances = n.max(1);
        self
    }
    pub fn batching(mut self, on: bool) -> Self {
        self.batching = on;
        self
    }
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
    pub fn policy(mut self, p: FailurePolicy) -> Self {
        self.policy = p;
        self
    }
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }
    pub fn breaker(mut self, failures: u32, cool_down: Duration) -> Self {
        self.breaker = BreakerConfig { failures, cool_down_ns: ns(cool_down) };
        self
    }

    /// The pure engine's configuration.
    pub fn engine_config(&self) -> EngineConfig {
        let mut lease = LeaseConfig::new(self.limit);
        lease.lease_ns = ns(self.lease).max(1);
        lease.horizon_ns = ns(self.horizon);
        lease.max_batch = self.max_batch.max(1);
        lease.instances = self.instances.max(1);
        lease.batching = self.batching;
        lease.idle_return_ns = ns(self.idle_return);
        lease.stale_claim_ns = ns(self.timeout).saturating_mul(4).max(1_000_000_000);
        lease.return_margin_ns = ns(self.timeout);
        EngineConfig { lease, breaker: self.breaker, policy: self.policy, shadow: self.shadow }
    }
}

struct Shard {
    engine: Mutex<Engine<String>>,
    /// Woken after every claim of this shard completes.
    notify: Notify,
}

struct Inner<C: ConnectionLike + Clone + Send + Sync + 'static> {
    conn: C,
    config: LimiterConfig,
    shared: Arc<Shared>,
    shards: Box<[Shard]>,
    hasher: std::collections::hash_map::RandomState,
    epoch: Instant,
}

/// The client-side limiter. Cheap to clone (one shared state); create it inside a tokio
/// runtime.
pub struct Limiter<C: ConnectionLike + Clone + Send + Sync + 'static> {
    inner: Arc<Inner<C>>,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Clone for Limiter<C> {
    fn clone(&self) -> Self {
        Limiter { inner: self.inner.clone() }
    }
}

/// Whether an error means Redis is unreachable (counts for the breaker), rather than a reply.
fn is_outage(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::IoError
                | ErrorKind::BusyLoadingError
                | ErrorKind::TryAgain
                | ErrorKind::ClusterDown
                | ErrorKind::MasterDown
                | ErrorKind::ClusterConnectionNotFound
        )
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Limiter<C> {
    /// A limiter over `conn`. Starts its housekeeping task on the current tokio runtime.
    pub fn new(conn: C, config: LimiterConfig) -> Limiter<C> {
        let shared = Shared::new(config.engine_config());
        let shards = (0..config.shards.max(1))
            .map(|_| Shard { engine: Mutex::new(Engine::with_shared(shared.clone())), notify: Notify::new() })
            .collect();
        let inner = Arc::new(Inner { conn, config, shared, shards, hasher: Default::default(), epoch: Instant::now() });
        let weak = Arc::downgrade(&inner);
        let period = config.tick.max(Duration::from_millis(1));
        tokio::spawn(async move {
            let mut every = tokio::time::interval(period);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                inner.housekeeping();
            }
        });
        Limiter { inner }
    }

    pub fn config(&self) -> &LimiterConfig {
        &self.inner.config
    }

    /// The counters (see [`MetricsSnapshot`]).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.shared.metrics.snapshot()
    }

    /// Decides a request for `cost` units of `key`.
    pub async fn check(&self, key: &str, cost: u64) -> Outcome {
        let inner = &self.inner;
        let key = key.to_owned();
        let mut step = inner.lock(&key).check(inner.now(), &key, cost);
        loop {
            step = match step {
                Step::Done { outcome, refill } => {
                    if let Some(c) = refill {
                        tokio::spawn(inner.clone().claim(key.clone(), c, 0));
                    }
                    return outcome;
                }
                Step::Send(c) => match tokio::spawn(inner.clone().claim(key.clone(), c, cost)).await {
                    Ok(Some(s)) => s,
                    // A reply the engine did not attribute to this request, or a panic.
                    _ => inner.lock(&key).resume(inner.now(), &key, cost, c.id),
                },
                Step::Wait { claim } => inner.wait(&key, cost, claim).await,
            };
        }
    }

    /// Gives every held unit back (RL.RETURN), waits for the returns (each under the timeout),
    /// and answers the metrics. The limiter stays usable (later checks claim anew).
    pub async fn shutdown(&self) -> MetricsSnapshot {
        let inner = &self.inner;
        let now = inner.now();
        let mut returns = Vec::new();
        for s in inner.shards.iter() {
            returns.extend(s.engine.lock().unwrap_or_else(|e| e.into_inner()).drain(now));
        }
        let tasks: Vec<_> = returns.into_iter().map(|(k, r)| tokio::spawn(inner.clone().give_back(k, r))).collect();
        for t in tasks {
            let _ = t.await;
        }
        self.metrics()
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Inner<C> {
    fn now(&self) -> u64 {
        // +1: 0 is never a real instant.
        ns(self.epoch.elapsed()) + 1
    }

    fn shard(&self, key: &str) -> &Shard {
        &self.shards[(self.hasher.hash_one(key) % self.shards.len() as u64) as usize]
    }

    fn lock(&self, key: &str) -> MutexGuard<'_, Engine<String>> {
        self.shard(key).engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends a claim and reports it; answers the next step of the request that sent it.
    async fn claim(self: Arc<Self>, key: String, c: ClaimRequest, cost: u64) -> Option<Step> {
        let cmd = commands::limit_cmd(
            &key,
            &self.config.limit,
            Options { cost: Some(c.units), partial: c.partial, dry_run: false },
        );
        let mut conn = self.conn.clone();
        let res = tokio::time::timeout(self.config.timeout, cmd.query_async::<Decision>(&mut conn)).await;
        let now = self.now();
        let step = {
            let mut e = self.lock(&key);
            match res {
                Ok(Ok(d)) => e.on_reply(now, &key, &c, cost, &d),
                Ok(Err(err)) if !is_outage(&err) => e.on_server_error(now, &key, &c, cost),
                _ => e.on_error(now, &key, &c, cost),
            }
        };
        self.shard(&key).notify.notify_waiters();
        step
    }

    /// Waits for claim `claim` of `key` (for at most the timeout and a half), then decides.
    async fn wait(&self, key: &String, cost: u64, claim: u64) -> Step {
        let deadline = Instant::now() + self.config.timeout + self.config.timeout / 2;
        let shard = self.shard(key);
        loop {
            let notified = {
                let mut e = self.lock(key);
                let pending = e.key(key).and_then(|s| s.in_flight()).is_some_and(|c| c.id == claim);
                if !pending {
                    return e.resume(self.now(), key, cost, claim);
                }
                if Instant::now() >= deadline {
                    return e.unavailable(self.now(), key, cost);
                }
                // Registered before the lock is released: the claim's completion (which takes
                // the lock first) cannot be missed.
                shard.notify.notified()
            };
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }

    /// `RL.RETURN key units AGE ms`, AGE measured from the claim's send time plus the call
    /// timeout: never less than the true age even if the return is slow to arrive (a window
    /// never takes units back into a later window; a bucket deducts at least the refill it got
    /// meanwhile).
    async fn give_back(self: Arc<Self>, key: String, r: ReturnRequest) {
        let age = Duration::from_nanos(self.now().saturating_sub(r.claim_sent_at)) + self.config.timeout;
        let mut conn = self.conn.clone();
        let res =
            tokio::time::timeout(self.config.timeout, commands::give_back(&mut conn, &key, r.units, Some(age))).await;
        let e = self.lock(&key);
        match res {
            Ok(Ok(n)) => e.on_return_reply(n),
            Ok(Err(err)) if !is_outage(&err) => e.on_return_reply(0),
            _ => e.on_return_error(self.now()),
        }
    }

    fn housekeeping(self: &Arc<Self>) {
        let now = self.now();
        for s in self.shards.iter() {
            let returns = s.engine.lock().unwrap_or_else(|e| e.into_inner()).tick(now);
            for (k, r) in returns {
                tokio::spawn(self.clone().give_back(k, r));
            }
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Drop for Inner<C> {
    /// Best effort: gives held units back on the current runtime, if any.
    fn drop(&mut self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let now = ns(self.epoch.elapsed()) + 1;
        let mut returns: HashMap<String, Vec<ReturnRequest>> = HashMap::new();
        for s in self.shards.iter() {
            for (k, r) in s.engine.lock().unwrap_or_else(|e| e.into_inner()).drain(now) {
                returns.entry(k).or_default().push(r);
            }
        }
        if returns.is_empty() {
            return;
        }
        let (mut conn, timeout) = (self.conn.clone(), self.config.timeout);
        rt.spawn(async move {
            for (k, rs) in returns {
                for r in rs {
                    let age = Duration::from_nanos(now.saturating_sub(r.claim_sent_at)) + timeout;
                    let _ = tokio::time::timeout(timeout, commands::give_back(&mut conn, &k, r.units, Some(age))).await;
                }
            }
        });
    }
}
