//! The tokio driver of the reservation [`Engine`]: real time, real calls, timeouts, tasks.
//!
//! ```text
//! check(key, cost)
//!   ├─ held units cover it ─────────────► admitted locally (no await on Redis)
//!   │    └─ running low? ──► background claim (spawned; callers keep being served)
//!   ├─ over-limit cache / cost > capacity ► refused locally
//!   ├─ a claim of this key in flight ───► wait for it (one claim per key per process)
//!   ├─ breaker open ────────────────────► failure policy (fail closed / open / local limit)
//!   ├─ a key not remembered ────────────► one-off claim, decided by its reply alone
//!   └─ else ────────────────────────────► claim, decided by its reply
//! ```
//!
//! * Keys live in shards (a `std::sync::Mutex` each, never held across an await), picked by the
//!   same hash the shard's engine finds the key with, each with a `Notify` that wakes the
//!   requests waiting on a claim of that shard.
//! * One door: every request's first step ([`Engine::check_hashed`], [`Engine::peek`]) is taken
//!   under its shard's lock in the caller's task; decided there (the local path) it is answered
//!   at once, with no await, allocation or task. Otherwise the rest of the request (one loop
//!   over its [`Step`]s: its claims, each under a tokio timeout to its [`Claim::deadline`], and
//!   its waits for other requests' claims) is boxed and awaited in the caller's task; a caller
//!   that goes away hands it to a task of its own, so the request finishes all the same (its
//!   claim's units land, a refill its reply asks for is sent, the key's waiters are woken),
//!   decided and counted as any other.
//! * Housekeeping (lease expiry, idle returns, forgetting keys) runs in one task that sleeps
//!   until the earliest deadline of any shard ([`Engine::poll_timeout`]), at most the wheel's
//!   resolution (a deadline published meanwhile is handled that late at most), and handles only
//!   the keys due ([`Engine::handle_timeout`]). With no deadline anywhere it sleeps until a
//!   shard gets one (a tokio `Notify` whose permit no wake-up can miss). It holds only a weak
//!   reference.
//! * [`Limiter::shutdown`] gives every held unit back and waits for the returns. Dropping the
//!   last handle without it spawns the returns on the current runtime, best effort (nothing if
//!   no runtime is running; the units then expire at the server like any lease).
//! * Connections: anything `ConnectionLike + Clone + Send + Sync`. Use a
//!   [`crate::Connection`] (reconnects in the background, one server, a cluster or Sentinel's
//!   primary); a `redis::aio::ConnectionManager` left at redis's default backoff recovers
//!   seconds after a Redis restart, and a bare `MultiplexedConnection` never does.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, ServerErrorKind};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::breaker::BreakerConfig;
use crate::clock::Clock;
use crate::commands;
use crate::decision::Decision;
use crate::engine::{CallError, Claim, Engine, EngineConfig, Outcome, Return, Shared, Step, Waiter};
use crate::lease::LeaseConfig;
use crate::metrics::MetricsSnapshot;
use crate::policy::FailurePolicy;
use crate::spec::Limit;
use redis_ratelimit_core::{AtomicNanos, Nanos};

/// A [`LimiterConfig`] setting out of its range: which setting and what it must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimiterConfigError {
    /// The builder method that set it (`max_batch`, `instances`, …).
    pub setting: &'static str,
    pub rule: &'static str,
}

impl std::fmt::Display for LimiterConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LimiterConfig::{}: {}", self.setting, self.rule)
    }
}

impl std::error::Error for LimiterConfigError {}

/// A limiter's configuration: one [`Limit`] applied to any number of keys, with its
/// reservations, timeout, breaker and failure policy. A builder: every setting has a default
/// and the order of the calls never matters (derived settings are resolved at the end, by
/// [`LimiterConfig::engine_config`], which, as [`Limiter::new`], refuses a setting out of its
/// range with a [`LimiterConfigError`] naming it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LimiterConfig {
    limit: Limit,
    lease: Option<Duration>,
    horizon: Option<Duration>,
    idle_return: Option<Duration>,
    max_batch: u64,
    instances: u64,
    batching: Option<bool>,
    timeout: Duration,
    breaker: BreakerConfig,
    policy: FailurePolicy,
    shadow: bool,
    shards: usize,
    max_keys: usize,
    sightings: usize,
}

