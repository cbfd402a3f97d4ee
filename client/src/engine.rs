//! The whole client decision, sans IO: per-key reservations ([`crate::lease`]), the circuit
//! breaker ([`crate::breaker`]), the failure policy ([`crate::policy`]), shadow mode and the
//! metrics, over a map of keys. `now` is virtual time in ns, passed in; nothing here reads a
//! clock, sleeps or does IO. The tokio driver ([`crate::Limiter`]) and the simulator drive it
//! the same way:
//!
//! ```text
//! match engine.check(now, &key, cost) {
//!     Step::Done { outcome, refill } => { answer outcome; if let Some(c) = refill { send c in the background } }
//!     Step::Send(c) => { send c; then on_reply(now, &key, &c, &decision) or on_error(now, &key, &c) }
//!     Step::Wait { claim } => { wait for that claim's reply or error; then resume(now, &key, cost, claim) }
//! }
//! tick(now) periodically → RL.RETURN requests; drain(now) at shutdown → RL.RETURN requests.
//! ```
//!
//! `on_reply` / `on_error` / `resume` answer a [`Step`] again (a request can need a second step).
//! A claim "sent" is `<algorithm command> key limit period [BURST b] COST units [PARTIAL]`.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use crate::breaker::{Breaker, BreakerConfig, Permit};
use crate::decision::Decision;
use crate::lease::{ClaimRequest, KeyState, LeaseConfig, LimitedBy, ReturnRequest, Verdict};
use crate::metrics::{add, Metrics, MetricsSnapshot};
use crate::policy::{FailurePolicy, LocalBucket};

/// Everything that decides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineConfig {
    pub lease: LeaseConfig,
    pub breaker: BreakerConfig,
    pub policy: FailurePolicy,
    /// Shadow mode: decide and count as if enforced, but always let the caller through.
    pub shadow: bool,
}

/// Where a decision came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// Units held locally (no Redis call), or a local certainty (cost above capacity).
    Local,
    /// A claim sent for this request (one round trip).
    Redis,
    /// The over-limit cache (no Redis call).
    Cache,
    /// Redis unavailable: the local fallback limit decided.
    Fallback,
    /// Redis unavailable: fail-open admitted.
    FailOpen,
    /// Redis unavailable: fail-closed refused.
    FailClosed,
}

/// The answer to one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Let the request through (always true in shadow mode).
    pub allowed: bool,
    /// The decision as enforced (differs from `allowed` only in shadow mode).
    pub enforced: bool,
    pub source: Source,
    /// When refused: when to retry (never early); `None` when it never passes or is unknown.
    pub retry_after_ns: Option<u64>,
    /// RL.LEAKY: how long an admitted request waits (Redis admits only).
    pub delay_ns: Option<u64>,
    /// For headers, as best known: the capacity, units still admissible overall (server's last
    /// `remaining` plus units held here), time until fresh.
    pub limit: Option<u64>,
    pub remaining: Option<u64>,
    pub reset_after_ns: Option<u64>,
}

impl Outcome {
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_ns.map(Duration::from_nanos)
    }
    pub fn delay(&self) -> Option<Duration> {
        self.delay_ns.map(Duration::from_nanos)
    }
    /// `RateLimit-*` (what is known) and, when refused, `Retry-After` (docs/http-headers.md).
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let retry = if self.allowed { None } else { self.retry_after() };
        crate::decision::headers(self.limit, self.remaining, self.reset_after_ns.map(Duration::from_nanos), retry)
    }
}

/// What the caller of [`Engine`] does next for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Decided. Send `refill` (a background claim) if present; report it with `on_reply` /
    /// `on_error` like any claim.
    Done { outcome: Outcome, refill: Option<ClaimRequest> },
    /// Send this claim; the request waits for it.
    Send(ClaimRequest),
    /// Wait for the reply (or error) of this claim of the same key, then `resume`.
    Wait { claim: u64 },
}

/// State shared by all shards of one limiter: config, breaker, metrics.
#[derive(Debug)]
pub struct Shared {
    pub config: EngineConfig,
    pub breaker: Breaker,
    pub metrics: Metrics,
}

impl Shared {
    pub fn new(config: EngineConfig) -> Arc<Shared> {
        Arc::new(Shared { config, breaker: Breaker::new(config.breaker), metrics: Metrics::default() })
    }
}

#[derive(Clone, Debug, Default)]
struct Entry {
    state: KeyState,
    fallback: LocalBucket,
}

/// Keys and their reservations; one per shard in the driver, one per instance in the simulator.
#[derive(Debug)]
pub struct Engine<K> {
    shared: Arc<Shared>,
    keys: HashMap<K, Entry>,
}

impl<K: Hash + Eq + Clone> Engine<K> {
    pub fn new(config: EngineConfig) -> Engine<K> {
        Engine::with_shared(Shared::new(config))
    }

