//! RL.INFO's fields: what a stored state says about itself at `now` (its algorithm, its
//! parameters, its state in µs and units, and what is available now). The module adds the
//! key's TTL and replies with them.

use super::codec::State;
use super::Nanos;

/// A field's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Int(i64),
    Text(&'static str),
}

/// The fields of `state` at `now`, in reply order.
pub fn fields(state: &State, now: Nanos) -> Vec<(&'static str, Field)> {
    let us = |ns: i128| Field::Int((ns / 1_000).clamp(i64::MIN as i128, i64::MAX as i128) as i64);
    let int = |v: u64| Field::Int(v.min(i64::MAX as u64) as i64);
    // (room for the longest list and the module's ttl_ms)
    let mut f: Vec<(&'static str, Field)> = Vec::with_capacity(9);
    f.push(("algorithm", Field::Text(state.algorithm().name())));
    match state {
        State::Gcra(s) | State::Leaky(super::leaky::State(s)) => {
            let tokens = s.tokens_scaled(now).max(0) / s.rate.period.as_i128();
            f.extend([
                ("limit", int(s.rate.limit)),
                ("period_us", us(s.rate.period.as_i128())),
                ("burst", int(s.rate.burst)),
                ("tat_us", us(s.tat_nanos())),
                ("available", int(tokens as u64)),
            ]);
        }
        State::TokenBucket(s) => {
            let tokens = s.tokens_scaled(now).max(0) / s.rate.period.as_i128();
            f.extend([
                ("limit", int(s.rate.limit)),
                ("period_us", us(s.rate.period.as_i128())),
                ("burst", int(s.rate.burst)),
                ("tokens", int((s.tokens.max(0) / s.rate.period.as_i128()) as u64)),
                ("last_us", us(s.last.as_i128())),
                ("available", int(tokens as u64)),
            ]);
        }
        State::Sliding(s) => f.extend([
            ("limit", int(s.win.limit)),
            ("window_us", us(s.win.window.as_i128())),
            ("window_start_us", us(s.index as i128 * s.win.window.as_i128())),
            ("previous", int(s.prev)),
            ("current", int(s.curr)),
            ("estimate", int(s.estimate(now))),
        ]),
        State::Fixed(s) => f.extend([
            ("limit", int(s.win.limit)),
            ("window_us", us(s.win.window.as_i128())),
            ("window_start_us", us(s.index as i128 * s.win.window.as_i128())),
            ("count", int(s.count)),
        ]),
        State::SlidingLog(s) => f.extend([
            ("limit", int(s.win.limit)),
            ("window_us", us(s.win.window.as_i128())),
            ("entries", int(s.log.len() as u64)),
            ("units", int(s.log.total)),
            ("in_window", int(s.in_window(now))),
            ("oldest_us", Field::Int(s.log.oldest().unwrap_or(-1))),
            ("newest_us", Field::Int(s.log.newest().unwrap_or(-1))),
        ]),
    }
    f
}

/// The fields of a key redis-cell left: it stores only the arrival time (in ns; shown in µs,
/// rounded up), its parameters come with each call.
pub fn cell_fields(tat_ns: i64) -> [(&'static str, Field); 3] {
    let tat_us = tat_ns.div_euclid(1_000) + (tat_ns.rem_euclid(1_000) != 0) as i64;
    [("algorithm", Field::Text("gcra")), ("source", Field::Text("redis-cell")), ("tat_us", Field::Int(tat_us))]
}
