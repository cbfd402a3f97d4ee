//! Fixed window: one counter per epoch-aligned window. Kept on purpose for quotas and daily
//! caps; it lets up to twice the limit through around a window edge (the harness shows it).
//! Limited requests are not counted.

use super::{to_nanos, window_index, Decision, Nanos, Request, Window, MAX_COUNT};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    pub win: Window,
    /// Index of the counted window: start = index × window.
    pub index: i64,
    pub count: u64,
}

impl State {
    /// The count as seen at `now`: zero in a later window; a clock stepped back into an
    /// earlier window keeps the stored one (never hands out capacity).
    pub fn at(&self, now: Nanos) -> State {
        let index = window_index(now, self.win.window);
        if index > self.index {
            State { index, count: 0, ..*self }
        } else {
            *self
        }
    }

    /// A loaded state brought into the range calls store (identity on every such state): the
    /// window index of an i64 instant (as for the sliding counter), and a count of at most
    /// MAX_COUNT (a call counts at most the limit; any count at or above the limit answers the
    /// same).
    pub(crate) fn normalised(self) -> State {
        State { index: super::clamp_index(self.index, self.win.window), count: self.count.min(MAX_COUNT), ..self }
    }

    fn end(&self) -> i128 {
        (self.index as i128 + 1) * self.win.window.as_i128()
    }
}

pub fn check(state: Option<&State>, win: &Window, now: Nanos, req: Request) -> (Decision, Option<State>) {
    let s = match state {
        None => State { win: *win, index: window_index(now, win.window), count: 0 },
        Some(old) if old.win.window == win.window => State { win: *win, ..old.at(now) },
        // A new window length: what the old window counted is carried into the new one.
        Some(old) => State { win: *win, index: window_index(now, win.window), count: old.at(now).count },
    };
    let available = win.limit.saturating_sub(s.count);
    let granted = req.grant(available);
    let after = State { count: s.count.saturating_add(granted), ..s };
    let to_end = to_nanos(s.end() - now.as_i128());
    let decision = Decision {
        allowed: granted,
        limit: win.limit,
        remaining: win.limit.saturating_sub(after.count),
        retry_after: if granted > 0 || req.cost == 0 || req.needed() > win.limit { None } else { Some(to_end) },
        reset_after: if after.count > 0 { to_end } else { Nanos::ZERO },
        delay: None,
    };
    // New parameters are kept even when nothing is granted (see gcra).
    let converted = state.is_some_and(|s| s.win != *win) && req.cost > 0 && decision.reset_after > Nanos::ZERO;
    (decision, if granted > 0 || converted { Some(after) } else { None })
}
