//! Leases: descriptors served from local reservations with the client crate's engine (its
//! tokio driver, [`Limiter`]): each instance claims batches (`COST b PARTIAL`), serves them
//! locally, gives back what it did not use (`RL.RETURN … AGE`), and lets what it holds expire
//! after at most the lease `L`, so N instances together admit at most `c + r·(W + L)` in any
//! window of length `W` (docs/local-reservations.md), while Redis sees a claim per batch. A
//! cold key costs what a per-request check costs (the engine's call credit).
//!
//! Only **hot** values lease ([`Heat`]): a value of a leased rule is decided per request (with
//! the request's other per-request descriptors, in one `RL.MULTI`) until this instance has seen
//! it at least `LEASE_HOT_REQUESTS` times (20) within one `LEASE_HOT_WINDOW` (1 s), the rate
//! at which the engine's own sizing (a batch covers the demand of its 100 ms horizon, a refill
//! needs at least 2 units of it) starts to claim batches of 2 or more. It leases while each
//! window sees at least half that, and goes back to per-request checks when a window sees
//! less; what its limiter still holds is then given back by the engine's housekeeping (idle
//! return after L/2, `RL.RETURN … AGE`). Without this, every new value of a leased rule cost a
//! claim per descriptor (and a return later) instead of one command per request.
//!
//! One [`Limiter`] per rule (its limit, shadow mode and failure policy), made on first use and
//! kept across reloads while the rule is unchanged; keys are the same Redis keys as per-request
//! checks use, so switching a rule between leases and per-request checking keeps its state.
//! Leasable: what the algorithm's facts say (`Algorithm::leasable`; the sliding log and the
//! leaky bucket are checked per request: exact by design, and every admitted leaky request
//! needs its own delay).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis_ratelimit_client::spec::Limit;
use redis_ratelimit_client::{Connection, FailurePolicy, Limiter, LimiterConfig, Nanos};

use crate::config::FailureMode;

/// The connection the limiters share: the backend's (the connection layer).
pub type LeaseConn = Connection;

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
    /// A value leases once seen this many times within `hot_window` (1: from its first request).
    pub hot_requests: u32,
    pub hot_window: Duration,
}

impl LeaseSettings {
    /// A rule's limiter configuration.
    fn limiter_config(&self, limit: Limit, shadow: bool, policy: FailurePolicy) -> LimiterConfig {
        LimiterConfig::new(limit)
            .lease(self.lease)
            .instances(self.instances)
            .timeout(self.timeout)
            .breaker(self.breaker_failures, self.breaker_cool_down)
            .policy(policy)
            .shadow(shadow)
    }
}

pub type RuleLimiter = Arc<Limiter<LeaseConn>>;

/// One value's requests in its current window.
#[derive(Clone, Copy, Debug)]
struct Temp {
    /// The window's start (since the tracker's epoch): the first request after the last one
    /// ended.
    start: Nanos,
    /// Requests in the window.
    count: u32,
    hot: bool,
}

/// Entries per shard before stale ones are swept (64 shards: 262,144 values, about 8 MB).
const HEAT_SHARD_CAP: usize = 4096;
const HEAT_SHARDS: usize = 64;

/// Which values of leased rules are hot, per instance (see the module docs): a value becomes
/// hot at the `hot_requests`-th request within one window of `hot_window` (windows start at a
/// value's first request after the previous window ended), stays hot while every window sees
/// at least half as many (`hot_requests.div_ceil(2)`), and cools at the first request after a
/// window that saw fewer. Keyed by a hash of the Redis key (a collision only makes a cold value
/// lease: still within the bound). Memory is bounded: a full shard forgets the values not hot
/// whose window ended, then all values not hot, then everything (hot values, each at least
/// `hot_requests ÷ 2` requests per window, are bounded by the request rate).
pub struct Heat {
    requests: u32,
    window: Nanos,
    hasher: RandomState,
    shards: Box<[Mutex<HashMap<u64, Temp>>]>,
    epoch: Instant,
    /// Checks of leased rules decided from leases (hot) and per request (not hot).
    pub hot_checks: AtomicU64,
    pub cold_checks: AtomicU64,
}

