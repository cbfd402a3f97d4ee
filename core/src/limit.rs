//! One limit as a caller states it (an algorithm and its parameters), validated by the module's
//! own rules, so that a limit the module would refuse cannot be built; and its capacity and
//! policy window (the rate-limit headers' `q` and `w`), written once for every crate.

use std::fmt;
use std::time::Duration;

use crate::spec::Spec;
use crate::{Algorithm, Nanos, PolicyWindow, MAX_COUNT, NANOS_PER_MICRO};

/// Why a limit cannot be built: the setting at fault and the rule it breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitError {
    /// `limit` is 0 or above [`MAX_COUNT`].
    Limit(u64),
    /// `BURST` is 0 or above [`MAX_COUNT`].
    Burst(u64),
    /// `BURST` given to a window algorithm (the module refuses the option).
    BurstNotAllowed(Algorithm),
    /// The period (a window algorithm's window) is below 1 µs, above [`crate::MAX_PERIOD`], or
    /// not a whole number of microseconds (the module's unit).
    Period(Nanos),
    /// `BURST × period ÷ limit` is above [`crate::MAX_HORIZON`] (200 years to refill).
    Refill,
}

/// The module's message for [`LimitError::Refill`] (its reply to such a command, word for word).
pub const REFILL_MESSAGE: &str = "BURST too large for this rate: refilling it would take more than 200 years";

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::Limit(n) => write!(f, "limit {n}: must be from 1 to {MAX_COUNT}"),
            LimitError::Burst(n) => write!(f, "BURST {n}: must be from 1 to {MAX_COUNT}"),
            LimitError::BurstNotAllowed(a) => write!(f, "BURST is not an option of {}", a.command()),
            LimitError::Period(p) => {
                write!(f, "period {p:?}: must be a whole number of microseconds from 1us to 100 years (36525d)")
            }
            LimitError::Refill => f.write_str(REFILL_MESSAGE),
        }
    }
}

impl std::error::Error for LimitError {}

/// One limit: `limit` units per `period` (the window, for a window algorithm), with a `BURST`
/// for the buckets. Built only through [`Limit::new`] (and the per-algorithm shorthands) and
/// [`Limit::with_burst`], which apply the module's rules: whatever a `Limit` holds, the module
/// accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    algorithm: Algorithm,
    limit: u64,
    period: Nanos,
    /// `BURST n` as given (buckets only); `None`: the module's default, the limit (not sent).
    burst: Option<u64>,
}

impl Limit {
    /// `limit` units per `period` with `algorithm` (a bucket's BURST: the limit, until
    /// [`Limit::with_burst`]).
    pub fn new(algorithm: Algorithm, limit: u64, period: Duration) -> Result<Limit, LimitError> {
        let period = Nanos::from(period);
        if period.as_i64() % NANOS_PER_MICRO != 0 {
            return Err(LimitError::Period(period));
        }
        let l = Limit { algorithm, limit, period, burst: None };
        l.validated()
    }
    pub fn gcra(limit: u64, period: Duration) -> Result<Limit, LimitError> {
        Limit::new(Algorithm::Gcra, limit, period)
    }
    pub fn token_bucket(limit: u64, period: Duration) -> Result<Limit, LimitError> {
        Limit::new(Algorithm::TokenBucket, limit, period)
    }
    pub fn leaky(limit: u64, period: Duration) -> Result<Limit, LimitError> {
        Limit::new(Algorithm::Leaky, limit, period)
    }
    pub fn sliding(limit: u64, window: Duration) -> Result<Limit, LimitError> {
        Limit::new(Algorithm::Sliding, limit, window)
    }
    pub fn fixed(limit: u64, window: Duration) -> Result<Limit, LimitError> {
        Limit::new(Algorithm::Fixed, limit, window)
    }
    pub fn sliding_log(limit: u64, window: Duration) -> Result<Limit, LimitError> {
        Limit::new(Algorithm::SlidingLog, limit, window)
    }

    /// The same limit with `BURST burst` (the buckets only).
    pub fn with_burst(self, burst: u64) -> Result<Limit, LimitError> {
        if !self.algorithm.is_bucket() {
            return Err(LimitError::BurstNotAllowed(self.algorithm));
        }
        Limit { burst: Some(burst), ..self }.validated()
    }

    /// The limit of a core spec (a bucket's BURST stated).
    pub fn from_spec(spec: &Spec) -> Result<Limit, LimitError> {
        let period = |p: Nanos| Duration::from(p);
        match *spec {
            Spec::Gcra(r) | Spec::TokenBucket(r) | Spec::Leaky(r) => {
                Limit::new(spec.algorithm(), r.limit, period(r.period))?.with_burst(r.burst)
            }
            Spec::Sliding(w) | Spec::Fixed(w) | Spec::SlidingLog(w) => {
                Limit::new(spec.algorithm(), w.limit, period(w.window))
            }
        }
    }

