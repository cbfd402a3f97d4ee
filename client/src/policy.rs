//! What to do when Redis cannot answer (breaker open, timeout, connection refused), sans IO.
//!
//! A process starts with no units: nothing is admitted that was not claimed from Redis, except
//! under an explicit [`FailurePolicy::FailOpen`], [`FailurePolicy::LocalFallback`] or
//! [`FailurePolicy::LocalShare`].

use crate::spec::Limit;
use redis_ratelimit_core::Nanos;

/// The per-limiter failure policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Refuse every request Redis cannot decide (the default: a limit stays a limit).
    #[default]
    FailClosed,
    /// Admit every request Redis cannot decide (availability first; log it).
    FailOpen,
    /// Enforce a local limit per key while Redis is unavailable: `limit` units per `period`
    /// with bursts of `burst` (a token bucket in this process).
    LocalFallback { limit: u64, period: Nanos, burst: u64 },
    /// This instance's share of the limiter's own limit while Redis is unavailable: the global
    /// rate ÷ `instances` with a burst of the global capacity ÷ `instances` (at least 1 each).
    /// Resolved by the limiter's configuration ([`FailurePolicy::resolve`]).
    LocalShare,
}

impl FailurePolicy {
    /// `limit` per `period` locally, bursts of `burst` (a token bucket per key in this process).
    pub fn local(limit: u64, period: std::time::Duration, burst: u64) -> FailurePolicy {
        FailurePolicy::LocalFallback { limit: limit.max(1), period: period.into(), burst: burst.max(1) }
    }

    /// One instance's share of `limit` among `instances`: rate ÷ N, capacity ÷ N, each rounded
    /// up to at least 1 (so that N instances together allow about the global limit, bursts
    /// included).
    pub fn share_of(limit: &Limit, instances: u64) -> FailurePolicy {
        let n = instances.max(1);
        FailurePolicy::LocalFallback {
            limit: (limit.limit() / n).max(1),
            period: limit.period_nanos(),
            burst: (limit.capacity() / n).max(1),
        }
    }

    /// [`FailurePolicy::LocalShare`] made concrete for `limit` and `instances`; other policies
    /// unchanged.
    pub fn resolve(self, limit: &Limit, instances: u64) -> FailurePolicy {
        match self {
            FailurePolicy::LocalShare => FailurePolicy::share_of(limit, instances),
            p => p,
        }
    }
}

/// A local token bucket as GCRA in integer nanoseconds (one instant per key): admits `cost`
/// units when the theoretical arrival time, pushed back by `cost` intervals, stays within
/// `burst` intervals of now. Exact for rates whose interval is a whole number of ns, else the
/// interval is rounded up (slightly stricter).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalBucket {
    tat: Nanos,
}

/// A local decision: `Ok(())` admitted, `Err(retry_after)` refused (`None`: never).
pub type LocalVerdict = Result<(), Option<Nanos>>;

fn interval(limit: u64, period: Nanos) -> Nanos {
    Nanos::new(period.as_u64().div_ceil(limit.max(1)).max(1) as i64)
}

impl LocalBucket {
    pub fn check(&mut self, now: Nanos, cost: u64, limit: u64, period: Nanos, burst: u64) -> LocalVerdict {
        let interval = interval(limit, period);
        let burst = burst.max(1);
        if cost > burst {
            return Err(None);
        }
        let tat = self.tat.max(now);
        let new_tat = tat + interval * cost;
        let allow_at = new_tat - interval * burst;
        if allow_at > now {
            return Err(Some(allow_at - now));
        }
        self.tat = new_tat;
        Ok(())
    }

    /// Gives back `cost` units this bucket admitted (a request refused by another limit).
    pub fn refund(&mut self, cost: u64, limit: u64, period: Nanos) {
        self.tat = self.tat - interval(limit, period) * cost;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn local_bucket_admits_burst_then_rate() {
        let (p, n) = (Nanos::new(100), Nanos::new);
        let mut b = LocalBucket::default();
        for _ in 0..3 {
            assert_eq!(b.check(n(0), 1, 1, p, 3), Ok(()));
        }
        assert_eq!(b.check(n(0), 1, 1, p, 3), Err(Some(n(100))));
        assert_eq!(b.check(n(100), 1, 1, p, 3), Ok(()));
        assert_eq!(b.check(n(100), 4, 1, p, 3), Err(None));
        b.refund(1, 1, p);
        assert_eq!(b.check(n(100), 1, 1, p, 3), Ok(()));
    }

    #[test]
    fn a_share_divides_rate_and_burst() {
        // Issue 19: 1000/min with bursts of 150 over 8 instances: 125/min, bursts of 18 each.
        let l = Limit::token_bucket(1000, Duration::from_secs(60)).unwrap().with_burst(150).unwrap();
        assert_eq!(
            FailurePolicy::LocalShare.resolve(&l, 8),
            FailurePolicy::LocalFallback { limit: 125, period: Nanos::from_secs(60), burst: 18 }
        );
        assert_eq!(
            FailurePolicy::local(5, Duration::from_secs(1), 2),
            FailurePolicy::LocalFallback { limit: 5, period: Nanos::from_secs(1), burst: 2 }
        );
        assert_eq!(FailurePolicy::FailOpen.resolve(&l, 8), FailurePolicy::FailOpen);
    }
}
