//! GCRA (generic cell rate algorithm): one stored instant, the theoretical arrival time.
//!
//! Exactness: the emission interval period/limit is rarely a whole number of nanoseconds, so
//! time is kept scaled by the limit (one unit = 1/limit ns). In those units the interval is
//! exactly `period` and the tolerance exactly `burst × period`; nothing is ever rounded until
//! a duration is reported.

use super::{
    clamp_units, div_ceil_i128, div_floor_i128, rescale_tokens, to_nanos, Decision, Nanos, Rate,
    Request,
};

/// Packed to 8-byte alignment (the i128 would otherwise pad every key's value to 64 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(packed(8))]
pub struct State {
    pub rate: Rate,
    /// Theoretical arrival time, in ns × rate.limit.
    pub tat: i128,
}

impl State {
    /// The token balance at `now`, in units of 1/period (may be negative after the clock
    /// stepped backwards: the debt then exceeds the capacity).
    pub fn tokens_scaled(&self, now: Nanos) -> i128 {
        let n = now as i128 * self.rate.limit as i128;
        self.rate.capacity_scaled() - (self.tat - n).max(0)
    }

    /// The stored arrival time in nanoseconds, rounded up.
    pub fn tat_nanos(&self) -> i128 {
        div_ceil_i128(self.tat, self.rate.limit as i128)
    }
}

/// Decides one request. Returns the decision and, when units were granted, the state to store.
pub fn check(state: Option<&State>, rate: &Rate, now: Nanos, req: Request) -> (Decision, Option<State>) {
    let (mut decision, new) = decide(state, rate, now, req);
    decision.delay = None;
    (decision, new)
}

/// `check`, also reporting in `delay` the debt found on arrival (the leaky bucket's wait).
pub(crate) fn decide(state: Option<&State>, rate: &Rate, now: Nanos, req: Request) -> (Decision, Option<State>) {
    let l = rate.limit as i128;
    let p = rate.period as i128;
    let n = now as i128 * l;
    let cap = rate.capacity_scaled();
    let tat = match state {
        None => n,
        Some(s) if s.rate == *rate => s.tat,
        Some(s) => n + cap - rescale_tokens(s.tokens_scaled(now), &s.rate, rate),
    };
    let debt = (tat - n).max(0);
    let tokens = cap - debt;
    let available = clamp_units(div_floor_i128(tokens, p), rate.burst);
    let granted = req.grant(available);
    if granted > 0 {
        let new_debt = debt + granted as i128 * p;
        let decision = Decision {
            allowed: granted,
            limit: rate.burst,
            remaining: clamp_units(div_floor_i128(cap - new_debt, p), rate.burst),
            retry_after: None,
            reset_after: to_nanos(div_ceil_i128(new_debt, l)),
            delay: Some(to_nanos(div_ceil_i128(debt, l))),
        };
        return (decision, Some(State { rate: *rate, tat: n + new_debt }));
    }
    let need = req.needed() as i128 * p;
    let retry_after = if req.cost == 0 || need > cap {
        None
    } else {
        Some(to_nanos(div_ceil_i128(need - tokens, l)))
    };
    let decision = Decision {
        allowed: 0,
        limit: rate.burst,
        remaining: available,
        retry_after,
        reset_after: to_nanos(div_ceil_i128(debt, l)),
        delay: None,
    };
    // New parameters are kept even when nothing is granted (nothing is consumed either):
    // otherwise the old rate would keep refilling the key and retry_after would be too early.
    let converted = state.is_some_and(|s| s.rate != *rate) && req.cost > 0 && debt > 0 && debt <= cap;
    (decision, converted.then_some(State { rate: *rate, tat: n + debt }))
}
