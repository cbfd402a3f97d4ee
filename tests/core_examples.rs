//! Hand-checked examples for the pure algorithm core (`redis_ratelimit_core`): the documented
//! examples, extreme rates, window boundaries, exact retry/reset times and partial grants.
//! No Redis needed.

use redis_ratelimit_core::{
    codec, gcra, sliding, sliding_log, Rate, Request, Window, MAX_COUNT, NANOS_PER_MICRO, NANOS_PER_MILLI,
    NANOS_PER_SEC,
};

use codec::State;
use redis_ratelimit_core::Algorithm;

#[path = "common/core_dispatch.rs"]
mod core_dispatch;

use core_dispatch::{check, ns, raw, Params, RawDecision};

/// A realistic "now": 2023-11-14T22:13:20Z.
const T0: i64 = 1_700_000_000 * NANOS_PER_SEC;
const MS: i64 = NANOS_PER_MILLI;
const US: i64 = NANOS_PER_MICRO;
const SEC: i64 = NANOS_PER_SEC;
const MAX_PERIOD: i64 = redis_ratelimit_core::MAX_PERIOD.as_i64();

fn req(cost: u64) -> Request {
    Request::new(cost)
}

fn partial(cost: u64) -> Request {
    Request { cost, partial: true }
}

// ---------------------------------------------------------------------------------------------
// A uniform driver over all six algorithms: `check` and `Params` in common/core_dispatch.rs.

/// Runs one call and stores the new state (a limited call leaves the state as it was).
fn step(algo: Algorithm, st: &mut Option<State>, p: &Params, now: i64, r: Request) -> RawDecision {
    let (d, n) = check(algo, st.as_ref(), p, now, r);
    if let Some(n) = n {
        *st = Some(n);
    }
    d
}

fn rate(limit: u64, period: i64, burst: u64) -> Rate {
    Rate::new(limit, ns(period), burst).expect("valid rate")
}

fn win(limit: u64, window: i64) -> Window {
    Window::new(limit, ns(window)).expect("valid window")
}

/// Milliseconds as the module replies them: rounded up (`Nanos::as_millis_ceil`).
fn ceil_ms(raw: i64) -> i64 {
    ns(raw).as_millis_ceil() as i64
}

const BUCKETS: [Algorithm; 3] = [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::Leaky];
const WINDOWS: [Algorithm; 3] = [Algorithm::Sliding, Algorithm::Fixed, Algorithm::SlidingLog];

/// (allowed, limit, remaining, retry_after ms, reset_after ms), as the module replies.
type Reply = (u64, u64, u64, Option<i64>, i64);

fn reply(d: &RawDecision) -> Reply {
    (d.allowed, d.limit, d.remaining, d.retry_after.map(ceil_ms), ceil_ms(d.reset_after))
}

// ---------------------------------------------------------------------------------------------
// The documented example: limit 1 per second, BURST 5.

fn documented_example(algo: Algorithm) {
    let p = Params::Rate(rate(1, SEC, 5));
    let mut st = None;
    let mut go = |now: i64, cost: u64| reply(&step(algo, &mut st, &p, now, req(cost)));
    assert_eq!(go(T0, 6), (0, 5, 5, None, 0), "{algo:?}: COST 6 can never fit");
    for i in 1..=5u64 {
        assert_eq!(go(T0, 1), (1, 5, 5 - i, None, 1000 * i as i64), "{algo:?}: call {i}");
    }
    assert_eq!(go(T0, 1), (0, 5, 0, Some(1000), 5000), "{algo:?}: sixth call");
    assert_eq!(go(T0 + 3000 * MS, 1), (1, 5, 2, None, 3000), "{algo:?}: at +3000 ms");
    assert_eq!(go(T0 + 3100 * MS, 1), (1, 5, 1, None, 3900), "{algo:?}: at +3100 ms");
}

#[test]
fn documented_example_gcra() {
    documented_example(Algorithm::Gcra);
}

#[test]
fn documented_example_token_bucket() {
    documented_example(Algorithm::TokenBucket);
}

#[test]
fn documented_example_leaky_same_answers() {
    documented_example(Algorithm::Leaky);
}

#[test]
fn documented_example_gcra_and_token_bucket_identical_in_ns() {
    let r = rate(1, SEC, 5);
    let (mut g, mut t) = (None, None);
    let calls = [
        (T0, 6),
        (T0, 1),
        (T0, 1),
        (T0, 1),
        (T0, 1),
        (T0, 1),
        (T0, 1),
        (T0 + 3000 * MS, 1),
        (T0 + 3100 * MS, 1),
        (T0 + 3100 * MS, 0),
    ];
    for (now, cost) in calls {
        let (dg, ng) = raw::gcra(g.as_ref(), &r, now, req(cost));
        let (dt, nt) = raw::token_bucket(t.as_ref(), &r, now, req(cost));
        assert_eq!(dg, dt, "at {now} cost {cost}");
        assert_eq!(dg.delay, None);
        g = ng.or(g);
        t = nt.or(t);
    }
}

// ---------------------------------------------------------------------------------------------
// Sliding window counter: 80 in the previous window, 30 in this one, 15 s in.

