//! The engine's one time type: [`Nanos`], an instant or a span of the engine's clock in whole
//! nanoseconds (`u64`), as governor's `Nanos`. Every engine edge (the `now` passed in, the
//! configuration, claims, returns, outcomes) speaks it; `Duration` converts to it in exactly
//! one place (`From<Duration>`, saturating at `u64::MAX` ns, about 584 years).
//!
//! Arithmetic saturates: an instant never wraps, a span never goes negative.

use std::fmt;
use std::ops::{Add, AddAssign, Div, Mul, Sub};
use std::time::Duration;

/// Nanoseconds: an instant of the engine's clock (its origin is the driver's business) or a span.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(u64);

impl Nanos {
    pub const ZERO: Nanos = Nanos(0);
    pub const MAX: Nanos = Nanos(u64::MAX);

    #[inline]
    pub const fn new(ns: u64) -> Nanos {
        Nanos(ns)
    }
    #[inline]
    pub const fn from_micros(us: u64) -> Nanos {
        Nanos(us.saturating_mul(1_000))
    }
    #[inline]
    pub const fn from_millis(ms: u64) -> Nanos {
        Nanos(ms.saturating_mul(1_000_000))
    }
    #[inline]
    pub const fn from_secs(s: u64) -> Nanos {
        Nanos(s.saturating_mul(1_000_000_000))
    }
    #[inline]
    pub const fn as_u64(self) -> u64 {
        self.0
    }
    #[inline]
    pub fn as_f64(self) -> f64 {
        self.0 as f64
    }
    /// Whole milliseconds, rounded up (what the module's `AGE` and the headers never understate).
    #[inline]
    pub const fn as_millis_ceil(self) -> u64 {
        self.0.div_ceil(1_000_000)
    }
    #[inline]
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }
    #[inline]
    pub const fn saturating_add(self, o: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(o.0))
    }
    #[inline]
    pub const fn saturating_sub(self, o: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(o.0))
    }
    /// `self ÷ o` as a count (0 when `o` is zero).
    #[inline]
    pub const fn div_span(self, o: Nanos) -> u64 {
        match self.0.checked_div(o.0) {
            Some(q) => q,
            None => 0,
        }
    }
}

impl From<Duration> for Nanos {
    /// The one conversion: saturating.
    #[inline]
    fn from(d: Duration) -> Nanos {
        Nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

impl From<Nanos> for Duration {
    #[inline]
    fn from(n: Nanos) -> Duration {
        Duration::from_nanos(n.0)
    }
}

impl Add for Nanos {
    type Output = Nanos;
    #[inline]
    fn add(self, o: Nanos) -> Nanos {
        self.saturating_add(o)
    }
}

impl AddAssign for Nanos {
    #[inline]
    fn add_assign(&mut self, o: Nanos) {
        *self = *self + o;
    }
}

impl Sub for Nanos {
    type Output = Nanos;
    /// Saturating at zero: the span from a later instant to an earlier one is zero.
    #[inline]
    fn sub(self, o: Nanos) -> Nanos {
        self.saturating_sub(o)
    }
}

impl Mul<u64> for Nanos {
    type Output = Nanos;
    #[inline]
    fn mul(self, k: u64) -> Nanos {
        Nanos(self.0.saturating_mul(k))
    }
}

impl Div<u64> for Nanos {
    type Output = Nanos;
    #[inline]
    fn div(self, k: u64) -> Nanos {
        Nanos(self.0 / k.max(1))
    }
}

impl fmt::Debug for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_once_and_saturates() {
        assert_eq!(Nanos::from(Duration::from_millis(3)), Nanos::from_millis(3));
        assert_eq!(Nanos::from(Duration::MAX), Nanos::MAX);
        assert_eq!(Duration::from(Nanos::from_secs(2)), Duration::from_secs(2));
        assert_eq!(Nanos::new(5) - Nanos::new(7), Nanos::ZERO);
        assert_eq!(Nanos::MAX + Nanos::new(1), Nanos::MAX);
        assert_eq!(Nanos::new(1_000_001).as_millis_ceil(), 2);
        assert_eq!(Nanos::new(10).div_span(Nanos::ZERO), 0);
    }
}
