//! What a limiter is: the algorithm and its parameters, as the module's commands take them.
//! Pure data, shared by the typed calls ([`crate::commands`]) and the lease logic.

use std::time::Duration;

/// The module's limiter algorithms and their facts (the core's one table).
pub use redis_ratelimit_core::Algorithm;

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
    String::from_utf8_lossy(duration_bytes(d, &mut [0; 41])).into_owned()
}

/// [`duration_arg`] written into `out` (no allocation: a typed call builds one per request).
pub(crate) fn duration_bytes(d: Duration, out: &mut [u8; 41]) -> &[u8] {
    let us = d.as_micros().max(1);
    let (n, unit) = if us.is_multiple_of(1000) { (us / 1000, b"ms") } else { (us, b"us") };
    let mut digits = itoa::Buffer::new();
    // At most 39 digits (u128::MAX), then the unit.
    let digits = digits.format(n).as_bytes();
    let len = digits.len() + 2;
    out[..digits.len()].copy_from_slice(digits);
    out[digits.len()..len].copy_from_slice(unit);
    &out[..len]
}

/// Parses a duration the way the module parses `period` and `window`: a positive integer with an
/// optional unit `us`, `ms`, `s`, `m`, `h`, `d` (`500ms`, `60s`, `5m`, `1d`); a bare number is
/// seconds. For services that take their limits from configuration.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
        format!("invalid duration '{s}': expected a positive integer with an optional unit us, ms, s, m, h or d")
    })?;
    let unit_us: u64 = match unit.to_ascii_lowercase().as_str() {
        "us" => 1,
        "ms" => 1_000,
        "" | "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => return Err(format!("invalid duration '{s}': unknown unit '{unit}'")),
    };
    n.checked_mul(unit_us).map(Duration::from_micros).ok_or_else(|| format!("invalid duration '{s}': too long"))
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
        assert_eq!(parse_duration("1500us"), Ok(Duration::from_micros(1500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("0s").is_err() && parse_duration("5x").is_err() && parse_duration("").is_err());
    }
}