#[test]
fn sliding_counter_documented_example() {
    let w = win(100, 60 * SEC);
    let now = 1_700_000_040 * SEC + 15 * SEC; // 1_700_000_040 s is a multiple of 60 s
    let index = now.div_euclid(w.window.as_i64());
    assert_eq!(now - index * w.window.as_i64(), 15 * SEC);
    let s = sliding::State { win: w, index, prev: 80, curr: 30 };
    assert_eq!(s.estimate(ns(now)), 90); // 80 × 45/60 + 30
    let (d, n) = raw::sliding(Some(&s), &w, now, req(1));
    assert_eq!((d.allowed, d.limit, d.remaining, d.retry_after), (1, 100, 9, None));
    let n = n.expect("admitted");
    assert_eq!((n.index, n.prev, n.curr), (index, 80, 31));
    // Until the end of the next window, as the current window still counts.
    assert_eq!(d.reset_after, 60 * SEC + 45 * SEC);

    // Ten more fit, eleven do not; the eleven fit exactly when 80 × (45 s − t)/60 s ≤ 59, i.e.
    // after 0.75 s.
    let (d, _) = raw::sliding(Some(&s), &w, now, req(10));
    assert_eq!((d.allowed, d.remaining), (10, 0));
    let (d, none) = raw::sliding(Some(&s), &w, now, req(11));
    assert!(none.is_none());
    assert_eq!((d.allowed, d.remaining, d.retry_after), (0, 10, Some(750 * MS)));
    assert_eq!(raw::sliding(Some(&s), &w, now + 750 * MS - 1, req(11)).0.allowed, 0);
    assert_eq!(raw::sliding(Some(&s), &w, now + 750 * MS, req(11)).0.allowed, 11);

    // A full current window waits for the next one, then until 100 × (60 s − e) ≤ 99 × 60 s.
    let full = sliding::State { win: w, index, prev: 0, curr: 100 };
    let (d, _) = raw::sliding(Some(&full), &w, now, req(1));
    assert_eq!(d.retry_after, Some(45 * SEC + 600 * MS));
    assert_eq!(raw::sliding(Some(&full), &w, now + 45 * SEC + 600 * MS - 1, req(1)).0.allowed, 0);
    assert_eq!(raw::sliding(Some(&full), &w, now + 45 * SEC + 600 * MS, req(1)).0.allowed, 1);
    // COST above the limit never fits.
    assert_eq!(raw::sliding(Some(&full), &w, now, req(101)).0.retry_after, None);
}

// ---------------------------------------------------------------------------------------------
// Leaky bucket: evenly spaced departures.

#[test]
fn leaky_delays_are_whole_intervals() {
    let r = rate(1, SEC, 5);
    let mut st = None;
    for k in 0..5 {
        let (d, n) = raw::leaky(st.as_ref(), &r, T0, req(1));
        assert_eq!(d.allowed, 1);
        assert_eq!(d.delay, Some(k * SEC), "request {k}");
        st = n;
    }
    let (d, n) = raw::leaky(st.as_ref(), &r, T0, req(1));
    assert!(n.is_none(), "never more than BURST queued");
    assert_eq!((d.allowed, d.delay, d.retry_after), (0, None, Some(SEC)));
    // One interval later the head has left: the next one waits behind four.
    let (d, _) = raw::leaky(st.as_ref(), &r, T0 + SEC, req(1));
    assert_eq!((d.allowed, d.delay), (1, Some(4 * SEC)));
}

#[test]
fn leaky_delays_with_fractional_interval() {
    // 3 per second: the interval is 333_333_333.3 ns; delays are rounded up, never early.
    let r = rate(3, SEC, 5);
    let mut st = None;
    let want = [0, 333_333_334, 666_666_667, 1_000_000_000, 1_333_333_334];
    for (k, w) in want.iter().enumerate() {
        let (d, n) = raw::leaky(st.as_ref(), &r, T0, req(1));
        assert_eq!((d.allowed, d.delay), (1, Some(*w)), "request {k}");
        st = n;
    }
    assert_eq!(raw::leaky(st.as_ref(), &r, T0, req(1)).0.allowed, 0);
    // A second later three have left; the queue still holds two (2 intervals).
    let (d, _) = raw::leaky(st.as_ref(), &r, T0 + SEC, req(1));
    assert_eq!((d.allowed, d.delay), (1, Some(666_666_667)));
    // A multi-unit grant waits for what is queued ahead of its first unit.
    let (d, _) = raw::leaky(st.as_ref(), &r, T0 + SEC, req(3));
    assert_eq!((d.allowed, d.delay), (3, Some(666_666_667)));
    let (d, _) = raw::leaky(st.as_ref(), &r, T0 + SEC, req(4));
    assert_eq!((d.allowed, d.delay), (0, None));
}

#[test]
fn leaky_never_admits_more_than_burst_at_once() {
    for burst in [1u64, 2, 7, 100] {
        let p = Params::Rate(rate(10, SEC, burst));
        let mut st = None;
        let mut total = 0;
        for _ in 0..(burst * 2 + 3) {
            total += step(Algorithm::Leaky, &mut st, &p, T0, req(1)).allowed;
        }
        assert_eq!(total, burst);
        assert_eq!(step(Algorithm::Leaky, &mut None, &p, T0, partial(burst * 3)).allowed, burst);
    }
}

