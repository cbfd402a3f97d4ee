//! Giving unused units back to a key (RL.RETURN): the other half of claiming a batch with
//! `COST b PARTIAL` and serving it locally.
//!
//! Buckets (GCRA, token bucket) take the units back into the balance, less the refill they
//! received while the units were out, never above the capacity: returning right after claiming
//! leaves exactly the state of never having claimed them, and no return ever leaves more than
//! that. Windows (fixed, sliding counter) take them back only into the window they were counted
//! in, and only when the caller's `age` proves the claim was made in the current window. The
//! sliding log is refused: its entries carry no owner, so removing "n units" would remove other
//! callers' entries. The leaky bucket is refused too: every slot of its queue up to the drain
//! instant is promised to an admitted request (told its `delay`), and the state does not say
//! which slots are the returner's; moving the drain instant back frees the last slot, which a
//! later request may hold, and the next admission would be sent at the same instant.

use super::codec::State;
use super::spec::Spec;
use super::{
    bucket_reset_after, clamp_units, div_floor_i128, fixed, gcra, sliding, token_bucket, window_index, Nanos, Rate,
    Request,
};

/// Why units cannot be given back to this key at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A sliding log's entries cannot be told apart from other callers'.
    SlidingLog,
    /// A leaky bucket's queue slots are all promised: freeing one would give it twice.
    Leaky,
    /// A window limiter needs the claim's age to know which window the units came from.
    AgeRequired,
}

/// The outcome of giving units back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credit {
    /// Units taken back, 0 ≤ credited ≤ n. Buckets: how much `remaining` grows (the rest would
    /// overflow the capacity, or was refilled while the units were out). Windows: units taken
    /// off the current window's count (the rest were not counted there).
    pub credited: u64,
    /// The state to store; None when nothing was credited (nothing to write).
    pub state: Option<State>,
    /// The new state's reset_after at `now` (its TTL); 0 when nothing was credited.
    pub reset_after: Nanos,
}

impl Credit {
    const NOTHING: Credit = Credit { credited: 0, state: None, reset_after: Nanos::ZERO };
}

/// Gives `n` units back to `state` at `now`. `age` is how long ago the caller sent the claim the
/// units came from (an upper bound on the claim's true age): required for window limiters; for
/// buckets None counts as 0 (the claim was just made).
pub fn give_back(state: &State, n: u64, age: Option<Nanos>, now: Nanos) -> Result<Credit, Refusal> {
    let (credited, new) = match state {
        State::Gcra(s) => wrap(credit_gcra(s, n, age.unwrap_or(Nanos::ZERO), now), State::Gcra),
        State::Leaky(_) => return Err(Refusal::Leaky),
        State::TokenBucket(s) => wrap(credit_token_bucket(s, n, age.unwrap_or(Nanos::ZERO), now), State::TokenBucket),
        State::Fixed(s) => wrap(credit_fixed(s, n, age.ok_or(Refusal::AgeRequired)?, now), State::Fixed),
        State::Sliding(s) => wrap(credit_sliding(s, n, age.ok_or(Refusal::AgeRequired)?, now), State::Sliding),
        State::SlidingLog(_) => return Err(Refusal::SlidingLog),
    };
    let Some(new) = new.filter(|_| credited > 0) else {
        return Ok(Credit::NOTHING);
    };
    let reset_after = reset_after(&new, now);
    Ok(Credit { credited, state: Some(new), reset_after })
}

fn wrap<S>((credited, new): (u64, Option<S>), to_state: impl FnOnce(S) -> State) -> (u64, Option<State>) {
    (credited, new.map(to_state))
}

/// The state's own reset_after at `now`: a peek with its stored parameters.
fn reset_after(state: &State, now: Nanos) -> Nanos {
    // The buckets' directly (what a check of cost 0 computes, without the rest of a check).
    let spec = match state {
        State::Gcra(s) => return bucket_reset_after(&s.rate, s.tokens_scaled(now)),
        State::TokenBucket(s) => return bucket_reset_after(&s.rate, s.tokens_scaled(now)),
        State::Leaky(s) => Spec::Leaky(s.0.rate),
        State::Fixed(s) => Spec::Fixed(s.win),
        State::Sliding(s) => Spec::Sliding(s.win),
        State::SlidingLog(s) => Spec::SlidingLog(s.win),
    };
    // Same parameters and cost 0: never a mismatch, never a conversion.
    spec.check(Some(state), now, Request::new(0)).map_or(Nanos::ZERO, |(d, _)| d.reset_after)
}