    /// `self` if the module takes it: the core's rules for a rate or a window ([`Spec::new`]),
    /// whose errors name the setting at fault.
    fn validated(self) -> Result<Limit, LimitError> {
        self.checked_spec().map(|_| self)
    }

    fn checked_spec(&self) -> Result<Spec, LimitError> {
        Spec::new(self.algorithm, self.limit, self.period, self.burst.unwrap_or(self.limit))
    }

    #[inline]
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// The period (the window of a window algorithm), a whole number of microseconds.
    #[inline]
    pub fn period(&self) -> Duration {
        self.period.into()
    }
    #[inline]
    pub fn period_nanos(&self) -> Nanos {
        self.period
    }
    /// `BURST` as given (`None`: the module's default, the limit).
    #[inline]
    pub fn burst(&self) -> Option<u64> {
        self.burst
    }

    /// What the module decides with: the spec of this limit (validated when the limit was).
    pub fn spec(&self) -> Spec {
        self.checked_spec().expect("a Limit holds only what the core accepts")
    }

    /// The capacity, which the module reports as `limit`: BURST (default the limit) for the
    /// buckets, the limit for the windows. A request of more units can never pass.
    #[inline]
    pub fn capacity(&self) -> u64 {
        if self.algorithm.is_bucket() {
            self.burst.unwrap_or(self.limit)
        } else {
            self.limit
        }
    }

    /// The window `w` of the policy in the rate-limit headers (docs/http-headers.md): the
    /// window, or for a bucket the time to refill its capacity from empty,
    /// `capacity × period ÷ limit` (a GCRA of 10/s with BURST 20 is `q=20;w=2`).
    pub fn policy_window(&self) -> Duration {
        match self.algorithm.policy_window() {
            PolicyWindow::Period => self.period(),
            PolicyWindow::Refill => {
                let ns = self.period.as_i128() * self.capacity() as i128 / self.limit as i128;
                Duration::from(Nanos::new(ns.min(i64::MAX as i128) as i64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Rate, Window, MAX_HORIZON, MAX_PERIOD};

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn builds_only_what_the_module_accepts() {
        let l = Limit::gcra(10, SEC).unwrap().with_burst(20).unwrap();
        assert_eq!(
            (l.algorithm(), l.limit(), l.period(), l.burst(), l.capacity()),
            (Algorithm::Gcra, 10, SEC, Some(20), 20)
        );
        assert_eq!(l.policy_window(), 2 * SEC);
        assert_eq!(Limit::sliding(100, SEC).unwrap().capacity(), 100);
        assert_eq!(Limit::sliding(100, SEC).unwrap().policy_window(), SEC);
        assert_eq!(Limit::gcra(0, SEC), Err(LimitError::Limit(0)));
        assert_eq!(Limit::fixed(MAX_COUNT + 1, SEC), Err(LimitError::Limit(MAX_COUNT + 1)));
        assert!(Limit::fixed(MAX_COUNT, SEC).is_ok());
        assert_eq!(Limit::gcra(1, SEC).unwrap().with_burst(0), Err(LimitError::Burst(0)));
        assert_eq!(Limit::sliding(1, SEC).unwrap().with_burst(5), Err(LimitError::BurstNotAllowed(Algorithm::Sliding)));
        assert_eq!(Limit::gcra(1, Duration::ZERO), Err(LimitError::Period(Nanos::ZERO)));
        assert_eq!(Limit::gcra(1, Duration::from_nanos(1500)), Err(LimitError::Period(Nanos::new(1500))));
        assert!(Limit::gcra(1, Duration::from_micros(1)).is_ok());
        assert!(Limit::gcra(1, Duration::from(MAX_PERIOD)).is_ok());
        assert!(Limit::gcra(1, Duration::from(MAX_PERIOD) + Duration::from_micros(1)).is_err());
        // 200 years to refill is the most.
        assert!(Limit::gcra(1, Duration::from(MAX_PERIOD)).unwrap().with_burst(2).is_ok());
        assert_eq!(Limit::gcra(1, Duration::from(MAX_PERIOD)).unwrap().with_burst(3), Err(LimitError::Refill));
        assert_eq!(LimitError::Refill.to_string(), REFILL_MESSAGE);
        assert_eq!(
            Limit::gcra(1, Duration::from(MAX_PERIOD)).unwrap().with_burst(2).unwrap().policy_window(),
            Duration::from(MAX_HORIZON)
        );
    }

    #[test]
    fn a_spec_and_its_limit_agree() {
        for spec in [
            Spec::Gcra(Rate::new(3, Nanos::from_millis(1500), 7).unwrap()),
            Spec::Leaky(Rate::new(3, Nanos::from_secs(1), 3).unwrap()),
            Spec::SlidingLog(Window::new(9, Nanos::from_secs(60)).unwrap()),
        ] {
            let l = Limit::from_spec(&spec).unwrap();
            assert_eq!(l.spec(), spec);
            assert_eq!(l.algorithm(), spec.algorithm());
        }
    }
}
