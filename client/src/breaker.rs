//! Circuit breaker, sans IO: time is a `now` in nanoseconds passed in, never read.
//!
//! Closed: every call goes to Redis; `failures` consecutive failures (errors or timeouts)
//! open it. Open: no call goes to Redis until `cool_down` has passed; then half-open: exactly
//! one call (the probe) goes through; its success closes the breaker, its failure opens it for
//! another `cool_down`. So when Redis is down, a request pays the timeout at most once per
//! cool-down per process, not once per request.
//!
//! Shared by every key of a limiter (Redis is down for all of them at once); `&self` methods
//! over a small mutex, so one breaker serves every shard of the driver. While Redis answers
//! (closed, no failure counted) a call's permit and its success read one flag instead of
//! taking the mutex: every claim of every shard asks, so the healthy path shares nothing
//! written.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use redis_ratelimit_core::Nanos;

/// When to open and how long to stay open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker (at least 1).
    pub failures: u32,
    /// How long it stays open before a half-open probe.
    pub cool_down: Nanos,
}

impl Default for BreakerConfig {
    /// 5 failures, 1 s cool-down.
    fn default() -> Self {
        BreakerConfig { failures: 5, cool_down: Nanos::from_secs(1) }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Nanos,
    },
    /// One probe is in flight; everyone else is rejected until it answers.
    HalfOpen,
}

/// What a caller may do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permit {
    /// Call Redis.
    Call,
    /// Call Redis: this call is the half-open probe (report its result like any other).
    Probe,
    /// Do not call Redis; `retry_in` until a probe may be tried (0 while a probe is out).
    Reject { retry_in: Nanos },
}

impl Permit {
    pub fn allows_call(self) -> bool {
        !matches!(self, Permit::Reject { .. })
    }
}

/// The breaker. Transitions are counted in `opens` (for metrics).
#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    state: Mutex<State>,
    /// `state` is `Closed { failures: 0 }`; written only under its lock ([`Breaker::set`]).
    healthy: AtomicBool,
}

const HEALTHY: State = State::Closed { failures: 0 };

impl Breaker {
    pub fn new(config: BreakerConfig) -> Breaker {
        Breaker { config, state: Mutex::new(HEALTHY), healthy: AtomicBool::new(true) }
    }

    /// Moves to `new` (`s`: the locked state), keeping the flag in step.
    fn set(&self, s: &mut State, new: State) {
        *s = new;
        self.healthy.store(new == HEALTHY, Ordering::Release);
    }

    pub fn config(&self) -> BreakerConfig {
        self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// May a call go to Redis now? An open breaker past its cool-down turns half-open and
    /// hands out exactly one [`Permit::Probe`].
    pub fn permit(&self, now: Nanos) -> Permit {
        // A call racing a failure that opens the breaker may still go: as if it came first.
        if self.healthy.load(Ordering::Acquire) {
            return Permit::Call;
        }
        let mut s = self.lock();
        match *s {
            State::Closed { .. } => Permit::Call,
            State::Open { until } if now >= until => {
                self.set(&mut s, State::HalfOpen);
                Permit::Probe
            }
            State::Open { until } => Permit::Reject { retry_in: until - now },
            State::HalfOpen => Permit::Reject { retry_in: Nanos::ZERO },
        }
    }

    /// A call answered (any reply from the server, even a limiter error): close.
    pub fn on_success(&self) {
        // Already closed with no failure counted: nothing to write (a failure racing this
        // success is then ordered after it).
        if self.healthy.load(Ordering::Acquire) {
            return;
        }
        let mut s = self.lock();
        self.set(&mut s, HEALTHY);
    }

    /// A call failed or timed out. Returns true when this failure opened the breaker.
    pub fn on_failure(&self, now: Nanos) -> bool {
        let mut s = self.lock();
        let open = State::Open { until: now + self.config.cool_down };
        match *s {
            State::Closed { failures } if failures + 1 < self.config.failures.max(1) => {
                self.set(&mut s, State::Closed { failures: failures + 1 });
                false
            }
            // A failure reported late by a call sent before the breaker opened: stay open.
            State::Open { .. } => false,
            _ => {
                self.set(&mut s, open);
                true
            }
        }
    }

    /// Whether calls are currently refused (open or half-open).
    pub fn is_open(&self) -> bool {
        self.state() != BreakerState::Closed
    }

    /// The state, for the `breaker_state` gauge.
    pub fn state(&self) -> BreakerState {
        if self.healthy.load(Ordering::Acquire) {
            return BreakerState::Closed;
        }
        match *self.lock() {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { .. } => BreakerState::Open,
            State::HalfOpen => BreakerState::HalfOpen,
        }
    }
}

/// The breaker's state as exported (`breaker_state`: 0, 1, 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_n_failures_probes_after_cool_down_and_closes_on_success() {
        let b = Breaker::new(BreakerConfig { failures: 3, cool_down: Nanos::new(100) });
        assert_eq!(b.permit(Nanos::new(0)), Permit::Call);
        assert!(!b.on_failure(Nanos::new(1)));
        assert!(!b.on_failure(Nanos::new(2)));
        b.on_success(); // resets the count
        assert!(!b.on_failure(Nanos::new(3)));
        assert!(!b.on_failure(Nanos::new(4)));
        assert!(b.on_failure(Nanos::new(5)));
        assert_eq!(b.permit(Nanos::new(50)), Permit::Reject { retry_in: Nanos::new(55) });
        assert_eq!(b.permit(Nanos::new(105)), Permit::Probe);
        assert_eq!(b.permit(Nanos::new(106)), Permit::Reject { retry_in: Nanos::new(0) });
        assert!(b.on_failure(Nanos::new(110))); // the probe failed: open again
        assert_eq!(b.permit(Nanos::new(150)), Permit::Reject { retry_in: Nanos::new(60) });
        assert_eq!(b.permit(Nanos::new(210)), Permit::Probe);
        b.on_success();
        assert_eq!(b.permit(Nanos::new(211)), Permit::Call);
        assert!(!b.is_open());
    }
}
