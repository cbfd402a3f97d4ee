//! Leaky bucket as a queue, without a queue: requests leave at most `limit` per `period`,
//! evenly spaced, and BURST is the queue depth. The instant the queue drains is all that is
//! stored (the virtual-scheduling form of GCRA), and an admitted request is told how long to
//! wait (`delay`) so the downstream sees a perfectly smooth stream.

use super::{gcra, Decision, Nanos, Rate, Request};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State(pub gcra::State);

pub fn check(state: Option<&State>, rate: &Rate, now: Nanos, req: Request) -> (Decision, Option<State>) {
    // The queue's drain instant is GCRA's arrival time; the wait before the first of the
    // granted units leaves is the debt found on arrival, which gcra reports as `delay`.
    let (decision, new) = gcra::decide(state.map(|s| &s.0), rate, now, req);
    (decision, new.map(State))
}
