//! What a service exports: monotonic counters and gauges, atomic, shared by every shard and
//! task of a limiter, read with [`Metrics::snapshot`] and rendered for Prometheus with
//! [`MetricsSnapshot::prometheus`].

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! metrics {
    (counters { $($(#[$cdoc:meta])* $c:ident),* $(,)? }
     gauges { $($(#[$gdoc:meta])* $g:ident),* $(,)? }
     derived { $($(#[$ddoc:meta])* $d:ident),* $(,)? }) => {
        /// Live counters and gauges (relaxed atomics), one set per engine (shard); aligned so
        /// that two shards' sets never share a cache line.
        #[derive(Debug, Default)]
        #[repr(align(128))]
        pub struct Metrics {
            $($(#[$cdoc])* pub $c: AtomicU64,)*
            $($(#[$gdoc])* pub $g: AtomicU64,)*
        }

        /// A copy of the metrics at one instant.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct MetricsSnapshot {
            $($(#[$cdoc])* pub $c: u64,)*
            $($(#[$gdoc])* pub $g: u64,)*
            $($(#[$ddoc])* pub $d: u64,)*
        }

        impl Metrics {
            /// The counters and the engine's gauges; the derived gauges are filled by
            /// [`MetricsSnapshot::derive`] (the driver adds `breaker_state`).
            pub fn snapshot(&self) -> MetricsSnapshot {
                let mut s = MetricsSnapshot::default();
                self.accumulate(&mut s);
                s.derive();
                s
            }

            /// Adds these counters and gauges to `s` (a sum over shards; derived gauges
            /// untouched).
            pub fn accumulate(&self, s: &mut MetricsSnapshot) {
                $(s.$c = s.$c.wrapping_add(self.$c.load(Relaxed));)*
                $(s.$g = s.$g.wrapping_add(self.$g.load(Relaxed));)*
            }
        }

        impl MetricsSnapshot {
            /// `(name, value)` pairs, for exporters: counters, then gauges.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($c), self.$c),)* $((stringify!($g), self.$g),)* $((stringify!($d), self.$d),)*]
            }

            /// Names of the counters (monotonic: exported as `…_total`).
            pub const COUNTERS: &'static [&'static str] = &[$(stringify!($c),)*];
            /// Names of the gauges.
            pub const GAUGES: &'static [&'static str] = &[$(stringify!($g),)* $(stringify!($d),)*];
        }
    };
}

metrics! {
    counters {
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
        /// Claims for the first request of a key not remembered (exact, decided by the reply
        /// alone, nothing kept: `LimiterConfig::sightings`).
        one_off_claims,
        /// Claims given up as lost by the engine (no reply nor error for `stale_claim`).
        claims_given_up,
        /// Units granted by claims.
        units_claimed,
        /// Units served to requests (local and Redis admits).
        units_served,
        /// Units put back by refunds (a multi-limit check refused by another limit, or
        /// `Limiter::refund`): served and then un-served (`units_served − units_refunded` is
        /// what callers were admitted). Those too late to serve again (their lease over, or
        /// their key forgotten) count as expired too.
        units_refunded,
        /// Units given back with RL.RETURN (idle keys, shutdown, forgotten keys).
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
        /// Keys forgotten (idle for 2 L with nothing held, or evicted by the `max_keys` cap).
        keys_forgotten,
        /// Keys evicted by the `max_keys` cap before they were idle.
        keys_evicted,
    }
    gauges {
        /// Keys remembered now (every shard).
        keys,
        /// Claims in flight now.
        claims_in_flight,
    }
    derived {
        /// Units held now: `units_claimed − units_served + units_refunded − units_returned −
        /// units_expired`.
        units_held,
        /// The circuit breaker: 0 closed, 1 open, 2 half-open (set by the limiter's snapshot).
        breaker_state,
    }
}

impl MetricsSnapshot {
    /// Fills the derived gauges from the counters.
    pub fn derive(&mut self) {
        self.units_held = (self.units_claimed + self.units_refunded)
            .saturating_sub(self.units_served + self.units_returned + self.units_expired);
    }

    /// The Prometheus text format (version 0.0.4): each counter as
    /// `redis_ratelimit_client_<name>_total{limiter="<limiter>"}`, each gauge as
    /// `redis_ratelimit_client_<name>{limiter="<limiter>"}`, with `# TYPE` lines. Several
    /// limiters' outputs concatenate into one valid exposition only when each family appears
    /// once: render them with [`MetricsSnapshot::prometheus_all`].
    pub fn prometheus(&self, limiter: &str) -> String {
        MetricsSnapshot::prometheus_all(&[(limiter, *self)])
    }

    /// Several limiters in one exposition, one family per metric and one sample per limiter.
    pub fn prometheus_all(limiters: &[(&str, MetricsSnapshot)]) -> String {
        let mut out = String::new();
        let fields: Vec<Vec<(&str, u64)>> = limiters.iter().map(|(_, s)| s.fields()).collect();
        let Some(first) = fields.first() else { return out };
        for (i, (name, _)) in first.iter().enumerate() {
            let counter = MetricsSnapshot::COUNTERS.contains(name);
            let family = if counter {
                format!("redis_ratelimit_client_{name}_total")
            } else {
                format!("redis_ratelimit_client_{name}")
            };
            let _ = writeln!(out, "# TYPE {family} {}", if counter { "counter" } else { "gauge" });
            for ((limiter, _), f) in limiters.iter().zip(&fields) {
                let _ = writeln!(out, "{family}{{limiter=\"{}\"}} {}", escape(limiter), f[i].1);
            }
        }
        out
    }
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `m.field += n` on an engine's own metrics: only the holder of the engine (`&mut`, under its
/// shard's lock) writes them, so a plain load and store (no locked instruction) is exact;
/// readers see each value whole (atomics) and at most one update late.
#[inline]
pub(crate) fn add(c: &AtomicU64, n: u64) {
    if n > 0 {
        c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
    }
}

/// `m.field -= n` (gauges, and a claim cancelled before it was sent), as [`add`].
#[inline]
pub(crate) fn sub(c: &AtomicU64, n: u64) {
    if n > 0 {
        c.store(c.load(Relaxed).wrapping_sub(n), Relaxed);
    }
}

/// `m.field += n` on metrics several threads write at once (a limiter's unsharded ones).
#[inline]
pub(crate) fn add_shared(c: &AtomicU64, n: u64) {
    if n > 0 {
        c.fetch_add(n, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_has_one_family_per_metric() {
        let m = Metrics::default();
        add(&m.requests, 3);
        add(&m.units_claimed, 10);
        add(&m.units_served, 4);
        add(&m.keys, 2);
        let s = m.snapshot();
        assert_eq!(s.units_held, 6);
        let text = MetricsSnapshot::prometheus_all(&[("api\"key", s), ("ip", MetricsSnapshot::default())]);
        assert!(text.contains("# TYPE redis_ratelimit_client_requests_total counter\n"));
        assert!(text.contains("redis_ratelimit_client_requests_total{limiter=\"api\\\"key\"} 3\n"));
        assert!(text.contains("redis_ratelimit_client_requests_total{limiter=\"ip\"} 0\n"));
        assert!(text.contains("# TYPE redis_ratelimit_client_units_held gauge\nredis_ratelimit_client_units_held{limiter=\"api\\\"key\"} 6\n"));
        assert_eq!(text.matches("# TYPE").count(), s.fields().len());
    }
}
