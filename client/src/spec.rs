//! What a limiter is: the algorithm and its parameters, as the module's commands take them.
//! Pure data, shared by the typed calls ([`crate::commands`]) and the lease logic.

use std::time::Duration;

/// The module's limiter algorithms (one `RL.*` command each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// `RL.GCRA`: sustained rate with bursts.
    Gcra,
    /// `RL.TOKENBUCKET`: same answers as GCRA.
    TokenBucket,
    /// `RL.LEAKY`: leaky bucket as a queue (replies carry `delay`).
    Leaky,
    /// `RL.SLIDING`: sliding window counter.
    Sliding,
    /// `RL.FIXED`: fixed (calendar) window.
    Fixed,
    /// `RL.SLIDINGLOG`: exact sliding log.
    SlidingLog,
}

impl Algorithm {
    /// The command name (`RL.GCRA`, …).
    pub fn command(self) -> &'static str {
        match self {
            Algorithm::Gcra => "RL.GCRA",
            Algorithm::TokenBucket => "RL.TOKENBUCKET",
            Algorithm::Leaky => "RL.LEAKY",
            Algorithm::Sliding => "RL.SLIDING",
            Algorithm::Fixed => "RL.FIXED",
            Algorithm::SlidingLog => "RL.SLIDINGLOG",
        }
    }

    /// The algorithm name inside `RL.MULTI` (`GCRA`, `TOKENBUCKET`, …).
    pub fn multi_name(self) -> &'static str {
        &self.command()[3..]
    }

    /// GCRA, token bucket and leaky bucket take `BURST`; the windows do not.
    pub fn is_bucket(self) -> bool {
        matches!(self, Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::Leaky)
    }

    /// Whether `RL.RETURN` can give units back (the sliding log refuses it).
    pub fn supports_return(self) -> bool {
        self != Algorithm::SlidingLog
    }
}

/// One limit: `limit` units per `period` (the window for window algorithms), with an optional
/// `BURST` for the buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period: Duration,
    /// `BURST n` (buckets only; ignored by window algorithms). `None`: the module's default (`limit`).
    pub burst: Option<u64>,
}

impl Limit {
    pub fn new(algorithm: Algorithm, limit: u64, period: Duration) -> Limit {
        Limit { algorithm, limit, period, burst: None }
    }
    pub fn gcra(limit: u64, period: Duration) -> Limit {
        Limit::new(Algorithm::Gcra, limit, period)
    }
    pub fn token_bucket(limit: u64, period: Duration) -> Limit {
        Limit::new(Algorithm::TokenBucket, limit, period)
    }
    pub fn leaky(limit: u64, period: Duration) -> Limit {
        Limit::new(Algorithm::Leaky, limit, period)
    }
    pub fn sliding(limit: u64, window: Duration) -> Limit {
        Limit::new(Algorithm::Sliding, limit, window)
    }
    pub fn fixed(limit: u64, window: Duration) -> Limit {
        Limit::new(Algorithm::Fixed, limit, window)
    }
    pub fn sliding_log(limit: u64, window: Duration) -> Limit {
        Limit::new(Algorithm::SlidingLog, limit, window)
    }
    /// Sets `BURST` (buckets only).
    pub fn with_burst(mut self, burst: u64) -> Limit {
        self.burst = Some(burst);
        self
    }

    /// The capacity the server reports as `limit`: BURST (default `limit`) for the buckets,
    /// `limit` for the windows. A request of more units can never pass.
    pub fn capacity(&self) -> u64 {
        if self.algorithm.is_bucket() {
            self.burst.unwrap_or(self.limit)
        } else {
            self.limit
        }
    }

    /// The period as the module parses it: whole milliseconds when exact, else microseconds.
    pub fn period_arg(&self) -> String {
        duration_arg(self.period)
    }

    /// The positional and BURST arguments after the key: `limit period [BURST n]`.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![self.limit.to_string(), self.period_arg()];
        if let (true, Some(b)) = (self.algorithm.is_bucket(), self.burst) {
            a.push("BURST".into());
            a.push(b.to_string());
        }
        a
    }
}

/// A duration as a module argument (`250ms`, `1500us`); at least `1us`.
pub fn duration_arg(d: Duration) -> String {
    let us = d.as_micros().max(1);
    if us.is_multiple_of(1000) {
        format!("{}ms", us / 1000)
    } else {
        format!("{us}us")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_and_capacity() {
        let l = Limit::gcra(10, Duration::from_secs(1)).with_burst(20);
        assert_eq!(l.args(), ["10", "1000ms", "BURST", "20"]);
        assert_eq!(l.capacity(), 20);
        let s = Limit::sliding(100, Duration::from_micros(1500)).with_burst(7);
        assert_eq!(s.args(), ["100", "1500us"]);
        assert_eq!(s.capacity(), 100);
        assert_eq!(Algorithm::SlidingLog.multi_name(), "SLIDINGLOG");
    }
}