/// Issue 17.4, through a change of parameters: 50 requests queued at 1/s with BURST 100 (delays
/// 0–49 s), then BURST 10. The call at BURST 10 used to be admitted with delay 0 (the token
/// count was carried over, not the queue): the 50 promised slots are kept instead.
#[test]
fn leaky_lowered_burst_keeps_the_promised_slots() {
    let deep = rate(1, SEC, 100);
    let shallow = rate(1, SEC, 10);
    let mut st = None;
    for k in 0..50 {
        let (d, n) = raw::leaky(st.as_ref(), &deep, T0, req(1));
        assert_eq!((d.allowed, d.delay), (1, Some(k * SEC)), "request {k}");
        st = n;
    }
    // 50 s of queue, 9 s fit at BURST 10: limited for 41 s, and nothing is written (the
    // drain instant does not depend on the parameters).
    let (d, n) = raw::leaky(st.as_ref(), &shallow, T0, req(1));
    assert_eq!((d.allowed, d.remaining, d.retry_after, d.reset_after, d.delay), (0, 0, Some(41 * SEC), 50 * SEC, None));
    assert!(n.is_none(), "a limited call stores nothing");
    assert_eq!(raw::leaky(st.as_ref(), &deep, T0, req(1)).0.delay, Some(50 * SEC), "BURST 100 still queues at 50 s");
    assert_eq!(raw::leaky(st.as_ref(), &shallow, T0 + 41 * SEC - 1, req(1)).0.allowed, 0);
    // At retry_after: the old drain slot (T0 + 50 s), and the queue is 10 deep again.
    let now = T0 + 41 * SEC;
    let (d, n) = raw::leaky(st.as_ref(), &shallow, now, req(1));
    assert_eq!((d.allowed, d.remaining, d.delay, d.reset_after), (1, 0, Some(9 * SEC), 10 * SEC));
    st = n;
    let (d, _) = raw::leaky(st.as_ref(), &shallow, now, req(1));
    assert_eq!((d.allowed, d.retry_after), (0, Some(SEC)));

    // A faster rate (2/s, BURST 10) at +42 s: 9 s of queue is 18 new intervals; 9 fit behind
    // 4.5 s, so the wait is 4.5 s, and the request leaves when the queue drains (+51 s).
    let fast = rate(2, SEC, 10);
    let now = T0 + 42 * SEC;
    let (d, _) = raw::leaky(st.as_ref(), &fast, now, req(1));
    assert_eq!((d.allowed, d.retry_after, d.reset_after), (0, Some(4_500 * MS), 9 * SEC));
    let now = now + 4_500 * MS;
    let (d, n) = raw::leaky(st.as_ref(), &fast, now, req(1));
    assert_eq!((d.allowed, d.delay), (1, Some(4_500 * MS)));
    st = n;
    assert_eq!(raw::leaky(st.as_ref(), &fast, now, req(1)).0.allowed, 0, "10 new intervals queued");
    // A raised BURST admits behind the queue, the new interval apart: +51.5 s, +52 s, +52.5 s.
    let wide = rate(2, SEC, 100);
    for k in 1..=3 {
        let (d, n) = raw::leaky(st.as_ref(), &wide, now, req(1));
        assert_eq!((d.allowed, d.delay), (1, Some(4_500 * MS + k * 500 * MS)), "request {k} at BURST 100");
        st = n;
    }
    // And a longer period (1 per 2 s): the queue still drains at +53 s; the next leaves then.
    let slow = rate(1, 2 * SEC, 100);
    let (d, n) = raw::leaky(st.as_ref(), &slow, now, req(1));
    assert_eq!((d.allowed, d.delay, d.reset_after), (1, Some(6_500 * MS), 8_500 * MS));
    let (d, _) = raw::leaky(n.as_ref(), &slow, now, req(1));
    assert_eq!(d.delay, Some(8_500 * MS));
}

// ---------------------------------------------------------------------------------------------
// Extreme rates stay exact.

#[test]
fn one_billion_per_second() {
    let r = rate(1_000_000_000, SEC, 1_000_000_000);
    let p = Params::Rate(r);
    for algo in BUCKETS {
        let mut st = None;
        let d = step(algo, &mut st, &p, T0, partial(2_000_000_000));
        assert_eq!((d.allowed, d.remaining, d.reset_after), (1_000_000_000, 0, SEC), "{algo:?}");
        let d = step(algo, &mut st, &p, T0, req(1));
        assert_eq!((d.allowed, d.retry_after, d.reset_after), (0, Some(1), SEC), "{algo:?}");
        // After 1 µs exactly 1000 more.
        let d = step(algo, &mut st, &p, T0 + US, req(1001));
        assert_eq!((d.allowed, d.remaining, d.retry_after), (0, 1000, Some(1)), "{algo:?}");
        let d = step(algo, &mut st, &p, T0 + US, partial(5000));
        assert_eq!((d.allowed, d.remaining), (1000, 0), "{algo:?}");
        assert_eq!(step(algo, &mut st, &p, T0 + US, req(1)).allowed, 0);
        // And one per nanosecond after that.
        for i in 1..=1000 {
            let d = step(algo, &mut st, &p, T0 + US + i, partial(10));
            assert_eq!((d.allowed, d.remaining), (1, 0), "{algo:?} at +1µs+{i}ns");
        }
        // Refilled after exactly a second of no traffic.
        let last = T0 + US + 1000;
        let d = step(algo, &mut st, &p, last + SEC - 1, req(1_000_000_000));
        assert_eq!((d.allowed, d.retry_after), (0, Some(1)), "{algo:?}");
        let d = step(algo, &mut st, &p, last + SEC, req(1_000_000_000));
        assert_eq!(d.allowed, 1_000_000_000, "{algo:?}");
    }
}

