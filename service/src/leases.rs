//! Leases: descriptors served from local reservations with the client crate's engine (its
//! tokio driver, [`Limiter`]): each instance claims batches (`COST b PARTIAL`), serves them
//! locally, gives back what it did not use (`RL.RETURN … AGE`), and lets what it holds expire
//! after at most the lease `L`, so N instances together admit at most `c + r·(W + L)` in any
//! window of length `W` (docs/local-reservations.md), while Redis sees a claim per batch. A
//! cold key costs what a per-request check costs (the engine's call credit).
//!
//! One [`Limiter`] per rule (its limit, shadow mode and failure policy), made on first use and
//! kept across reloads while the rule is unchanged; keys are the same Redis keys as per-request
//! checks use, so switching a rule between leases and per-request checking keeps its state.
//! Leasable: fixed, sliding, gcra, token_bucket (the sliding log and the leaky bucket are
//! checked per request: exact by design, and every admitted leaky request needs its own delay).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use redis_ratelimit_client::spec::{Algorithm, Limit};
use redis_ratelimit_client::{FailurePolicy, Limiter, LimiterConfig, Reconnecting};

use crate::config::FailureMode;

/// The connection the limiters share: one server (reconnecting) or a cluster.
#[derive(Clone)]
pub enum LeaseConn {
    Single(Reconnecting),
    Cluster(ClusterConnection),
}

impl ConnectionLike for LeaseConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            LeaseConn::Single(c) => c.req_packed_command(cmd),
            LeaseConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            LeaseConn::Single(c) => c.req_packed_commands(cmd, offset, count),
            LeaseConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            LeaseConn::Single(c) => c.get_db(),
            LeaseConn::Cluster(c) => c.get_db(),
        }
    }
}

/// Lease settings.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// Serve leasable rules from leases unless a rule says `lease: false`.
    pub default_on: bool,
    /// `L`.
    pub lease: Duration,
    pub instances: u64,
    pub timeout: Duration,
    pub breaker_failures: u32,
    pub breaker_cool_down: Duration,
}

pub fn leasable(a: Algorithm) -> bool {
    matches!(a, Algorithm::Fixed | Algorithm::Sliding | Algorithm::Gcra | Algorithm::TokenBucket)
}

pub type RuleLimiter = Arc<Limiter<LeaseConn>>;

/// The limiters, by rule.
pub struct Leases {
    pub settings: LeaseSettings,
    conn: LeaseConn,
    limiters: Mutex<HashMap<String, RuleLimiter>>,
}

impl Leases {
    pub fn new(settings: LeaseSettings, conn: LeaseConn) -> Leases {
        Leases { settings, conn, limiters: Mutex::new(HashMap::new()) }
    }

    /// The limiter of a rule (made on first use; needs a tokio runtime).
    pub fn limiter(&self, rule_id: &str, limit: Limit, shadow: bool, mode: FailureMode) -> RuleLimiter {
        let id = format!("{rule_id}|{limit:?}|{shadow}|{mode:?}");
        let mut map = self.limiters.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = map.get(&id) {
            return l.clone();
        }
        let policy = match mode {
            // `error`: the limiter refuses; the service answers UNAVAILABLE (Outcome::unavailable).
            FailureMode::Error | FailureMode::Closed => FailurePolicy::FailClosed,
            FailureMode::Open => FailurePolicy::FailOpen,
            FailureMode::Local => FailurePolicy::LocalShare,
        };
        let s = &self.settings;
        let cfg = LimiterConfig::new(limit)
            .lease(s.lease)
            .instances(s.instances)
            .timeout(s.timeout)
            .breaker(s.breaker_failures, s.breaker_cool_down)
            .policy(policy)
            .shadow(shadow);
        let l = Arc::new(Limiter::new(self.conn.clone(), cfg));
        map.insert(id, l.clone());
        l
    }

    /// Redis calls and units of every limiter, summed (for /metrics).
    pub fn totals(&self) -> Vec<(String, u64)> {
        let map = self.limiters.lock().unwrap_or_else(|e| e.into_inner());
        let mut sums: HashMap<&'static str, u64> = HashMap::new();
        for l in map.values() {
            for (k, v) in l.metrics().fields() {
                *sums.entry(k).or_default() += v;
            }
        }
        let mut v: Vec<(String, u64)> = sums.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        v.sort();
        v
    }

    /// Gives every held unit back (at shutdown).
    pub async fn shutdown(&self) {
        let all: Vec<RuleLimiter> = self.limiters.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        for l in all {
            l.shutdown().await;
        }
    }
}
