//! [`Nanos`], the one time type of every crate: an instant or a span in whole nanoseconds. The
//! module's instants count from the Unix epoch (its clock, and what keys store); the client's
//! from its driver's monotonic origin (the engine never asks which). Signed, because the module
//! keeps instants that come from outside (an `RL.SETSTATE` payload may hold any i64, a clock may
//! stand anywhere), and the algorithms' arithmetic runs on the raw value ([`Nanos::as_i64`],
//! [`Nanos::as_i128`]) where it must be exact.
//!
//! The operators saturate, so an instant never wraps: `+` at the bounds, and `-` is the span
//! from one instant to another, zero when the other is later (never negative). Conversions:
//! from a `Duration` saturating at [`Nanos::MAX`] (about 292 years), to one with a negative
//! value as zero, to milliseconds rounded up ([`Nanos::as_millis_ceil`]: a retry time or an
//! `AGE` is never early).

use std::fmt;
use std::ops::{Add, AddAssign, Div, Mul, Sub};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// Nanoseconds per microsecond, millisecond and second (scale factors of the raw value).
pub const NANOS_PER_MICRO: i64 = 1_000;
pub const NANOS_PER_MILLI: i64 = 1_000_000;
pub const NANOS_PER_SEC: i64 = 1_000_000_000;

/// Nanoseconds: an instant (since the caller's origin) or a span.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub struct Nanos(i64);

impl Nanos {
    pub const ZERO: Nanos = Nanos(0);
    pub const MAX: Nanos = Nanos(i64::MAX);
    pub const MIN: Nanos = Nanos(i64::MIN);

    #[inline]
    pub const fn new(ns: i64) -> Nanos {
        Nanos(ns)
    }
    #[inline]
    pub const fn from_micros(us: u64) -> Nanos {
        Nanos::scaled(us, NANOS_PER_MICRO)
    }
    #[inline]
    pub const fn from_millis(ms: u64) -> Nanos {
        Nanos::scaled(ms, NANOS_PER_MILLI)
    }
    #[inline]
    pub const fn from_secs(s: u64) -> Nanos {
        Nanos::scaled(s, NANOS_PER_SEC)
    }
    /// `n × unit` ns, saturating at MAX.
    #[inline]
    const fn scaled(n: u64, unit: i64) -> Nanos {
        let ns = n as u128 * unit as u128;
        Nanos(if ns > i64::MAX as u128 { i64::MAX } else { ns as i64 })
    }
    /// The raw value.
    #[inline]
    pub const fn as_i64(self) -> i64 {
        self.0
    }
    /// The raw value, widened for exact products (the algorithms' scaled time).
    #[inline]
    pub const fn as_i128(self) -> i128 {
        self.0 as i128
    }
    /// The value as a count, a negative one as 0 (seeds, shifts, products with counts).
    #[inline]
    pub const fn as_u64(self) -> u64 {
        if self.0 < 0 {
            0
        } else {
            self.0 as u64
        }
    }
    /// Whole milliseconds, rounded up, 0 for none or less: what the module's replies, `AGE` and
    /// the headers never understate (a client told to come back is never early).
    #[inline]
    pub const fn as_millis_ceil(self) -> u64 {
        // (Signed, as the replies' integers: one division by a constant, no widening.)
        if self.0 <= 0 {
            0
        } else {
            ((self.0 - 1) / NANOS_PER_MILLI + 1) as u64
        }
    }
    #[inline]
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }
    #[inline]
    pub const fn saturating_add(self, o: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(o.0))
    }
    /// The span from `earlier` to `self`: zero when `earlier` is later (the `-` operator).
    #[inline]
    pub const fn since(self, earlier: Nanos) -> Nanos {
        let d = self.0.saturating_sub(earlier.0);
        Nanos(if d < 0 { 0 } else { d })
    }
    /// `self ÷ o` as a count (0 when `o` is not positive).
    #[inline]
    pub const fn div_span(self, o: Nanos) -> u64 {
        if o.0 <= 0 {
            0
        } else {
            (self.0 / o.0) as u64
        }
    }
}

