//! GCRA (generic cell rate algorithm): one stored instant, the theoretical arrival time.
//!
//! Exactness: the emission interval period/limit is rarely a whole number of nanoseconds, so
//! time is kept scaled by the limit (one unit = 1/limit ns). In those units the interval is
//! exactly `period` and the tolerance exactly `burst × period`; nothing is ever rounded until
//! a duration is reported.

use super::{bucket_decision, div_ceil_i128, rescale_tokens, to_nanos, Decision, Nanos, Rate, Request};

/// Packed to 8-byte alignment (the i128 would otherwise pad every key's value to 64 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(Rust, packed(8))]
pub struct State {
    pub rate: Rate,
    /// Theoretical arrival time, in ns × rate.limit.
    pub tat: i128,
}

impl State {
    /// The token balance at `now`, in units of 1/period (may be negative after the clock
    /// stepped backwards: the debt then exceeds the capacity).
    pub fn tokens_scaled(&self, now: Nanos) -> i128 {
        let n = now.as_i128() * self.rate.limit as i128;
        self.rate.capacity_scaled() - (self.tat - n).max(0)
    }

    /// The stored arrival time in nanoseconds, rounded up.
    pub fn tat_nanos(&self) -> i128 {
        div_ceil_i128(self.tat, self.rate.limit as i128)
    }

    /// A loaded state brought into the range calls store: `now × limit + debt`, for an i64 `now`
    /// and 0 ≤ debt ≤ capacity (identity on every such state). Below it the bucket is full at
    /// every instant, as before; above it the debt outlasts every instant, so every call is
    /// still limited, only with the waits of the latest state a call can store.
    pub(crate) fn normalised(self) -> State {
        let l = self.rate.limit as i128;
        let lowest = i64::MIN as i128 * l;
        let highest = i64::MAX as i128 * l + self.rate.capacity_scaled();
        State { rate: self.rate, tat: self.tat.clamp(lowest, highest) }
    }
}

/// Decides one request. Returns the decision and, when units were granted, the state to store.
pub fn check(state: Option<&State>, rate: &Rate, now: Nanos, req: Request) -> (Decision, Option<State>) {
    let n = now.as_i128() * rate.limit as i128;
    let cap = rate.capacity_scaled();
    let tat = match state {
        None => n,
        Some(s) if s.rate == *rate => s.tat,
        Some(s) => n + cap - rescale_tokens(s.tokens_scaled(now), &s.rate, rate),
    };
    let (mut decision, new) = decide_at(tat, rate, now, req);
    decision.delay = None;
    if new.is_some() {
        return (decision, new);
    }
    // New parameters are kept even when nothing is granted (nothing is consumed either):
    // otherwise the old rate would keep refilling the key and retry_after would be too early.
    let debt = (tat - n).max(0);
    let converted = state.is_some_and(|s| s.rate != *rate) && req.cost > 0 && debt > 0 && debt <= cap;
    (decision, converted.then_some(State { rate: *rate, tat: n + debt }))
}

/// The decision on a key whose arrival time, in `rate`'s units, is `tat`, also reporting in
/// `delay` the debt found on arrival (the leaky bucket's wait); and, when units were granted,
/// the state to store.
#[inline]
pub(crate) fn decide_at(tat: i128, rate: &Rate, now: Nanos, req: Request) -> (Decision, Option<State>) {
    let l = rate.limit as i128;
    let n = now.as_i128() * l;
    let cap = rate.capacity_scaled();
    let debt = (tat - n).max(0);
    let (mut decision, left) = bucket_decision(rate, cap - debt, req);
    if decision.allowed > 0 {
        decision.delay = Some(to_nanos(div_ceil_i128(debt, l)));
        return (decision, Some(State { rate: *rate, tat: n + cap - left }));
    }
    (decision, None)
}