/// A bucket's balance (scaled, at most the capacity) after `n` units held for `age` come back:
/// n units less the refill the bucket received while they were out (rate × age), never above
/// the capacity. Returns the units credited (how much `remaining` grows) and the new balance,
/// None when `remaining` does not grow (a fraction of a unit is not worth a write).
///
/// Why less the refill: while units are out the key keeps refilling as if they had been spent.
/// Crediting them in full would let capacity grow without bound through claim-return cycles
/// (a unit returned at expiry and claimed again is counted again by the refill). With the
/// deduction, the balance never exceeds that of a key that never saw the returned units, so
/// the units served (dated at their claim) always conform to the bucket (docs/commands.md).
fn credit_balance(rate: &Rate, tokens: i128, n: u64, age: Nanos) -> Option<(u64, i128)> {
    let p = rate.period.as_i128();
    let refilled_meanwhile = age.max(Nanos::ZERO).as_i128() * rate.limit as i128;
    let added = (n as i128 * p - refilled_meanwhile).clamp(0, (rate.capacity_scaled() - tokens).max(0));
    let remaining = |t: i128| clamp_units(div_floor_i128(t, p), rate.burst);
    let credited = remaining(tokens + added) - remaining(tokens);
    (credited > 0).then_some((credited, tokens + added))
}

/// GCRA: the arrival time moves back by the credit, never before now (a full bucket).
pub fn credit_gcra(s: &gcra::State, n: u64, age: Nanos, now: Nanos) -> (u64, Option<gcra::State>) {
    let cap = s.rate.capacity_scaled();
    match credit_balance(&s.rate, s.tokens_scaled(now), n, age) {
        // tat = now + (capacity − balance), in scaled time.
        Some((credited, tokens)) => {
            let tat = now.as_i128() * s.rate.limit as i128 + cap - tokens;
            (credited, Some(gcra::State { rate: s.rate, tat }))
        }
        None => (0, None),
    }
}

/// Token bucket: refilled to now, then credited, never above BURST.
pub fn credit_token_bucket(
    s: &token_bucket::State,
    n: u64,
    age: Nanos,
    now: Nanos,
) -> (u64, Option<token_bucket::State>) {
    match credit_balance(&s.rate, s.tokens_scaled(now), n, age) {
        Some((credited, tokens)) => (credited, Some(token_bucket::State { rate: s.rate, tokens, last: now })),
        None => (0, None),
    }
}

/// True when the key's stored window is now's window and the claim, at the latest `age` ago,
/// was made in it too (windows are epoch-aligned: `now − age` ≤ the true claim instant ≤ now,
/// so both in one window puts the claim there).
fn claimed_in_current_window(stored_index: i64, window: Nanos, age: Nanos, now: Nanos) -> bool {
    let index = window_index(now, window);
    let earliest_claim = now.as_i128() - age.max(Nanos::ZERO).as_i128();
    stored_index == index && earliest_claim.div_euclid(window.as_i128()) == index as i128
}

/// Fixed window: the current window's count drops by up to n.
pub fn credit_fixed(s: &fixed::State, n: u64, age: Nanos, now: Nanos) -> (u64, Option<fixed::State>) {
    if !claimed_in_current_window(s.index, s.win.window, age, now) {
        return (0, None);
    }
    let credited = n.min(s.count);
    (credited, Some(fixed::State { count: s.count - credited, ..*s }))
}

/// Sliding counter: the current window's count drops by up to n; the previous window's count
/// (units of a window that has passed) never changes.
pub fn credit_sliding(s: &sliding::State, n: u64, age: Nanos, now: Nanos) -> (u64, Option<sliding::State>) {
    if !claimed_in_current_window(s.index, s.win.window, age, now) {
        return (0, None);
    }
    let credited = n.min(s.curr);
    (credited, Some(sliding::State { curr: s.curr - credited, ..*s }))
}
