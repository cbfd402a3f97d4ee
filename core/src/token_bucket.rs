//! Token bucket: a token count and the time it was counted, refilled lazily.
//!
//! Tokens are kept in units of 1/period so that the refill of `limit` tokens per `period` is
//! exactly `limit` units per nanosecond: no division, no rounding, no float. It implements the
//! same admission model as GCRA and answers identically (a property test checks it).

use super::{bucket_decision, div_ceil_i128, rescale_tokens, Decision, Nanos, Rate, Request};

/// Packed to 8-byte alignment, as gcra::State.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(Rust, packed(8))]
pub struct State {
    pub rate: Rate,
    /// Tokens × period at `last`.
    pub tokens: i128,
    /// When `tokens` was counted.
    pub last: Nanos,
}

impl State {
    /// The balance at `now`, refilled up to the capacity (negative elapsed time drains it, so
    /// a clock stepping backwards never creates tokens).
    pub fn tokens_scaled(&self, now: Nanos) -> i128 {
        let refill = (now.as_i128() - self.last.as_i128()) * self.rate.limit as i128;
        (self.tokens + refill).min(self.rate.capacity_scaled())
    }

    /// A loaded state brought into the range calls store: 0 ≤ tokens ≤ capacity (identity on
    /// every such state; a call never stores a negative balance, a debt exists only while the
    /// clock is before `last`). A negative balance becomes the same debt counted from a later
    /// `last`: the
    /// balance at every instant is unchanged, up to rounding down to the capacity (and a debt
    /// that outlasts every instant stays one: 0 tokens at the last instant).
    pub(crate) fn normalised(self) -> State {
        let (rate, tokens, last) = (self.rate, self.tokens, self.last);
        if tokens >= 0 {
            return self;
        }
        let l = rate.limit as i128;
        let k = div_ceil_i128(-tokens, l);
        match i64::try_from(last.as_i128() + k) {
            Ok(last) => State { rate, tokens: (tokens + k * l).min(rate.capacity_scaled()), last: Nanos::new(last) },
            Err(_) => State { rate, tokens: 0, last: Nanos::MAX },
        }
    }
}

pub fn check(state: Option<&State>, rate: &Rate, now: Nanos, req: Request) -> (Decision, Option<State>) {
    let cap = rate.capacity_scaled();
    let tokens = match state {
        None => cap,
        Some(s) if s.rate == *rate => s.tokens_scaled(now),
        Some(s) => rescale_tokens(s.tokens_scaled(now), &s.rate, rate),
    };
    let (decision, left) = bucket_decision(rate, tokens, req);
    if decision.allowed > 0 {
        return (decision, Some(State { rate: *rate, tokens: left, last: now }));
    }
    // New parameters are kept even when nothing is granted (see gcra).
    let converted = state.is_some_and(|s| s.rate != *rate) && req.cost > 0 && (0..cap).contains(&tokens);
    (decision, converted.then_some(State { rate: *rate, tokens, last: now }))
}
