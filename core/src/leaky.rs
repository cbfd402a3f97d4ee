//! Leaky bucket as a queue, without a queue: requests leave at most `limit` per `period`,
//! evenly spaced, and BURST is the queue depth. The instant the queue drains is all that is
//! stored (the virtual-scheduling form of GCRA), and an admitted request is told how long to
//! wait (`delay`) so the downstream sees a perfectly smooth stream.
//!
//! The queue is a set of promises: every admitted request holds its departure slot. So a change
//! of parameters (limit, period or BURST) keeps the drain instant, where GCRA and the token
//! bucket carry the token count over: a queue deeper than the new BURST admits nothing until it
//! has drained to the new depth, the next request leaves when the queue drains at the earliest,
//! and the ones after it one new interval apart.

use super::{gcra, Decision, Nanos, Rate, Request};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State(pub gcra::State);

impl State {
    /// The drain instant in `rate`'s units (ns × rate.limit). The same limit keeps the stored
    /// value exactly; another one takes it in whole nanoseconds, rounded up (never earlier).
    /// Brought into the range calls store (`gcra::State::normalised`): only an instant beyond
    /// every i64 `now` moves, and the queue is still too deep to admit anything at every `now`.
    fn drain_for(&self, rate: &Rate) -> i128 {
        let s = &self.0;
        if s.rate == *rate {
            return s.tat;
        }
        let tat = if s.rate.limit == rate.limit { s.tat } else { s.tat_nanos().saturating_mul(rate.limit as i128) };
        gcra::State { rate: *rate, tat }.normalised().tat
    }
}

pub fn check(state: Option<&State>, rate: &Rate, now: Nanos, req: Request) -> (Decision, Option<State>) {
    // A fresh key's queue drains now; the wait before the first of the granted units leaves is
    // the queue found on arrival, which gcra reports as `delay`. A limited call stores nothing,
    // also under new parameters: the drain instant does not depend on them, so retry_after and
    // the key's TTL (set for the drain instant by the last admitted call) hold as they are.
    let tat = state.map_or(now.as_i128() * rate.limit as i128, |s| s.drain_for(rate));
    let (decision, new) = gcra::decide_at(tat, rate, now, req);
    (decision, new.map(State))
}