#[test]
fn one_per_nanosecond_burst_one() {
    let p = Params::Rate(rate(1_000_000_000, SEC, 1));
    for algo in BUCKETS {
        let mut st = None;
        for i in 0..1000 {
            let d = step(algo, &mut st, &p, T0 + i, req(1));
            assert_eq!((d.allowed, d.remaining, d.reset_after), (1, 0, 1), "{algo:?} {i}");
            let d = step(algo, &mut st, &p, T0 + i, req(1));
            assert_eq!((d.allowed, d.retry_after), (0, Some(1)), "{algo:?} {i}");
        }
    }
}

#[test]
fn max_count_per_nanosecond() {
    // 10^15 per ns: every scaled product is still exact.
    let p = Params::Rate(rate(MAX_COUNT, 1, MAX_COUNT));
    for algo in BUCKETS {
        let mut st = None;
        let d = step(algo, &mut st, &p, T0, req(MAX_COUNT));
        assert_eq!((d.allowed, d.remaining, d.reset_after), (MAX_COUNT, 0, 1), "{algo:?}");
        let d = step(algo, &mut st, &p, T0, req(1));
        assert_eq!((d.allowed, d.retry_after), (0, Some(1)), "{algo:?}");
        let d = step(algo, &mut st, &p, T0 + 1, req(MAX_COUNT));
        assert_eq!(d.allowed, MAX_COUNT, "{algo:?}");
    }
}

#[test]
fn one_per_hundred_years() {
    let p = Params::Rate(rate(1, MAX_PERIOD, 1));
    for algo in BUCKETS {
        let mut st = None;
        let d = step(algo, &mut st, &p, T0, req(1));
        assert_eq!((d.allowed, d.remaining, d.reset_after), (1, 0, MAX_PERIOD), "{algo:?}");
        assert_eq!(ceil_ms(d.reset_after), 3_155_760_000_000);
        let d = step(algo, &mut st, &p, T0, req(1));
        assert_eq!((d.allowed, d.retry_after), (0, Some(MAX_PERIOD)), "{algo:?}");
        let d = step(algo, &mut st, &p, T0 + MAX_PERIOD - 1, req(1));
        assert_eq!((d.allowed, d.retry_after, d.reset_after), (0, Some(1), 1), "{algo:?}");
        let d = step(algo, &mut st, &p, T0 + MAX_PERIOD, req(1));
        assert_eq!(d.allowed, 1, "{algo:?}");
    }
}

#[test]
fn seven_per_hundred_years_interval_is_not_rounded() {
    // 100 years / 7 is not a whole number of ns; unit k must come back at exactly
    // ceil(k × P / 7) and not one ns before.
    let p = Params::Rate(rate(7, MAX_PERIOD, 7));
    let at = |k: i128| T0 + ((k * MAX_PERIOD as i128 + 6) / 7) as i64;
    for algo in BUCKETS {
        let mut st = None;
        assert_eq!(step(algo, &mut st, &p, T0, req(7)).allowed, 7);
        for k in 1..=14i128 {
            let t = at(k);
            let d = step(algo, &mut st, &p, t - 1, req(1));
            assert_eq!((d.allowed, d.retry_after), (0, Some(1)), "{algo:?} unit {k}");
            let d = step(algo, &mut st, &p, t, req(1));
            assert_eq!((d.allowed, d.remaining), (1, 0), "{algo:?} unit {k}");
        }
    }
}

#[test]
fn rate_validation_bounds() {
    assert!(Rate::new(1, ns(MAX_PERIOD), 2).is_ok()); // 200 years to refill: the limit
    assert!(Rate::new(1, ns(MAX_PERIOD), 3).is_err());
    assert!(Rate::new(0, ns(SEC), 1).is_err());
    assert!(Rate::new(1, ns(SEC), 0).is_err());
    assert!(Rate::new(1, ns(0), 1).is_err());
    assert!(Rate::new(1, ns(MAX_PERIOD + 1), 1).is_err());
    assert!(Rate::new(MAX_COUNT + 1, ns(SEC), 1).is_err());
    assert!(Window::new(MAX_COUNT, ns(MAX_PERIOD)).is_ok());
    assert!(Window::new(1, ns(-1)).is_err());
}

