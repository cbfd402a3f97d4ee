//! A uniform driver over all six algorithms of the pure core (state kept as the codec's
//! `State`) and the proptest configuration, shared by the core tests (core_examples,
//! core_props, give_back_props, core_closure_props). No Redis needed.
//! Included with `#[path = "common/core_dispatch.rs"] mod core_dispatch;` (not a test target).
#![allow(dead_code)]

use redis_ratelimit_core::codec::{Algorithm, State};
use redis_ratelimit_core::{
    fixed, gcra, leaky, sliding, sliding_log, token_bucket, Decision, Nanos, Rate, Request, Window,
};

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
            Params::Rate(r) => (r.period as i128 / r.limit as i128).max(1),
            Params::Win(w) => w.window as i128,
        }
    }
}

pub fn check(algo: Algorithm, st: Option<&State>, p: &Params, now: Nanos, r: Request) -> (Decision, Option<State>) {
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