impl LimiterConfig {
    pub fn new(limit: Limit) -> LimiterConfig {
        LimiterConfig {
            limit,
            lease: None,
            horizon: None,
            idle_return: None,
            max_batch: 1000,
            instances: 1,
            batching: None,
            timeout: Duration::from_millis(100),
            breaker: BreakerConfig::default(),
            policy: FailurePolicy::FailClosed,
            shadow: false,
            shards: 64,
            max_keys: 0,
            sightings: 65_536,
        }
    }

    /// `L`: the longest a lease lives (from its claim's send time), above zero. Default 1 s, at
    /// most the period. The overshoot bound grows with it (docs/local-reservations.md).
    pub fn lease(mut self, l: Duration) -> Self {
        self.lease = Some(l);
        self
    }
    /// Batch for this much demand. Default 100 ms; at most L/2 whatever is set.
    pub fn horizon(mut self, h: Duration) -> Self {
        self.horizon = Some(h);
        self
    }
    /// Give a key's units back after this long without a request. Default L/2.
    pub fn idle_return(mut self, d: Duration) -> Self {
        self.idle_return = Some(d);
        self
    }
    /// Largest claim, at least 1. Default 1000.
    pub fn max_batch(mut self, n: u64) -> Self {
        self.max_batch = n;
        self
    }
    /// Instances sharing the limit, at least 1: sets the pacing of exhausted keys and the share
    /// of [`FailurePolicy::LocalShare`]. Default 1; set it to your fleet size.
    pub fn instances(mut self, n: u64) -> Self {
        self.instances = n;
        self
    }
    /// Serve from local batches (default true, except RL.LEAKY and RL.SLIDINGLOG). False: a
    /// per-request check with the over-limit cache, timeout, breaker and failure policy.
    pub fn batching(mut self, on: bool) -> Self {
        self.batching = Some(on);
        self
    }
    /// Per-call timeout, above zero. Default 100 ms.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
    /// Consecutive failures that open the breaker (at least 1), and how long it stays open.
    /// Default 5, 1 s.
    pub fn breaker(mut self, failures: u32, cool_down: Duration) -> Self {
        self.breaker = BreakerConfig { failures, cool_down: cool_down.into() };
        self
    }
    /// What to do when Redis cannot answer. Default fail closed.
    pub fn policy(mut self, p: FailurePolicy) -> Self {
        self.policy = p;
        self
    }
    /// Shadow mode: decide and count, but always let the caller through.
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }
    /// Key shards (mutexes), at least 1. Default 64.
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = n;
        self
    }
    /// At most about this many keys remembered (0, the default: no cap). Beyond it a new key
    /// evicts one of the least recently used (its units are given back); the bound is
    /// unaffected (docs/local-reservations.md). The cap is per shard (this ÷ the shards,
    /// rounded up). A key with a claim in flight is never evicted: a new key that finds none
    /// to evict is decided by a one-off claim, not remembered (`sightings`).
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n;
        self
    }
    /// Entries of the table of recent first requests (4 bytes each, spread over the shards;
    /// default 65,536; 0: remember every key from its first request). The request of a key
    /// not remembered is an exact claim that leaves nothing behind (no slot, timer or
    /// forgetting) unless the key's own first request is in its entry, younger than L: then
    /// the key is remembered. Most keys of a per-IP limit are seen once; a key that keeps
    /// coming back is remembered within L plus two requests (a cold key's claims are exact
    /// anyway). The bound is unaffected: an exact claim holds nothing
    /// (docs/local-reservations.md).
    pub fn sightings(mut self, n: usize) -> Self {
        self.sightings = n;
        self
    }

    pub fn limit(&self) -> Limit {
        self.limit
    }
    /// `L` as the engine uses it.
    pub fn lease_length(&self) -> Duration {
        self.resolved().lease.lease.into()
    }
    pub fn timeout_length(&self) -> Duration {
        self.timeout
    }
    pub fn cool_down(&self) -> Duration {
        self.breaker.cool_down.into()
    }
    /// The failure policy as the engine applies it (`LocalShare` resolved).
    pub fn failure_policy(&self) -> FailurePolicy {
        self.policy.resolve(&self.limit, self.instances)
    }
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }
    pub fn shard_count(&self) -> usize {
        self.shards
    }

    /// The settings out of their range, the first found.
    fn check(&self) -> Result<(), LimiterConfigError> {
        let err = |setting, rule| Err(LimiterConfigError { setting, rule });
        if self.lease.is_some_and(|l| l.is_zero()) {
            return err("lease", "must be above zero");
        }
        if self.max_batch == 0 {
            return err("max_batch", "must be at least 1");
        }
        if self.instances == 0 {
            return err("instances", "must be at least 1");
        }
        if self.timeout.is_zero() {
            return err("timeout", "must be above zero");
        }
        if self.breaker.failures == 0 {
            return err("breaker", "failures must be at least 1");
        }
        if self.shards == 0 {
            return err("shards", "must be at least 1");
        }
        Ok(())
    }

    /// The pure engine's configuration, every derived setting resolved; an error names a
    /// setting out of its range.
    pub fn engine_config(&self) -> Result<EngineConfig, LimiterConfigError> {
        self.check()?;
        Ok(self.resolved())
    }

    /// [`LimiterConfig::engine_config`] of settings in range.
    fn resolved(&self) -> EngineConfig {
        let mut lease = LeaseConfig::new(self.limit);
        if let Some(l) = self.lease {
            lease.lease = Nanos::from(l);
        }
        let half = lease.lease / 2;
        lease.horizon = self.horizon.map_or(Nanos::from_millis(100), Nanos::from).min(half);
        lease.idle_return = self.idle_return.map_or(half, Nanos::from);
        lease.max_batch = self.max_batch;
        lease.instances = self.instances;
        if let Some(b) = self.batching {
            lease.batching = b;
        }
        let timeout = Nanos::from(self.timeout);
        lease.stale_claim = (timeout * 4).max(Nanos::from_secs(1));
        lease.return_margin = timeout;
        let shards = self.shards;
        EngineConfig {
            breaker: self.breaker,
            policy: self.failure_policy(),
            shadow: self.shadow,
            call_timeout: timeout,
            max_keys: if self.max_keys == 0 { 0 } else { self.max_keys.div_ceil(shards) },
            sightings: if self.sightings == 0 { 0 } else { self.sightings.div_ceil(shards) },
            ..EngineConfig::from_lease(lease)
        }
    }
}

