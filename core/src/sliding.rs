//! Sliding window counter: two epoch-aligned window counts, the previous one weighted by how
//! much of it still overlaps the trailing window. All in integers: instead of
//! `prev × (1 − elapsed/window) + curr + cost ≤ limit` it compares
//! `prev × (window − elapsed) + (curr + cost) × window ≤ limit × window`.

use super::{
    clamp_units, div_ceil_i128, div_floor_i128, div_trunc_i128, to_nanos, window_index, Decision, Nanos, Request,
    Window, MAX_STORED_COUNT,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    pub win: Window,
    /// Index of the current window: start = index × window.
    pub index: i64,
    pub prev: u64,
    pub curr: u64,
}

impl State {
    /// The counts as seen at `now` (rolled forward to now's window). A clock that stepped back
    /// into an earlier window keeps the stored window, seen from its very start: the most
    /// restrictive view, so it never hands out capacity.
    pub fn at(&self, now: Nanos) -> State {
        let index = window_index(now, self.win.window);
        // In i128: a stored index comes from the payload (RL.SETSTATE) and may be any i64.
        let (prev, curr) = match index as i128 - self.index as i128 {
            d if d < 0 => return State { ..*self },
            0 => (self.prev, self.curr),
            1 => (self.curr, 0),
            _ => (0, 0),
        };
        State { win: self.win, index, prev, curr }
    }

    /// `limit × window − weighted count`: the free capacity at `now`, in units × window.
    fn free_weighted(&self, elapsed: i128) -> i128 {
        let w = self.win.window.as_i128();
        self.win.limit as i128 * w - self.prev as i128 * (w - elapsed) - self.curr as i128 * w
    }

    /// The weighted estimate of units in the trailing window, rounded up.
    pub fn estimate(&self, now: Nanos) -> u64 {
        let s = self.at(now);
        let w = s.win.window.as_i128();
        let elapsed = s.elapsed(now);
        let weighted = s.prev as i128 * (w - elapsed) + s.curr as i128 * w;
        div_ceil_i128(weighted, w).max(0) as u64
    }

    /// A loaded state brought into the range calls store: the window index of an i64 instant
    /// (identity on every such state; counts up to MAX_STORED_COUNT are reachable and kept). An
    /// index before every instant answers as before (a window long past); one after every
    /// instant, a window that would never begin, becomes the last window.
    pub(crate) fn normalised(self) -> State {
        State { index: super::clamp_index(self.index, self.win.window), ..self }
    }

    fn elapsed(&self, now: Nanos) -> i128 {
        (now.as_i128() - self.index as i128 * self.win.window.as_i128()).clamp(0, self.win.window.as_i128())
    }
}

pub fn check(state: Option<&State>, win: &Window, now: Nanos, req: Request) -> (Decision, Option<State>) {
    let w = win.window.as_i128();
    let s = match state {
        None => State { win: *win, index: window_index(now, win.window), prev: 0, curr: 0 },
        Some(old) if old.win.window == win.window => State { win: *win, ..old.at(now) },
        // A new window length: the old estimate is carried into the new current window, at most
        // MAX_STORED_COUNT (prev + curr of an over-full key can exceed what the decoder accepts).
        Some(old) => State {
            win: *win,
            index: window_index(now, win.window),
            prev: 0,
            curr: old.estimate(now).min(MAX_STORED_COUNT),
        },
    };
    let elapsed = s.elapsed(now);
    let free = s.free_weighted(elapsed);
    let available = clamp_units(div_floor_i128(free, w), win.limit);
    let granted = req.grant(available);
    let after = State { curr: s.curr.saturating_add(granted), ..s };
    let decision = Decision {
        allowed: granted,
        limit: win.limit,
        remaining: clamp_units(div_floor_i128(after.free_weighted(elapsed), w), win.limit),
        retry_after: if granted > 0 || req.cost == 0 { None } else { retry_after(&s, now, req.needed()) },
        reset_after: reset_after(&after, now),
        delay: None,
    };
    // New parameters are kept even when nothing is granted (see gcra).
    let converted = state.is_some_and(|s| s.win != *win) && req.cost > 0 && decision.reset_after > Nanos::ZERO;
    (decision, if granted > 0 || converted { Some(after) } else { None })
}

/// Exact time until `need` units fit: later in this window as the previous window's weight
/// decays, or in the next one as the current count becomes the decaying previous count.
fn retry_after(s: &State, now: Nanos, need: u64) -> Option<Nanos> {
    let (w, limit) = (s.win.window.as_i128(), s.win.limit as i128);
    let need = need as i128;
    if need > limit {
        return None;
    }
    // Until the end of the stored window: `w − elapsed`, or more when the clock stepped back
    // into an earlier window (the stored window then has not even begun).
    let to_end = (s.index as i128 + 1) * w - now.as_i128();
    let room_now = (limit - s.curr as i128 - need) * w;
    let wait = if room_now >= 0 && s.prev > 0 {
        // prev × (w − elapsed − t) ≤ room_now
        to_end - div_trunc_i128(room_now, s.prev as i128)
    } else {
        // Next window: curr × (w − e2) ≤ (limit − need) × w, with e2 ≥ 0.
        let room_next = (limit - need) * w;
        let e2 = if s.curr == 0 { 0 } else { (w - div_trunc_i128(room_next, s.curr as i128)).max(0) };
        to_end + e2
    };
    Some(to_nanos(wait.max(1)))
}

/// Until both counts have stopped contributing: the end of the next window while the current
/// one counts anything, else the end of this one.
fn reset_after(s: &State, now: Nanos) -> Nanos {
    let w = s.win.window.as_i128();
    let end = if s.curr > 0 {
        (s.index as i128 + 2) * w
    } else if s.prev > 0 {
        (s.index as i128 + 1) * w
    } else {
        return Nanos::ZERO;
    };
    to_nanos(end - now.as_i128())
}
