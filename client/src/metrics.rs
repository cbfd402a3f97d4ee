//! Counters a service can export: atomic, shared by every shard and task of a limiter, read
//! with [`Metrics::snapshot`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! metrics {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters (relaxed atomics; monotonic).
        #[derive(Debug, Default)]
        pub struct Metrics { $($(#[$doc])* pub $name: AtomicU64,)* }

        /// A copy of the counters at one instant.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct MetricsSnapshot { $($(#[$doc])* pub $name: u64,)* }

        impl Metrics {
            pub fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot { $($name: self.$name.load(Relaxed),)* }
            }
        }

        impl MetricsSnapshot {
            /// `(name, value)` pairs, for exporters.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }
        }
    };
}

metrics! {
    /// Requests checked (each `check`, whatever its outcome).
    requests,
    /// Requests admitted from units held locally, with no Redis call.
    local_admits,
    /// Requests admitted by the claim they waited for (a Redis round trip on the request's path).
    redis_admits,
    /// Requests refused by Redis (the claim made for them was denied).
    redis_denials,
    /// Calls sent to Redis (claims and returns).
    redis_calls,
    /// Claims sent (`COST n [PARTIAL]`), including background refills.
    claims,
    /// Claims sent in the background, before the local units ran out.
    background_claims,
    /// Units granted by claims.
    units_claimed,
    /// Units served to requests (local and Redis admits).
    units_served,
    /// Units given back with RL.RETURN (idle keys, shutdown).
    units_returned,
    /// Units the server reported credited by those returns.
    units_credited,
    /// Units dropped unused when their lease expired.
    units_expired,
    /// RL.RETURN calls sent.
    returns,
    /// Requests refused by the over-limit cache, with no Redis call.
    over_limit_cache_hits,
    /// Requests refused because their cost is above the limit's capacity (no Redis call).
    never_denials,
    /// Calls that failed or timed out.
    redis_errors,
    /// Times the circuit breaker opened.
    breaker_opens,
    /// Requests admitted by the local fallback limit while Redis was unavailable.
    fallback_admits,
    /// Requests refused by the local fallback limit while Redis was unavailable.
    fallback_denials,
    /// Requests admitted by the fail-open policy while Redis was unavailable.
    fail_open_admits,
    /// Requests refused by the fail-closed policy while Redis was unavailable.
    fail_closed_denials,
    /// Shadow mode: requests that would have been refused (and were let through).
    shadow_would_blocks,
}

/// `m.field += n`.
pub(crate) fn add(c: &AtomicU64, n: u64) {
    if n > 0 {
        c.fetch_add(n, Relaxed);
    }
}