impl Heat {
    pub fn new(requests: u32, window: Duration) -> Heat {
        Heat {
            requests: requests.max(1),
            window: Nanos::from(window).max(Nanos::new(1)),
            hasher: RandomState::new(),
            shards: (0..HEAT_SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            epoch: Instant::now(),
            hot_checks: AtomicU64::new(0),
            cold_checks: AtomicU64::new(0),
        }
    }

    /// Counts a request on `key` and answers whether it leases.
    pub fn observe(&self, key: &str) -> bool {
        let hot = self.requests <= 1 || self.observe_at(key, Nanos::from(self.epoch.elapsed()));
        let c = if hot { &self.hot_checks } else { &self.cold_checks };
        c.fetch_add(1, Ordering::Relaxed);
        hot
    }

    fn observe_at(&self, key: &str, now: Nanos) -> bool {
        let h = self.hasher.hash_one(key);
        let mut shard = self.shards[(h >> 58) as usize % HEAT_SHARDS].lock().unwrap_or_else(|e| e.into_inner());
        if shard.len() >= HEAT_SHARD_CAP && !shard.contains_key(&h) {
            let w = self.window;
            shard.retain(|_, t| now - t.start < if t.hot { w * 2 } else { w });
            if shard.len() >= HEAT_SHARD_CAP {
                shard.retain(|_, t| t.hot);
            }
            if shard.len() >= HEAT_SHARD_CAP {
                shard.clear();
            }
        }
        let t = shard.entry(h).or_insert(Temp { start: now, count: 0, hot: false });
        let age = now - t.start;
        if age >= self.window {
            // The window ended: it kept the value hot if it saw at least half the threshold
            // (a window after it with no request saw none).
            let last = if age < self.window * 2 { t.count } else { 0 };
            if last < self.requests.div_ceil(2) {
                t.hot = false;
            }
            t.start = now;
            t.count = 0;
        }
        t.count = t.count.saturating_add(1);
        if t.count >= self.requests {
            t.hot = true;
        }
        t.hot
    }

    /// Values hot now (for /metrics).
    pub fn hot_values(&self) -> u64 {
        let now = Nanos::from(self.epoch.elapsed());
        let w = self.window;
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                s.values().filter(|t| t.hot && now - t.start < w * 2).count() as u64
            })
            .sum()
    }
}

/// The limiters, by rule.
pub struct Leases {
    pub settings: LeaseSettings,
    conn: LeaseConn,
    limiters: Mutex<HashMap<String, RuleLimiter>>,
    pub heat: Heat,
}

impl Leases {
    /// The leases of a service; an error names a lease setting the client's limiter refuses.
    pub fn new(settings: LeaseSettings, conn: LeaseConn) -> Result<Leases, String> {
        // The settings every rule's limiter takes, checked once here (any limit will do).
        let any = Limit::fixed(1, Duration::from_secs(1)).map_err(|e| e.to_string())?;
        settings.limiter_config(any, false, FailurePolicy::FailClosed).engine_config().map_err(|e| e.to_string())?;
        let heat = Heat::new(settings.hot_requests, settings.hot_window);
        Ok(Leases { settings, conn, limiters: Mutex::new(HashMap::new()), heat })
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
        let cfg = self.settings.limiter_config(limit, shadow, policy);
        let l = Arc::new(Limiter::new(self.conn.clone(), cfg).expect("lease settings checked by Leases::new"));
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
        v.push(("hot_values".into(), self.heat.hot_values()));
        v.push(("hot_checks".into(), self.heat.hot_checks.load(Ordering::Relaxed)));
        v.push(("cold_checks".into(), self.heat.cold_checks.load(Ordering::Relaxed)));
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn ns(raw: u64) -> Nanos {
        Nanos::new(raw as i64)
    }

    #[test]
    fn a_value_leases_at_the_threshold_within_a_window() {
        let h = Heat::new(4, Duration::from_millis(100));
        let seen: Vec<bool> = (0..5).map(|i| h.observe_at("k", ns(i * 10 * MS))).collect();
        assert_eq!(seen, [false, false, false, true, true]);
        // Another value is its own.
        assert!(!h.observe_at("other", ns(50 * MS)));
    }

    #[test]
    fn requests_spread_over_windows_never_lease() {
        let h = Heat::new(4, Duration::from_millis(100));
        // 3 per window, forever: below the threshold in every window.
        for i in 0..30u64 {
            assert!(!h.observe_at("k", ns(i * 34 * MS)), "request {i}");
        }
    }

    #[test]
    fn a_hot_value_stays_hot_at_half_the_rate_and_cools_below_it() {
        let h = Heat::new(4, Duration::from_millis(100));
        for i in 0..4 {
            h.observe_at("k", ns(i * MS));
        }
        // Two per window (half of 4): still hot, window after window.
        let mut t = 100 * MS;
        for _ in 0..5 {
            assert!(h.observe_at("k", ns(t)));
            assert!(h.observe_at("k", ns(t + 50 * MS)));
            t += 100 * MS;
        }
        // One request in a window: the next window's first request finds it cooled.
        assert!(h.observe_at("k", ns(t)));
        assert!(!h.observe_at("k", ns(t + 100 * MS)));
        // A gap of a whole window cools a hot value too.
        let h = Heat::new(2, Duration::from_millis(100));
        assert!(!h.observe_at("k", ns(0)));
        assert!(h.observe_at("k", ns(MS)));
        assert!(!h.observe_at("k", ns(250 * MS)));
    }

    #[test]
    fn a_threshold_of_one_leases_from_the_first_request() {
        let h = Heat::new(1, Duration::from_secs(1));
        assert!(h.observe("k"));
        assert_eq!(h.hot_checks.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn memory_is_bounded_and_hot_values_survive_a_flood_of_cold_ones() {
        let h = Heat::new(2, Duration::from_secs(1));
        h.observe_at("hot", ns(0));
        assert!(h.observe_at("hot", ns(MS)));
        for i in 0..(HEAT_SHARDS * HEAT_SHARD_CAP * 2) as u64 {
            h.observe_at(&format!("cold{i}"), ns(2 * MS));
        }
        let total: usize = h.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(total <= HEAT_SHARDS * HEAT_SHARD_CAP, "{total} entries");
        assert!(h.observe_at("hot", ns(3 * MS)), "the hot value is still known");
    }
}
