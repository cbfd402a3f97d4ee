//! A uniform driver over all six algorithms of the pure core (state kept as the codec's
//! `State`) and the proptest configuration, shared by the core tests (core_examples,
//! core_props, give_back_props, core_closure_props). No Redis needed.
//! Included with `#[path = "common/core_dispatch.rs"] mod core_dispatch;` (not a test target).
//!
//! The core tests count time in raw i64 nanoseconds (their arithmetic, literals and model
//! clocks): [`ns`] makes one the core's `Nanos`, and the decisions they read are the core's with
//! their times raw ([`RawDecision`]; [`raw`] runs each algorithm's own `check` at a raw instant).
#![allow(dead_code)]

use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::Algorithm;
use redis_ratelimit_core::{fixed, gcra, leaky, sliding, sliding_log, token_bucket, Nanos, Rate, Request, Window};

/// A raw instant or span, as the core takes it.
pub fn ns(raw: i64) -> Nanos {
    Nanos::new(raw)
}

/// The core's decision with its times as raw i64 nanoseconds (every field as the core's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawDecision {
    pub allowed: u64,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after: Option<i64>,
    pub reset_after: i64,
    pub delay: Option<i64>,
}

impl From<redis_ratelimit_core::Decision> for RawDecision {
    fn from(d: redis_ratelimit_core::Decision) -> RawDecision {
        RawDecision {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            retry_after: d.retry_after.map(Nanos::as_i64),
            reset_after: d.reset_after.as_i64(),
            delay: d.delay.map(Nanos::as_i64),
        }
    }
}

impl RawDecision {
    /// True when the request asked for units and got none (the core's rule).
    pub fn limited(&self, req: &Request) -> bool {
        req.cost > 0 && self.allowed == 0
    }
}

/// Each algorithm's own `check` at a raw instant, its decision raw.
pub mod raw {
    use super::{ns, RawDecision};
    use redis_ratelimit_core::{fixed, gcra, leaky, sliding, sliding_log, token_bucket, Rate, Request, Window};

    macro_rules! raw_check {
        ($($name:ident: $module:ident, $params:ty, $out:ty;)*) => {$(
            pub fn $name(state: Option<&$module::State>, p: &$params, now: i64, r: Request) -> (RawDecision, Option<$out>) {
                let (d, n) = $module::check(state, p, ns(now), r);
                (d.into(), n)
            }
        )*};
    }

    raw_check! {
        gcra: gcra, Rate, gcra::State;
        token_bucket: token_bucket, Rate, token_bucket::State;
        leaky: leaky, Rate, leaky::State;
        sliding: sliding, Window, sliding::State;
        fixed: fixed, Window, fixed::State;
        sliding_log: sliding_log, Window, sliding_log::Commit;
    }
}

/// proptest's configuration for `cases` cases, without a regressions file.
pub fn config(cases: u32) -> proptest::test_runner::Config {
    proptest::test_runner::Config { cases, failure_persistence: None, ..Default::default() }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Params {
    Rate(Rate),
    Win(Window),
}

impl Params {
    pub fn capacity(&self) -> u64 {
        match self {
            Params::Rate(r) => r.burst,
            Params::Win(w) => w.limit,
        }
    }

    /// The natural time scale: one emission interval, or one window.
    pub fn unit(&self) -> i128 {
        match self {
            Params::Rate(r) => (r.period.as_i128() / r.limit as i128).max(1),
            Params::Win(w) => w.window.as_i128(),
        }
    }
}

/// One call of `algo` at the raw instant `now`.
pub fn check(algo: Algorithm, st: Option<&State>, p: &Params, now: i64, r: Request) -> (RawDecision, Option<State>) {
    let (d, n) = check_at(algo, st, p, ns(now), r);
    (d.into(), n)
}

/// [`check`] at the core's `Nanos`, its decision the core's.
pub fn check_at(
    algo: Algorithm,
    st: Option<&State>,
    p: &Params,
    now: Nanos,
    r: Request,
) -> (redis_ratelimit_core::Decision, Option<State>) {
    macro_rules! un {
        ($variant:path) => {
            st.map(|s| match s {
                $variant(x) => x,
                other => panic!("state {other:?} given to {algo:?}"),
            })
        };
    }
    match (algo, p) {
        (Algorithm::Gcra, Params::Rate(rate)) => {
            let (d, n) = gcra::check(un!(State::Gcra), rate, now, r);
            (d, n.map(State::Gcra))
        }
        (Algorithm::TokenBucket, Params::Rate(rate)) => {
            let (d, n) = token_bucket::check(un!(State::TokenBucket), rate, now, r);
            (d, n.map(State::TokenBucket))
        }
        (Algorithm::Leaky, Params::Rate(rate)) => {
            let (d, n) = leaky::check(un!(State::Leaky), rate, now, r);
            (d, n.map(State::Leaky))
        }
        (Algorithm::Sliding, Params::Win(w)) => {
            let (d, n) = sliding::check(un!(State::Sliding), w, now, r);
            (d, n.map(State::Sliding))
        }
        (Algorithm::Fixed, Params::Win(w)) => {
            let (d, n) = fixed::check(un!(State::Fixed), w, now, r);
            (d, n.map(State::Fixed))
        }
        (Algorithm::SlidingLog, Params::Win(w)) => {
            let old = un!(State::SlidingLog).map(|b| &**b);
            let (d, c) = sliding_log::check(old, w, now, r);
            let n = c.map(|c| {
                let mut s = old.cloned().unwrap_or_else(|| sliding_log::State::new(*w));
                s.apply(&c);
                State::SlidingLog(Box::new(s))
            });
            (d, n)
        }
        (a, p) => panic!("{a:?} with {p:?}"),
    }
}
