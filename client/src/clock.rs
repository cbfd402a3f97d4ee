//! The tokio driver's clock: the engine's `now`, read once per call, exactly.
//!
//! Why not a cached (coarse) clock: the bound needs two directions at once. A unit may be served
//! only while `now < expires_at` and RL.RETURN's `AGE` must never be below the true age, so the
//! `now` of a decision and of a return must never be *earlier* than the true instant; a claim's
//! `sent_at` (from which its leases and their `AGE` are timed) must never be *later*. A clock
//! cached by a task is a lower bound only, and how stale it is has no hard limit (a busy or
//! descheduled task, a loaded machine), so it could serve an expired unit or understate an age.
//! `CLOCK_MONOTONIC` read in the call is exact in both directions. What is saved instead is the
//! arithmetic around it: `tokio::time::Instant::elapsed` goes through `Instant`,
//! `Duration` and `u128` nanoseconds; here it is one `clock_gettime` and two integer operations.
//!
//! On Linux `std::time::Instant` (hence tokio's) is `CLOCK_MONOTONIC` too, so the instants the
//! driver hands to tokio's timers ([`Clock::instant`]) and the engine's `now` are one clock. The
//! epoch `Instant` is read before the epoch in nanoseconds, so an engine instant converted to a
//! tokio instant is never later than the true one: timeouts fire on time or early, never late
//! (a return sent to arrive by its deadline is given up no later than that deadline).

use std::time::Duration;

use tokio::time::Instant;

use redis_ratelimit_core::Nanos;

pub(crate) struct Clock {
    epoch: Instant,
    #[cfg(target_os = "linux")]
    epoch_ns: u64,
}

#[cfg(target_os = "linux")]
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on every Linux, so the
    // call cannot fail (std's `Instant::now` makes the same call and panics if it does).
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0);
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

impl Clock {
    pub(crate) fn new() -> Clock {
        // The Instant first: see the module documentation.
        let epoch = Instant::now();
        #[cfg(target_os = "linux")]
        let epoch_ns = monotonic_ns();
        Clock {
            epoch,
            #[cfg(target_os = "linux")]
            epoch_ns,
        }
    }

    /// Now, in the engine's time (never 0: 0 is no real instant).
    #[inline]
    pub(crate) fn now(&self) -> Nanos {
        #[cfg(target_os = "linux")]
        let ns = monotonic_ns().saturating_sub(self.epoch_ns);
        #[cfg(not(target_os = "linux"))]
        let ns = Nanos::from(self.epoch.elapsed()).as_u64();
        Nanos::new((ns as i64).saturating_add(1))
    }

    /// The tokio instant of engine time `t` (never later than the true one: `t` counts from
    /// `epoch_ns`, read after `epoch`, and from 1).
    pub(crate) fn instant(&self, t: Nanos) -> Instant {
        self.epoch + Duration::from(t - Nanos::new(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_time_and_tokio_instants_agree() {
        let c = Clock::new();
        let before = Instant::now();
        let t = c.now();
        let after = Instant::now();
        // The instant of `t` is never later than when it was read, and close to it.
        assert!(c.instant(t) <= after, "{:?} > {:?}", c.instant(t), after);
        assert!(c.instant(t) + Duration::from_millis(50) >= before);
        assert!(c.now() >= t);
    }
}