    pub fn with_shared(shared: Arc<Shared>) -> Engine<K> {
        Engine { shared, keys: HashMap::new() }
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// A key's state (tests and the simulator).
    pub fn key(&self, key: &K) -> Option<&KeyState> {
        self.keys.get(key).map(|e| &e.state)
    }

    pub fn keys(&self) -> impl Iterator<Item = (&K, &KeyState)> {
        self.keys.iter().map(|(k, e)| (k, &e.state))
    }

    /// A new request for `cost` units of `key`.
    pub fn check(&mut self, now: u64, key: &K, cost: u64) -> Step {
        add(&self.shared.metrics.requests, 1);
        let (lease, m) = (&self.shared.config.lease, &self.shared.metrics);
        let entry = self.keys.entry(key.clone()).or_default();
        let v = entry.state.on_request(now, cost, lease, m);
        self.step(now, key, cost, v)
    }

    /// The request waited for claim `claim` (woken by its reply or error, or gave up waiting).
    pub fn resume(&mut self, now: u64, key: &K, cost: u64, claim: u64) -> Step {
        let (lease, m) = (&self.shared.config.lease, &self.shared.metrics);
        let entry = self.keys.entry(key.clone()).or_default();
        let v = entry.state.resume(now, cost, Some(claim), lease, m);
        self.step(now, key, cost, v)
    }

    /// The reply to a claim of `key`. `Some(step)` for the request that sent it (`cost` is its
    /// cost), `None` for a background claim.
    pub fn on_reply(&mut self, now: u64, key: &K, claim: &ClaimRequest, cost: u64, d: &Decision) -> Option<Step> {
        self.shared.breaker.on_success();
        let (lease, m) = (&self.shared.config.lease, &self.shared.metrics);
        let entry = self.keys.entry(key.clone()).or_default();
        let v = entry.state.on_claim_reply(now, claim, d, lease, m)?;
        let v = match v {
            Verdict::Retry => entry.state.resume(now, cost, None, lease, m),
            v => v,
        };
        Some(self.step(now, key, cost, v))
    }

    /// A claim of `key` failed or timed out. `Some(step)` for the request that sent it.
    pub fn on_error(&mut self, now: u64, key: &K, claim: &ClaimRequest, cost: u64) -> Option<Step> {
        add(&self.shared.metrics.redis_errors, 1);
        if self.shared.breaker.on_failure(now) {
            add(&self.shared.metrics.breaker_opens, 1);
        }
        let state = &mut self.keys.get_mut(key)?.state;
        state.expire(now, &self.shared.metrics);
        let v = state.on_claim_error(claim)?;
        Some(self.step(now, key, cost, v))
    }

    /// A claim of `key` was answered with an error reply (Redis is up, but refused the command:
    /// a wrong type, the module missing, an ACL): the request falls back to the failure policy
    /// like on an outage, but the breaker counts it as an answer. `Some(step)` for the request
    /// that sent it.
    pub fn on_server_error(&mut self, now: u64, key: &K, claim: &ClaimRequest, cost: u64) -> Option<Step> {
        add(&self.shared.metrics.redis_errors, 1);
        self.shared.breaker.on_success();
        let state = &mut self.keys.get_mut(key)?.state;
        state.expire(now, &self.shared.metrics);
        let v = state.on_claim_error(claim)?;
        Some(self.step(now, key, cost, v))
    }

    /// Redis could not decide this request in time (a waiter gave up on a claim still in
    /// flight): the failure policy decides.
    pub fn unavailable(&mut self, now: u64, key: &K, cost: u64) -> Step {
        self.keys.entry(key.clone()).or_default();
        let o = self.fallback(now, key, cost, self.shared.config.breaker.cool_down_ns);
        Step::Done { outcome: self.shadow(o), refill: None }
    }

    /// A claim was abandoned without a result (its future was dropped): like an error for the
    /// key (waiters fall back), but says nothing about Redis.
    pub fn on_abandon(&mut self, now: u64, key: &K, claim: &ClaimRequest) {
        self.shared.breaker.on_abandon(now);
        if let Some(e) = self.keys.get_mut(key) {
            let _ = e.state.on_claim_error(claim);
        }
    }

    fn step(&mut self, now: u64, key: &K, cost: u64, v: Verdict) -> Step {
        let (outcome, refill) = match v {
            Verdict::Admit { from_claim, refill, delay_ns } => {
                let source = if from_claim { Source::Redis } else { Source::Local };
                (self.known(now, key, true, source, None, delay_ns), refill)
            }
            Verdict::Limited { retry_after_ns, by, refill } => {
                let source = match by {
                    LimitedBy::Cache => Source::Cache,
                    LimitedBy::Never => Source::Local,
                    LimitedBy::Redis => Source::Redis,
                };
                (self.known(now, key, false, source, retry_after_ns, None), refill)
            }
            Verdict::Wait { claim } => return Step::Wait { claim },
            Verdict::Claim(c) => match self.shared.breaker.permit(now) {
                Permit::Reject { retry_in_ns } => {
                    self.cancel(key, &c);
                    (self.fallback(now, key, cost, retry_in_ns), None)
                }
                _ => return Step::Send(c),
            },
            Verdict::Failed => (self.fallback(now, key, cost, self.shared.config.breaker.cool_down_ns), None),
            Verdict::Retry => unreachable!("Retry is resolved by on_reply"),
        };
        // A background refill only when Redis may be called (it may be the half-open probe).
        let refill = match refill {
            Some(c) if !self.shared.breaker.permit(now).allows_call() => {
                self.cancel(key, &c);
                None
            }
            r => r,
        };
        Step::Done { outcome: self.shadow(outcome), refill }
    }

    fn cancel(&mut self, key: &K, c: &ClaimRequest) {
        if let Some(e) = self.keys.get_mut(key) {
            e.state.cancel_claim(c.id, &self.shared.metrics);
        }
    }

    fn known(
        &self,
        now: u64,
        key: &K,
        allowed: bool,
        source: Source,
        retry_after_ns: Option<u64>,
        delay_ns: Option<u64>,
    ) -> Outcome {
        let st = self.keys.get(key).map(|e| &e.state);
        Outcome {
            allowed,
            enforced: allowed,
            source,
            retry_after_ns,
            delay_ns,
            limit: st.and_then(|s| s.capacity()),
            remaining: st.and_then(|s| s.remaining_estimate(now)),
            reset_after_ns: st.and_then(|s| s.reset_after(now)),
        }
    }

    /// Redis cannot decide this request: the failure policy does.
    fn fallback(&mut self, now: u64, key: &K, cost: u64, retry_in_ns: u64) -> Outcome {
        let m = &self.shared.metrics;
        let entry = self.keys.entry(key.clone()).or_default();
        let out = |allowed, source, retry_after_ns| Outcome {
            allowed,
            enforced: allowed,
            source,
            retry_after_ns,
            delay_ns: None,
            limit: None,
            remaining: None,
            reset_after_ns: None,
        };
        match self.shared.config.policy {
            FailurePolicy::FailClosed => {
                add(&m.fail_closed_denials, 1);
                out(false, Source::FailClosed, Some(retry_in_ns.max(1)))
            }
            FailurePolicy::FailOpen => {
                add(&m.fail_open_admits, 1);
                out(true, Source::FailOpen, None)
            }
            FailurePolicy::LocalFallback { limit, period_ns, burst } => {
                match entry.fallback.check(now, cost, limit, period_ns, burst) {
                    Ok(()) => {
                        add(&m.fallback_admits, 1);
                        out(true, Source::Fallback, None)
                    }
                    Err(retry) => {
                        add(&m.fallback_denials, 1);
                        out(false, Source::Fallback, retry)
                    }
                }
            }
        }
    }

    fn shadow(&self, mut o: Outcome) -> Outcome {
        if self.shared.config.shadow && !o.allowed {
            add(&self.shared.metrics.shadow_would_blocks, 1);
            o.allowed = true;
        }
        o
    }

    /// Housekeeping: expire leases, give back the units of idle keys (returns to send), and
    /// forget keys with nothing left (idle for 2 L).
    pub fn tick(&mut self, now: u64) -> Vec<(K, ReturnRequest)> {
        let (lease, m) = (&self.shared.config.lease, &self.shared.metrics);
        let may_call = !self.shared.breaker.is_open();
        let mut out = Vec::new();
        let forget_after = lease.lease_ns.saturating_mul(2).max(lease.idle_return_ns);
        self.keys.retain(|k, e| {
            out.extend(e.state.tick(now, lease, may_call, m).into_iter().map(|r| (k.clone(), r)));
            !e.state.is_forgettable(now, forget_after)
        });
        out
    }

    /// Shutdown: every held unit to give back.
    pub fn drain(&mut self, now: u64) -> Vec<(K, ReturnRequest)> {
        let (lease, m) = (&self.shared.config.lease, &self.shared.metrics);
        let mut out = Vec::new();
        for (k, e) in self.keys.iter_mut() {
            out.extend(e.state.drain(now, lease, m).into_iter().map(|r| (k.clone(), r)));
        }
        out
    }

    /// A return's reply: `credited` units (what RL.RETURN answered).
    pub fn on_return_reply(&self, credited: u64) {
        self.shared.breaker.on_success();
        add(&self.shared.metrics.units_credited, credited);
    }

    /// A return failed (the units stay consumed at the server: the safe direction).
    pub fn on_return_error(&self, now: u64) {
        add(&self.shared.metrics.redis_errors, 1);
        if self.shared.breaker.on_failure(now) {
            add(&self.shared.metrics.breaker_opens, 1);
        }
    }
}