/// The driver's keys: inline up to 24 bytes (no allocation for the usual API key, IP or user
/// id), hashed as the `str` they hold.
type StoredKey = compact_str::CompactString;

/// Aligned so that neighbouring shards' locks never share a cache line.
#[repr(align(128))]
struct Shard {
    engine: Mutex<Engine<StoredKey>>,
    /// Woken after every claim of this shard completes.
    notify: Notify,
    /// The engine's next deadline (`Nanos::MAX`: none), for the housekeeping task.
    next_wake: AtomicNanos,
}

struct Inner<C: ConnectionLike + Clone + Send + Sync + 'static> {
    conn: C,
    config: LimiterConfig,
    shared: Arc<Shared>,
    shards: Box<[Shard]>,
    clock: Clock,
    /// Wakes the housekeeping task when a shard gets a deadline where it had none.
    housekeeper: Arc<Notify>,
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
            ErrorKind::Io
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                )
                | ErrorKind::ClusterConnectionNotFound
        )
}

fn call_error(e: &RedisError) -> CallError {
    if is_outage(e) {
        CallError::Unavailable
    } else {
        CallError::Refused
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Limiter<C> {
    /// A limiter over `conn`. Starts its housekeeping task on the current tokio runtime. An
    /// error names a setting of `config` out of its range (the limit itself was validated when
    /// it was made).
    pub fn new(conn: C, config: LimiterConfig) -> Result<Limiter<C>, LimiterConfigError> {
        let shared = Shared::new(config.engine_config()?);
        let shards = (0..config.shards)
            .map(|_| Shard {
                engine: Mutex::new(Engine::with_shared(shared.clone())),
                notify: Notify::new(),
                next_wake: AtomicNanos::new(Nanos::MAX),
            })
            .collect();
        let housekeeper = Arc::new(Notify::new());
        let inner =
            Arc::new(Inner { conn, config, shared, shards, clock: Clock::new(), housekeeper: housekeeper.clone() });
        tokio::spawn(housekeeping(Arc::downgrade(&inner), housekeeper));
        Ok(Limiter { inner })
    }

    pub fn config(&self) -> &LimiterConfig {
        &self.inner.config
    }

    /// The counters and gauges (see [`MetricsSnapshot`]).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.shared.snapshot()
    }

    /// Decides a request for `cost` units of `key`, taking them when admitted.
    pub async fn check(&self, key: &str, cost: u64) -> Outcome {
        let inner = &self.inner;
        let hash = inner.shared.hash(key);
        // The decided outcome is returned before the await, so the future keeps only the rest's
        // handle across it.
        match inner.first_step(hash, key, |e, now| e.check_hashed(now, hash, key, cost)) {
            Ok(outcome) => outcome,
            Err(rest) => rest.finish().await,
        }
    }

    /// Decides a request for `cost` units of `key` without taking anything: from the units
    /// held or the over-limit cache when they decide, else by a `DRYRUN` call; the failure
    /// policy (without consuming its local bucket) while Redis is unavailable. Not counted as
    /// a request.
    pub async fn peek(&self, key: &str, cost: u64) -> Outcome {
        let inner = &self.inner;
        let hash = inner.shared.hash(key);
        match inner.first_step(hash, key, |e, now| e.peek(now, key, cost)) {
            Ok(outcome) => outcome,
            Err(rest) => rest.finish().await,
        }
    }

    /// Puts back the units an admitted `outcome` of `key` took, at no cost (no Redis call):
    /// they serve the next request. For a request refused by something else after this limit
    /// admitted it. False when nothing went back.
    pub fn refund(&self, key: &str, outcome: &Outcome) -> bool {
        let inner = &self.inner;
        inner.with_engine(inner.shared.hash(key), |e, now| e.refund(now, key, outcome))
    }

    /// What `key` would get from local knowledge alone (see [`Engine::peek_local`]).
    fn peek_local(&self, key: &str, cost: u64) -> Option<Outcome> {
        let inner = &self.inner;
        inner.with_engine(inner.shared.hash(key), |e, now| e.peek_local(now, key, cost))
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
        let tasks: Vec<_> = returns.into_iter().map(|r| tokio::spawn(inner.clone().give_back(r))).collect();
        for t in tasks {
            let _ = t.await;
        }
        self.metrics()
    }
}

/// The answer to a multi-limit check ([`check_all`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllOutcome {
    /// Let the request through: every limit allowed it (a limit in shadow mode always does).
    pub allowed: bool,
    /// Every limit admitted it as enforced.
    pub enforced: bool,
    /// The first limit (index into the checks) whose refusal refused the request.
    pub refused_by: Option<usize>,
    /// One per check, in order; `None` for a limit not consulted (another refused first from
    /// its over-limit cache).
    pub outcomes: Vec<Option<Outcome>>,
}

