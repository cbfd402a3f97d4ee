//! What to do when Redis cannot answer (breaker open, timeout, connection refused), sans IO.
//!
//! A process starts with no units: nothing is admitted that was not claimed from Redis, except
//! under an explicit [`FailurePolicy::FailOpen`] or [`FailurePolicy::LocalFallback`].

/// The per-limiter failure policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Refuse every request Redis cannot decide (the default: a limit stays a limit).
    #[default]
    FailClosed,
    /// Admit every request Redis cannot decide (availability first; log it).
    FailOpen,
    /// Enforce a local limit per key while Redis is unavailable: `limit` units per `period_ns`
    /// with bursts of `burst` (a token bucket in this process). For N instances sharing a
    /// global limit, `limit ÷ N` keeps the total near the global one.
    LocalFallback { limit: u64, period_ns: u64, burst: u64 },
}

impl FailurePolicy {
    /// `limit` per `period` locally, bursts of `limit`.
    pub fn local(limit: u64, period: std::time::Duration) -> FailurePolicy {
        FailurePolicy::LocalFallback {
            limit: limit.max(1),
            period_ns: period.as_nanos().min(u64::MAX as u128) as u64,
            burst: limit.max(1),
        }
    }
}

/// A local token bucket as GCRA in integer nanoseconds (one instant per key): admits `cost`
/// units when the theoretical arrival time, pushed back by `cost` intervals, stays within
/// `burst` intervals of now. Exact for rates whose interval is a whole number of ns, else the
/// interval is rounded up (slightly stricter).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalBucket {
    tat: u64,
}

/// A local decision: `Ok(())` admitted, `Err(retry_after_ns)` refused (`None`: never).
pub type LocalVerdict = Result<(), Option<u64>>;

impl LocalBucket {
    pub fn check(&mut self, now: u64, cost: u64, limit: u64, period_ns: u64, burst: u64) -> LocalVerdict {
        let interval = period_ns.div_ceil(limit.max(1)).max(1);
        let burst = burst.max(1);
        if cost > burst {
            return Err(None);
        }
        let tat = self.tat.max(now);
        let new_tat = tat.saturating_add(interval.saturating_mul(cost));
        let allow_at = new_tat.saturating_sub(interval.saturating_mul(burst));
        if allow_at > now {
            return Err(Some(allow_at - now));
        }
        self.tat = new_tat;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_bucket_admits_burst_then_rate() {
        let mut b = LocalBucket::default();
        for _ in 0..3 {
            assert_eq!(b.check(0, 1, 1, 100, 3), Ok(()));
        }
        assert_eq!(b.check(0, 1, 1, 100, 3), Err(Some(100)));
        assert_eq!(b.check(100, 1, 1, 100, 3), Ok(()));
        assert_eq!(b.check(100, 4, 1, 100, 3), Err(None));
    }
}