#[test]
fn windows_with_extreme_parameters() {
    // MAX_COUNT units per 100-year window, in one request, then nothing until the window ends.
    let p = Params::Win(win(MAX_COUNT, MAX_PERIOD));
    for algo in WINDOWS {
        let mut st = None;
        let d = step(algo, &mut st, &p, T0, req(MAX_COUNT));
        assert_eq!((d.allowed, d.remaining), (MAX_COUNT, 0), "{algo:?}");
        let d = step(algo, &mut st, &p, T0, req(1));
        assert_eq!(d.allowed, 0, "{algo:?}");
        let r = d.retry_after.expect("fits later");
        assert!(r > 0 && r <= 2 * MAX_PERIOD, "{algo:?}: {r}");
        assert_eq!(step(algo, &mut st, &p, T0 + r - 1, req(1)).allowed, 0, "{algo:?}");
        assert_eq!(step(algo, &mut st, &p, T0 + r, req(1)).allowed, 1, "{algo:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Fixed window.

#[test]
fn fixed_window_boundary_lets_two_limits_through() {
    let w = win(100, 60 * SEC);
    let w0 = 1_700_000_040 * SEC; // a multiple of 60 s since the epoch
    assert_eq!(w0 % w.window.as_i64(), 0);
    let p = Params::Win(w);
    let mut st = None;
    for i in 1..=100u64 {
        let d = step(Algorithm::Fixed, &mut st, &p, w0 + 59 * SEC, req(1));
        assert_eq!((d.allowed, d.remaining, d.retry_after, d.reset_after), (1, 100 - i, None, SEC));
    }
    let d = step(Algorithm::Fixed, &mut st, &p, w0 + 59 * SEC, req(1));
    assert_eq!((d.allowed, d.remaining, d.retry_after, d.reset_after), (0, 0, Some(SEC), SEC));
    let d = step(Algorithm::Fixed, &mut st, &p, w0 + 60 * SEC - 1, req(1));
    assert_eq!((d.allowed, d.retry_after), (0, Some(1)));
    for i in 1..=100u64 {
        let d = step(Algorithm::Fixed, &mut st, &p, w0 + 60_100 * MS, req(1));
        assert_eq!((d.allowed, d.remaining, d.reset_after), (1, 100 - i, 59_900 * MS));
    }
    let d = step(Algorithm::Fixed, &mut st, &p, w0 + 60_100 * MS, req(1));
    assert_eq!((d.allowed, d.retry_after), (0, Some(59_900 * MS)));
    // Exactly at the window edge a fresh window begins.
    let d = step(Algorithm::Fixed, &mut st, &p, w0 + 120 * SEC, req(100));
    assert_eq!((d.allowed, d.remaining, d.reset_after), (100, 0, 60 * SEC));
}

#[test]
fn fixed_window_limited_requests_are_not_counted() {
    let w = win(3, SEC);
    let p = Params::Win(w);
    let mut st = None;
    assert_eq!(step(Algorithm::Fixed, &mut st, &p, T0, req(2)).allowed, 2);
    for _ in 0..10 {
        let d = step(Algorithm::Fixed, &mut st, &p, T0 + 1, req(2));
        assert_eq!((d.allowed, d.remaining), (0, 1));
    }
    let d = step(Algorithm::Fixed, &mut st, &p, T0 + 2, req(1));
    assert_eq!((d.allowed, d.remaining), (1, 0));
    let Some(State::Fixed(s)) = &st else { panic!() };
    assert_eq!((s.index, s.count), (T0 / SEC, 3));
    // COST above the limit: never fits, no retry.
    let d = step(Algorithm::Fixed, &mut st, &p, T0 + 3, req(4));
    assert_eq!((d.allowed, d.retry_after), (0, None));
}

// ---------------------------------------------------------------------------------------------
// Sliding log: exact on hand traces.

#[test]
fn sliding_log_hand_trace() {
    let p = Params::Win(win(3, 10 * MS));
    let a = Algorithm::SlidingLog;
    let mut st = None;
    let mut go = |now: i64, r: Request| {
        let d = step(a, &mut st, &p, now, r);
        (d.allowed, d.remaining, d.retry_after, d.reset_after)
    };
    assert_eq!(go(T0, req(1)), (1, 2, None, 10 * MS));
    assert_eq!(go(T0 + MS, req(1)), (1, 1, None, 10 * MS));
    assert_eq!(go(T0 + 2 * MS, req(1)), (1, 0, None, 10 * MS));
    // Full: the oldest leaves at T0 + 10 ms.
    assert_eq!(go(T0 + 5 * MS, req(1)), (0, 0, Some(5 * MS), 7 * MS));
    // Two units need the second oldest to leave too.
    assert_eq!(go(T0 + 5 * MS, req(2)), (0, 0, Some(6 * MS), 7 * MS));
    assert_eq!(go(T0 + 5 * MS, req(4)), (0, 0, None, 7 * MS));
    // One ns before the exact window age it still counts.
    assert_eq!(go(T0 + 10 * MS - 1, req(1)), (0, 0, Some(1), 2 * MS + 1));
    // Exactly `window` old: no longer counts.
    assert_eq!(go(T0 + 10 * MS, req(1)), (1, 0, None, 10 * MS));
    assert_eq!(go(T0 + 10 * MS, partial(5)), (0, 0, Some(MS), 10 * MS));
    assert_eq!(go(T0 + 12 * MS, partial(5)), (2, 0, None, 10 * MS));
    assert_eq!(go(T0 + 12 * MS, req(0)), (0, 0, None, 10 * MS));
    let Some(State::SlidingLog(s)) = &st else { panic!() };
    let ts0 = T0 / US;
    let got: Vec<_> = s.log.iter().collect();
    assert_eq!(got, vec![(ts0 + 10_000, 1), (ts0 + 12_000, 2)]);
    assert_eq!(s.log.total, 3);
    assert_eq!(s.in_window(ns(T0 + 20 * MS - 1)), 3);
    assert_eq!(s.in_window(ns(T0 + 20 * MS)), 2);
    assert_eq!(s.in_window(ns(T0 + 22 * MS)), 0);
}

#[test]
fn sliding_log_same_microsecond_merges_and_sub_microsecond_times() {
    let w = win(5, SEC);
    let p = Params::Win(w);
    let a = Algorithm::SlidingLog;
    let mut st = None;
    // Requests within one µs share an entry; it leaves at (µs + window) exactly.
    assert_eq!(step(a, &mut st, &p, T0 + 100, req(2)).allowed, 2);
    assert_eq!(step(a, &mut st, &p, T0 + 999, req(3)).allowed, 3);
    let Some(State::SlidingLog(s)) = &st else { panic!() };
    assert_eq!(s.log.len(), 1);
    let d = step(a, &mut st, &p, T0 + 999, req(1));
    assert_eq!(d.retry_after, Some(SEC - 999));
    assert_eq!(step(a, &mut st, &p, T0 + SEC - 1, req(1)).allowed, 0);
    assert_eq!(step(a, &mut st, &p, T0 + SEC, req(5)).allowed, 5);
}

#[test]
fn sliding_log_big_counts() {
    // Counts from BIG up do not fit an entry's stored word: they follow the words, in order.
    let big = sliding_log::BIG;
    let w = win(10 * big, SEC);
    let p = Params::Win(w);
    let a = Algorithm::SlidingLog;
    let mut st = None;
    assert_eq!(step(a, &mut st, &p, T0, req(big - 1)).allowed, big - 1);
    assert_eq!(step(a, &mut st, &p, T0, req(5)).allowed, 5); // merges past BIG
    assert_eq!(step(a, &mut st, &p, T0 + MS, req(3 * big)).allowed, 3 * big);
    assert_eq!(step(a, &mut st, &p, T0 + 2 * MS, req(7)).allowed, 7);
    assert_eq!(step(a, &mut st, &p, T0 + 2 * MS, req(1)).allowed, 1);
    let Some(State::SlidingLog(s)) = st.clone() else { panic!() };
    let got: Vec<_> = s.log.iter().collect();
    let ts0 = T0 / US;
    assert_eq!(got, vec![(ts0, big + 4), (ts0 + 1000, 3 * big), (ts0 + 2000, 8)]);
    assert_eq!(s.log.iter().filter(|e| e.1 >= big).count(), 2);
    let enc = State::SlidingLog(s.clone()).encode();
    assert_eq!(State::decode(&enc), Ok(State::SlidingLog(s)));
    let used = 4 * big + 12;
    let d = step(a, &mut st, &p, T0 + 3 * MS, req(10 * big - used + 1));
    assert_eq!((d.allowed, d.remaining, d.retry_after), (0, 10 * big - used, Some(SEC - 3 * MS)));
    assert_eq!(step(a, &mut st, &p, T0 + SEC, req(10 * big - used + 1)).allowed, 10 * big - used + 1);
    let Some(State::SlidingLog(s)) = &st else { panic!() };
    assert_eq!(s.log.total, 3 * big + 8 + 10 * big - used + 1);
    assert_eq!(s.log.iter().filter(|e| e.1 >= big).count(), 2);
}

// ---------------------------------------------------------------------------------------------
// Exact retry_after, exact reset_after, partial grants: every algorithm.

fn all_cases() -> Vec<(Algorithm, Params)> {
    let mut v = Vec::new();
    for r in [rate(1, SEC, 5), rate(3, SEC, 4), rate(7, 10 * MS, 1), rate(1_000_000_000, SEC, 1000)] {
        for a in BUCKETS {
            v.push((a, Params::Rate(r)));
        }
    }
    for w in [win(5, SEC), win(3, 7 * MS), win(100, 60 * SEC), win(1, US)] {
        for a in WINDOWS {
            v.push((a, Params::Win(w)));
        }
    }
    v
}

/// A small deterministic pseudo-random generator (no dependency on proptest here).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn retry_after_is_exact_for_every_algorithm() {
    for (algo, p) in all_cases() {
        let cap = p.capacity();
        let mut rng = Lcg(42);
        let mut st = None;
        let mut now = T0 + 123_456_789;
        let mut limited_seen = 0;
        for _ in 0..400 {
            // Mostly small steps, so the limiter is often full.
            now += match rng.next() % 4 {
                0 => 0,
                1 => (rng.next() as i64) % ((p.unit() as i64) / 3 + 1),
                2 => (rng.next() as i64) % ((p.unit() as i64) + 1),
                _ => (rng.next() as i64) % 1000,
            };
            if algo == Algorithm::SlidingLog && rng.next().is_multiple_of(2) {
                now += (US - now % US) % US; // µs-aligned half of the time
            }
            let cost = 1 + rng.next() % (cap + 1);
            let r = Request { cost, partial: rng.next().is_multiple_of(4) };
            let (d, _) = check(algo, st.as_ref(), &p, now, r);
            if let Some(wait) = d.retry_after {
                limited_seen += 1;
                assert!(wait > 0, "{algo:?} {p:?}");
                let (early, _) = check(algo, st.as_ref(), &p, now + wait - 1, r);
                assert_eq!(early.allowed, 0, "{algo:?} {p:?}: admitted 1 ns before retry_after {wait}");
                let (on_time, _) = check(algo, st.as_ref(), &p, now + wait, r);
                assert!(on_time.allowed > 0, "{algo:?} {p:?}: not admitted after retry_after {wait}");
            }
            step(algo, &mut st, &p, now, r);
        }
        assert!(limited_seen > 10, "{algo:?} {p:?}: only {limited_seen} limited calls");
    }
}

#[test]
fn reset_after_returns_to_a_fresh_key() {
    for (algo, p) in all_cases() {
        let cap = p.capacity();
        let mut rng = Lcg(7);
        let mut st = None;
        let mut now = T0 + 987_654_321;
        for i in 0..200 {
            now += (rng.next() as i64) % ((p.unit() as i64) / 2 + 1);
            let r = Request { cost: rng.next() % (cap + 2), partial: rng.next().is_multiple_of(3) };
            let d = step(algo, &mut st, &p, now, r);
            if i % 5 != 0 {
                continue;
            }
            let at = now + d.reset_after;
            for probe in [req(0), req(1), req(cap), req(cap + 1), partial(cap + 5), partial(1)] {
                let (on_state, _) = check(algo, st.as_ref(), &p, at, probe);
                let (fresh, _) = check(algo, None, &p, at, probe);
                assert_eq!(on_state, fresh, "{algo:?} {p:?}: not fresh after reset_after {}", d.reset_after);
            }
            if d.reset_after > 0 {
                // And not a nanosecond earlier.
                let (on_state, _) = check(algo, st.as_ref(), &p, at - 1, req(0));
                let (fresh, _) = check(algo, None, &p, at - 1, req(0));
                assert_ne!(on_state, fresh, "{algo:?} {p:?}: fresh before reset_after");
            }
        }
    }
}

#[test]
fn fresh_key_reset_after_is_zero() {
    for (algo, p) in all_cases() {
        let (d, n) = check(algo, None, &p, T0, req(0));
        assert!(n.is_none());
        assert_eq!((d.allowed, d.remaining, d.retry_after, d.reset_after), (0, p.capacity(), None, 0), "{algo:?}");
    }
}

#[test]
fn partial_grants_take_what_is_available() {
    for (algo, p) in all_cases() {
        let cap = p.capacity();
        if cap < 4 {
            continue;
        }
        let now = T0 - T0 % (p.unit() as i64).max(1) + 1; // early in a window
        let mut st = None;
        assert_eq!(step(algo, &mut st, &p, now, req(cap - 3)).allowed, cap - 3, "{algo:?}");
        let d = step(algo, &mut st, &p, now, req(5));
        assert_eq!((d.allowed, d.remaining), (0, 3), "{algo:?} all or nothing");
        let d = step(algo, &mut st, &p, now, partial(5));
        assert_eq!((d.allowed, d.remaining, d.retry_after), (3, 0, None), "{algo:?}");
        let d = step(algo, &mut st, &p, now, partial(5));
        assert_eq!((d.allowed, d.remaining), (0, 0), "{algo:?}");
        let wait = d.retry_after.expect("one unit comes back");
        // A partial request waits for one unit only.
        let d1 = step(algo, &mut st, &p, now, req(1));
        assert_eq!(d1.retry_after, Some(wait), "{algo:?}");
        let d = step(algo, &mut st, &p, now + wait, partial(5));
        assert!(d.allowed >= 1, "{algo:?}");
        // A partial grant of everything on a fresh key is capped at the capacity.
        assert_eq!(step(algo, &mut None, &p, now, partial(cap + 10)).allowed, cap, "{algo:?}");
        assert_eq!(step(algo, &mut None, &p, now, partial(2)).allowed, 2, "{algo:?}");
    }
}

#[test]
fn token_bucket_and_gcra_agree_across_a_rate_change_and_a_clock_step_back() {
    let rates = [rate(1, SEC, 5), rate(3, 2 * SEC, 2), rate(10, 7 * MS, 9)];
    let (mut g, mut t) = (None, None);
    let mut now = T0;
    let mut rng = Lcg(3);
    for i in 0..2000 {
        let r = &rates[(rng.next() % 3) as usize];
        now += (rng.next() as i64 % (2 * SEC)) - if i % 7 == 0 { 2 * SEC } else { 0 };
        let q = Request { cost: rng.next() % 11, partial: rng.next().is_multiple_of(2) };
        let (dg, ng) = raw::gcra(g.as_ref(), r, now, q);
        let (dt, nt) = raw::token_bucket(t.as_ref(), r, now, q);
        assert_eq!(dg, dt, "call {i}");
        assert_eq!(ng.is_some(), nt.is_some());
        g = ng.or(g);
        t = nt.or(t);
    }
}

#[test]
fn codec_round_trips_at_extreme_parameters() {
    // The largest limits at today's clock and at the end of the representable range: every
    // state the algorithms can write must decode again (RDB, replication, DUMP/RESTORE).
    let late = sliding_log::MAX_TS * US - 10 * SEC; // the year 2255
    let rates = [
        rate(MAX_COUNT, 1, MAX_COUNT),
        rate(MAX_COUNT, SEC, MAX_COUNT),
        rate(1, MAX_PERIOD, 2),
        rate(7, MAX_PERIOD, 7),
    ];
    let wins = [win(MAX_COUNT, 1), win(MAX_COUNT, MAX_PERIOD), win(1, 1)];
    for now in [T0, late, i64::MAX - 10 * SEC] {
        for (algos, ps) in [(BUCKETS, rates.map(Params::Rate).to_vec()), (WINDOWS, wins.map(Params::Win).to_vec())] {
            for algo in algos {
                for p in &ps {
                    let mut st = None;
                    for (i, r) in [req(1), partial(u64::MAX), req(1)].into_iter().enumerate() {
                        let t = now + i as i64;
                        step(algo, &mut st, p, t, r);
                        let s = st.clone().expect("admitted once");
                        let bytes = s.encode();
                        assert_eq!(State::decode(&bytes), Ok(s), "{algo:?} {p:?} at {t}");
                    }
                }
            }
        }
    }
}

#[test]
fn far_clock_step_back_with_a_rate_change_grants_nothing() {
    // 10^15 per ns, then the clock steps back two days and the rate becomes 1 per 100 years:
    // the debt, rescaled, is astronomically deep (it used to overflow i128 and wrap to a full
    // bucket).
    let fast = rate(MAX_COUNT, 1, 1);
    let slow = rate(1, MAX_PERIOD, 1);
    for algo in BUCKETS {
        for days in 1..=12 {
            let mut st = None;
            assert_eq!(step(algo, &mut st, &Params::Rate(fast), T0, req(1)).allowed, 1);
            let then = T0 - days * 86_400 * SEC;
            let (d, n) = check(algo, st.as_ref(), &Params::Rate(slow), then, req(1));
            // The leaky bucket keeps its drain instant (T0 + 1 ns, the one admitted request's
            // departure slot): the request waits for it, and the queue is empty from then on.
            let wait = if algo == Algorithm::Leaky { T0 + 1 - then } else { i64::MAX };
            assert_eq!((d.allowed, d.remaining, d.retry_after, d.reset_after), (0, 0, Some(wait), wait), "{algo:?}");
            // A limited call under new parameters may store the converted state (nothing
            // consumed): asked again at once, it answers the same.
            if let Some(n) = n {
                let (again, _) = check(algo, Some(&n), &Params::Rate(slow), then, req(1));
                assert_eq!(again, d, "{algo:?} {days} days back");
            }
        }
    }
}

#[test]
fn forged_states_decode_and_behave() {
    // The largest accepted arrival time decodes, as the latest one a call can store (the last
    // instant plus the capacity: no call stores more), and is usable (with a rate change too).
    let r = rate(1, 1, 1);
    let tat: i128 = 1 << 115;
    let bytes = State::Gcra(gcra::State { rate: r, tat }).encode();
    let Ok(State::Gcra(g)) = State::decode(&bytes) else { panic!("2^115 must decode") };
    assert_eq!({ g.tat }, i64::MAX as i128 + 1);
    for (p, wait) in [(r, i64::MAX - T0 + 1), (rate(1, MAX_PERIOD, 1), i64::MAX)] {
        let (d, n) = raw::gcra(Some(&g), &p, T0, req(1));
        // Nothing granted; under new parameters the converted state may be kept.
        assert!(n.is_none() || p != r);
        assert_eq!((d.allowed, d.retry_after, d.reset_after), (0, Some(wait), wait));
        if let Some(n) = n {
            assert_eq!(raw::gcra(Some(&n), &p, T0, req(1)).0, d);
        }
    }
    let bytes = State::Gcra(gcra::State { rate: r, tat: tat + 1 }).encode();
    assert!(State::decode(&bytes).is_err());

    // A sliding counter whose stored window index is i64::MIN is simply long past.
    let w = win(10, SEC);
    let bytes = State::Sliding(sliding::State { win: w, index: i64::MIN, prev: 7, curr: 9 }).encode();
    let Ok(State::Sliding(s)) = State::decode(&bytes) else { panic!() };
    let (d, n) = raw::sliding(Some(&s), &w, T0, req(1));
    assert_eq!((d.allowed, d.remaining, d.reset_after), (1, 9, 2 * SEC));
    assert_eq!(n.map(|n| (n.index, n.prev, n.curr)), Some((T0 / SEC, 0, 1)));
    // And one at i64::MAX is a window that has not begun: the most restrictive view.
    let s = sliding::State { win: w, index: i64::MAX, prev: 7, curr: 3 };
    let (d, _) = raw::sliding(Some(&s), &w, T0, req(1));
    assert_eq!(d.allowed, 0);
}

#[test]
fn codec_rejects_malformed_logs() {
    let w = win(10, SEC);
    let entry = |ts: u64, count: u64| (count << 53) | ts;
    let log = |entries: &[u64], bigs: &[u64]| {
        let mut b = vec![codec::ENCODING_VERSION, 5]; // 5: the sliding log's tag
        b.extend_from_slice(&w.limit.to_le_bytes());
        b.extend_from_slice(&(w.window.as_i64() as u64).to_le_bytes());
        b.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        entries.iter().for_each(|e| b.extend_from_slice(&e.to_le_bytes()));
        b.extend_from_slice(&(bigs.len() as u64).to_le_bytes());
        bigs.iter().for_each(|e| b.extend_from_slice(&e.to_le_bytes()));
        b
    };
    let big = sliding_log::BIG;
    let ok = State::decode(&log(&[entry(5, 1), entry(7, big), entry(7, 3)], &[5000])).expect("valid log");
    let State::SlidingLog(s) = &ok else { panic!() };
    assert_eq!(s.log.iter().collect::<Vec<_>>(), vec![(5, 1), (7, 5000), (7, 3)]);
    assert_eq!(s.log.total, 5004);
    assert_eq!(State::decode(&ok.encode()), Ok(ok.clone()));
    for (what, bytes) in [
        ("zero count", log(&[entry(5, 0)], &[])),
        ("out of order", log(&[entry(7, 1), entry(5, 1)], &[])),
        ("BIG without its count", log(&[entry(5, big)], &[])),
        ("extra big count", log(&[entry(5, 1)], &[9])),
        ("big count zero", log(&[entry(5, big)], &[0])),
        ("total too large", log(&[entry(5, big), entry(6, big), entry(7, big)], &[MAX_COUNT, MAX_COUNT, 1])),
        ("forged length", log(&[], &[]).into_iter().take(2 + 16).chain(u64::MAX.to_le_bytes()).collect()),
    ] {
        assert!(State::decode(&bytes).is_err(), "{what} accepted");
    }
    let mut trailing = ok.encode();
    trailing.push(0);
    assert!(State::decode(&trailing).is_err());
    let mut bad_version = ok.encode();
    bad_version[0] = codec::ENCODING_VERSION + 1;
    assert!(State::decode(&bad_version).is_err());
}