impl AllOutcome {
    /// The outcome whose headers describe the request: refused, the refusing limit with the
    /// largest `retry_after` (refused for good: the refusing limit); admitted, the one with the
    /// fewest `remaining` (as RL.MULTI's, docs/http-headers.md).
    pub fn binding(&self) -> Option<&Outcome> {
        let all = || self.outcomes.iter().flatten();
        if self.allowed && self.enforced {
            return all().min_by_key(|o| o.remaining.unwrap_or(u64::MAX));
        }
        all().filter(|o| !o.enforced).max_by_key(|o| o.retry_after.unwrap_or(Nanos::ZERO))
    }

    /// The longest `retry_after` among the refusing limits.
    pub fn retry_after(&self) -> Option<Duration> {
        self.outcomes.iter().flatten().filter(|o| !o.enforced).filter_map(|o| o.retry_after()).max()
    }
}

/// Several limits for one request (per IP *and* per API key, say): admitted only if every
/// limit admits. When one refuses, nothing is taken from any: units the others took go back to
/// their local pools at no cost (a claim made for this request leaves its units held, to serve
/// the next request or go back with RL.RETURN … AGE when idle), so each limit keeps its own
/// bound. A limit that refuses from its over-limit cache is found before any other is
/// consulted (no Redis call, nothing taken); the others are checked concurrently.
pub async fn check_all<C: ConnectionLike + Clone + Send + Sync + 'static>(
    checks: &[(&Limiter<C>, &str)],
    cost: u64,
) -> AllOutcome {
    let mut outcomes: Vec<Option<Outcome>> = vec![None; checks.len()];
    // A local refusal first: it decides without taking anything from the others.
    if let Some(i) = checks.iter().position(|(l, k)| l.peek_local(k, cost).is_some_and(|o| !o.enforced && !o.allowed)) {
        let (l, k) = checks[i];
        let o = l.check(k, cost).await;
        let refused = !o.allowed;
        outcomes[i] = Some(o);
        if refused {
            return AllOutcome { allowed: false, enforced: false, refused_by: Some(i), outcomes };
        }
        // It changed its mind (its hold just ended): check the others too, and undo it if
        // one of them refuses.
    }
    let pending: Vec<usize> = (0..checks.len()).filter(|&i| outcomes[i].is_none()).collect();
    let results = futures_util::future::join_all(pending.iter().map(|&i| checks[i].0.check(checks[i].1, cost))).await;
    for (i, o) in pending.into_iter().zip(results) {
        outcomes[i] = Some(o);
    }
    let refused_by = outcomes.iter().position(|o| o.is_some_and(|o| !o.allowed));
    if refused_by.is_some() {
        for (i, o) in outcomes.iter().enumerate() {
            if let Some(o) = o.filter(|o| o.enforced) {
                checks[i].0.refund(checks[i].1, &o);
            }
        }
    }
    let allowed = refused_by.is_none();
    let enforced = allowed && outcomes.iter().all(|o| o.is_some_and(|o| o.enforced));
    AllOutcome { allowed, enforced, refused_by, outcomes }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Inner<C> {
    fn now(&self) -> Nanos {
        self.clock.now()
    }

    fn instant(&self, t: Nanos) -> Instant {
        self.clock.instant(t)
    }

    fn shard(&self, hash: u64) -> &Shard {
        // The high bits (the shard's table indexes by the low ones), mapped onto the shards by
        // a multiply and a shift rather than a division.
        &self.shards[(((hash >> 32) as u128 * self.shards.len() as u128) >> 32) as usize]
    }

    fn lock(shard: &Shard) -> MutexGuard<'_, Engine<StoredKey>> {
        shard.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the shard of `hash`, then publishes the shard's next deadline and sends what
    /// the engine queued (the returns of a key evicted by the `max_keys` cap).
    fn with_engine<T>(self: &Arc<Self>, hash: u64, f: impl FnOnce(&mut Engine<StoredKey>, Nanos) -> T) -> T {
        let shard = self.shard(hash);
        let mut e = Inner::<C>::lock(shard);
        let out = f(&mut e, self.now());
        self.release(shard, e);
        out
    }

    /// Unlocks a shard after a call: publishes its next deadline for the housekeeping task,
    /// under the lock (so the value left is the last engine state's, whatever the order the
    /// holders unlock in), written only when it changed (the usual check leaves it where it
    /// was), then sends what the engine queued. A shard that had no deadline wakes the task,
    /// which may be sleeping until woken (`notify_one` leaves a permit if it is not waiting
    /// yet: no wake-up is lost); an earlier deadline than before is seen at the task's next
    /// wake-up, at most the wheel's resolution later.
    #[inline]
    fn release(self: &Arc<Self>, shard: &Shard, mut e: MutexGuard<'_, Engine<StoredKey>>) {
        let next = e.poll_timeout().unwrap_or(Nanos::MAX);
        let was = shard.next_wake.load(Ordering::Relaxed);
        if was != next {
            shard.next_wake.store(next, Ordering::Relaxed);
        }
        let transmit = e.poll_transmit();
        if transmit.is_none() {
            drop(e);
            self.woken(was, next);
            return;
        }
        let mut returns: Vec<Return<StoredKey>> = transmit.into_iter().collect();
        while let Some(r) = e.poll_transmit() {
            returns.push(r);
        }
        drop(e);
        self.woken(was, next);
        for r in returns {
            tokio::spawn(self.clone().give_back(r));
        }
    }

    /// Wakes the housekeeping task when a shard's deadline went from none to some.
    #[inline]
    fn woken(&self, was: Nanos, next: Nanos) {
        if was == Nanos::MAX && next != Nanos::MAX {
            self.housekeeper.notify_one();
        }
    }

    /// A request's first step, `f` under the shard's lock: decided at once (the local path:
    /// ready on the first poll, no allocation, nothing awaited; only the outcome leaves the
    /// engine's step), or the rest of it ([`Inner::rest`], boxed: one allocation).
    #[inline]
    fn first_step(
        self: &Arc<Self>,
        hash: u64,
        key: &str,
        f: impl FnOnce(&mut Engine<StoredKey>, Nanos) -> Step<StoredKey>,
    ) -> Result<Outcome, Rest> {
        let shard = self.shard(hash);
        let mut e = Inner::<C>::lock(shard);
        let step = f(&mut e, self.now());
        self.release(shard, e);
        match step {
            Step::Done { outcome, refill: None } => Ok(outcome),
            Step::Done { outcome, refill: Some(c) } => {
                self.refill(c);
                Ok(outcome)
            }
            step => Err(Rest(Some(Box::pin(self.clone().rest(StoredKey::from(key), step))))),
        }
    }

    /// Sends a background claim from a task of its own: nobody waits for it.
    fn refill(self: &Arc<Self>, c: Claim<StoredKey>) {
        let inner = self.clone();
        tokio::spawn(async move {
            let _ = inner.call(c).await;
        });
    }

    /// The rest of a request its first step did not decide: one loop over its steps, each
    /// claim under its timeout. Its caller may go away meanwhile: the request is carried to its
    /// end all the same ([`Rest`]: decided and counted, its outcome unheard).
    async fn rest(self: Arc<Self>, key: StoredKey, mut step: Step<StoredKey>) -> Outcome {
        let hash = self.shared.hash(key.as_str());
        loop {
            step = match step {
                Step::Done { outcome, refill } => {
                    if let Some(c) = refill {
                        self.refill(c);
                    }
                    return outcome;
                }
                Step::Send(c) => {
                    let waiter = Waiter::gave_up(&c);
                    match self.call(c).await {
                        Some(s) => s,
                        // The engine answers every request's own claim; should it not, the
                        // request is decided as if that claim had failed.
                        None => self.with_engine(hash, |e, now| e.resume(now, key.as_str(), waiter)),
                    }
                }
                Step::Wait(w) => self.wait(hash, key.as_str(), w).await,
            };
        }
    }

    /// Sends a claim under its timeout and reports it to the engine; wakes the key's waiters.
    /// Answers the next step of the request that sent it (`None` for a background claim).
    async fn call(self: &Arc<Self>, c: Claim<StoredKey>) -> Option<Step<StoredKey>> {
        let mut conn = self.conn.clone();
        let res =
            tokio::time::timeout_at(self.instant(c.deadline()), c.command().query_async::<Decision>(&mut conn)).await;
        let hash = self.shared.hash(c.key().as_str());
        let step = self.with_engine(hash, |e, now| match res {
            Ok(Ok(d)) => e.on_reply(now, &c, &d),
            Ok(Err(err)) => e.on_error(now, &c, call_error(&err)),
            Err(_) => e.on_error(now, &c, CallError::Unavailable),
        });
        self.shard(hash).notify.notify_waiters();
        step
    }

    /// Waits for the claim `w` waits on (woken by its completion, or at `w.until()`), then
    /// lets the engine decide.
    async fn wait(self: &Arc<Self>, hash: u64, key: &str, mut w: Waiter) -> Step<StoredKey> {
        let shard = self.shard(hash);
        loop {
            let notified = shard.notify.notified();
            tokio::pin!(notified);
            // Registered before the engine looks: the claim's completion cannot be missed.
            notified.as_mut().enable();
            match self.with_engine(hash, |e, now| e.resume(now, key, w)) {
                Step::Wait(again) => w = again,
                step => return step,
            }
            let _ = tokio::time::timeout_at(self.instant(w.until()), notified).await;
        }
    }

    /// `RL.RETURN key units AGE ms`, sent so as to arrive by the return's deadline (its AGE
    /// counts the margin up to there) or not at all.
    async fn give_back(self: Arc<Self>, r: Return<StoredKey>) {
        let mut conn = self.conn.clone();
        let res = tokio::time::timeout_at(self.instant(r.deadline()), r.command().query_async::<i64>(&mut conn)).await;
        let result = match res {
            Ok(r) => commands::return_reply(r).map_err(|e| call_error(&e)),
            Err(_) => Err(CallError::Unavailable),
        };
        self.shared.on_return(self.now(), result);
    }
}

/// The rest of a request ([`Inner::rest`]), awaited in its caller's task ([`Rest::finish`]). A
/// caller that goes away before it is done (its future dropped) hands it to a task of its own,
/// so that a request is never left half done: its claim's units land, a refill its reply asks
/// for is sent, a re-claim is sent, and the key's other requests are woken. (Spawning every
/// rest instead costs ~10 % more CPU per cold request: client/benches/cold.rs.)
struct Rest(Option<Pin<Box<dyn Future<Output = Outcome> + Send + 'static>>>);

impl Rest {
    async fn finish(mut self) -> Outcome {
        let outcome = self.0.as_mut().expect("a rest is finished once").await;
        self.0 = None;
        outcome
    }
}

impl Drop for Rest {
    fn drop(&mut self) {
        if let (Some(rest), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(rest);
        }
    }
}

/// The housekeeping task: sleeps until the earliest deadline of any shard, at most the wheel's
/// resolution (or, with none, until a shard gets one), then lets the shards that are due
/// handle it and sends their returns. Holds the limiter only while working.
async fn housekeeping<C: ConnectionLike + Clone + Send + Sync + 'static>(weak: Weak<Inner<C>>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(inner) = weak.upgrade() else { return };
            let now = inner.now();
            let mut returns = Vec::new();
            for s in inner.shards.iter() {
                if s.next_wake.load(Ordering::Relaxed) <= now {
                    let mut e = Inner::<C>::lock(s);
                    e.handle_timeout(now);
                    while let Some(r) = e.poll_transmit() {
                        returns.push(r);
                    }
                    s.next_wake.store(e.poll_timeout().unwrap_or(Nanos::MAX), Ordering::Relaxed);
                }
            }
            for r in returns {
                tokio::spawn(inner.clone().give_back(r));
            }
            let next = inner.shards.iter().map(|s| s.next_wake.load(Ordering::Relaxed)).min().unwrap_or(Nanos::MAX);
            (next != Nanos::MAX).then(|| inner.instant(next.min(now + inner.shared.config.granularity)))
        };
        match next {
            Some(at) => {
                let _ = tokio::time::timeout_at(at, wake.notified()).await;
            }
            None => wake.notified().await,
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Drop for Inner<C> {
    /// Best effort: gives held units back on the current runtime, if any; stops housekeeping.
    fn drop(&mut self) {
        self.housekeeper.notify_one();
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let now = self.now();
        let mut returns = Vec::new();
        for s in self.shards.iter() {
            returns.extend(Inner::<C>::lock(s).drain(now));
        }
        if returns.is_empty() {
            return;
        }
        let deadlines: Vec<Instant> = returns.iter().map(|r| self.instant(r.deadline())).collect();
        let mut conn = self.conn.clone();
        rt.spawn(async move {
            for (r, deadline) in returns.into_iter().zip(deadlines) {
                let _ = tokio::time::timeout_at(deadline, r.command().query_async::<i64>(&mut conn)).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_out_of_range_is_an_error_naming_it() {
        let limit = Limit::gcra(10, Duration::from_secs(1)).unwrap();
        let ok = LimiterConfig::new(limit);
        assert!(ok.engine_config().is_ok());
        let cases: [(LimiterConfig, &str); 6] = [
            (ok.lease(Duration::ZERO), "lease"),
            (ok.max_batch(0), "max_batch"),
            (ok.instances(0), "instances"),
            (ok.timeout(Duration::ZERO), "timeout"),
            (ok.breaker(0, Duration::from_secs(1)), "breaker"),
            (ok.shards(0), "shards"),
        ];
        for (config, setting) in cases {
            let e = config.engine_config().unwrap_err();
            assert_eq!(e.setting, setting);
            assert!(e.to_string().starts_with(&format!("LimiterConfig::{setting}: ")), "{e}");
        }
        // The documented clamp stays one: the horizon is at most L/2 whatever is set.
        let e = ok.lease(Duration::from_millis(100)).horizon(Duration::from_secs(5)).engine_config().unwrap();
        assert_eq!(e.lease.horizon, Nanos::from_millis(50));
    }
}