impl From<Duration> for Nanos {
    /// Saturating at [`Nanos::MAX`].
    #[inline]
    fn from(d: Duration) -> Nanos {
        Nanos(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }
}

impl From<Nanos> for Duration {
    /// A negative value as zero.
    #[inline]
    fn from(n: Nanos) -> Duration {
        Duration::from_nanos(n.as_u64())
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
    /// The span from `o` to `self` ([`Nanos::since`]): never negative.
    #[inline]
    fn sub(self, o: Nanos) -> Nanos {
        self.since(o)
    }
}

impl Mul<u64> for Nanos {
    type Output = Nanos;
    /// Saturating at the bounds.
    #[inline]
    fn mul(self, k: u64) -> Nanos {
        let p = self.0 as i128 * k as i128;
        Nanos(p.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
    }
}

impl Mul<Nanos> for u64 {
    type Output = Nanos;
    /// `k × span`, as [`Nanos`] `× k` (so `5 * SECOND` reads as written).
    #[inline]
    fn mul(self, n: Nanos) -> Nanos {
        n * self
    }
}

impl Div<u64> for Nanos {
    type Output = Nanos;
    /// Truncating; a divisor of 0 counts as 1.
    #[inline]
    fn div(self, k: u64) -> Nanos {
        Nanos((self.0 as i128 / k.max(1) as i128) as i64)
    }
}

impl fmt::Debug for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

/// A [`Nanos`] shared between threads (a deadline published to a housekeeping task).
#[derive(Debug, Default)]
pub struct AtomicNanos(AtomicI64);

impl AtomicNanos {
    pub const fn new(n: Nanos) -> AtomicNanos {
        AtomicNanos(AtomicI64::new(n.0))
    }
    #[inline]
    pub fn load(&self, order: Ordering) -> Nanos {
        Nanos(self.0.load(order))
    }
    #[inline]
    pub fn store(&self, n: Nanos, order: Ordering) {
        self.0.store(n.0, order)
    }
    #[inline]
    pub fn swap(&self, n: Nanos, order: Ordering) -> Nanos {
        Nanos(self.0.swap(n.0, order))
    }
    #[inline]
    pub fn fetch_min(&self, n: Nanos, order: Ordering) -> Nanos {
        Nanos(self.0.fetch_min(n.0, order))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_and_saturates() {
        assert_eq!(Nanos::from(Duration::from_millis(3)), Nanos::from_millis(3));
        assert_eq!(Nanos::from(Duration::MAX), Nanos::MAX);
        assert_eq!(Nanos::from_secs(u64::MAX), Nanos::MAX);
        assert_eq!(Duration::from(Nanos::from_secs(2)), Duration::from_secs(2));
        assert_eq!(Duration::from(Nanos::new(-5)), Duration::ZERO);
        assert_eq!(Nanos::new(5) - Nanos::new(7), Nanos::ZERO);
        assert_eq!(Nanos::new(7) - Nanos::new(-5), Nanos::new(12));
        assert_eq!(Nanos::MAX - Nanos::MIN, Nanos::MAX);
        assert_eq!(Nanos::MAX + Nanos::new(1), Nanos::MAX);
        assert_eq!(Nanos::MIN + Nanos::new(-1), Nanos::MIN);
        assert_eq!(Nanos::new(1_000_001).as_millis_ceil(), 2);
        assert_eq!(Nanos::new(1_000_000).as_millis_ceil(), 1);
        assert_eq!(Nanos::new(-3).as_millis_ceil(), 0);
        assert_eq!(Nanos::new(10).div_span(Nanos::ZERO), 0);
        assert_eq!(5 * Nanos::from_secs(1), Nanos::from_secs(5));
        assert_eq!(u64::MAX * Nanos::from_secs(1), Nanos::MAX);
        assert_eq!(Nanos::MAX * 2, Nanos::MAX);
        assert_eq!(Nanos::new(-3) * 2, Nanos::new(-6));
        assert_eq!(Nanos::new(7) / 0, Nanos::new(7));
    }
}
