//! Giving units back (RL.RETURN's core, `core::give_back`), without Redis: examples and
//! properties. Buckets: never above the capacity, `credited` is how much `remaining` grows, a
//! return with no admission in between equals having claimed fewer units, and with admissions in
//! between it is at most `rate × lease time` more generous than that. Windows: only into the
//! window the units were counted in, never into a later one, never touching another window.
//! Run with `cargo test --release --test give_back_props`.

use proptest::prelude::*;

use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::give_back::{self, Refusal};
use redis_ratelimit_core::Algorithm;
use redis_ratelimit_core::{fixed, gcra, sliding, token_bucket, Rate, Request, Window, NANOS_PER_SEC};

#[path = "common/core_dispatch.rs"]
mod core_dispatch;

use core_dispatch::{check, config, ns, Params};

/// The core's credit with its reset as raw i64 ns (the tests' arithmetic).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Credit {
    credited: u64,
    state: Option<State>,
    reset_after: i64,
}

/// The core's `give_back` at raw instants and ages.
fn give_back(state: &State, n: u64, age: Option<i64>, now: i64) -> Result<Credit, Refusal> {
    let c = give_back::give_back(state, n, age.map(ns), ns(now))?;
    Ok(Credit { credited: c.credited, state: c.state, reset_after: c.reset_after.as_i64() })
}

const T0: i64 = 1_700_000_000 * NANOS_PER_SEC;
const SEC: i64 = NANOS_PER_SEC;

/// The buckets that take units back (the leaky bucket refuses: see
/// `give_back_refuses_the_sliding_log_the_leaky_bucket_and_unaged_windows`).
const BUCKETS: [Algorithm; 2] = [Algorithm::Gcra, Algorithm::TokenBucket];
const WINDOWS: [Algorithm; 2] = [Algorithm::Fixed, Algorithm::Sliding];

/// One call of a limiter: the decision's `allowed`, the state updated in place.
fn call(algo: Algorithm, st: &mut Option<State>, p: &Params, now: i64, req: Request) -> u64 {
    let (d, new) = check(algo, st.as_ref(), p, now, req);
    if let Some(s) = new {
        *st = Some(s);
    }
    d.allowed
}

fn peek_remaining(algo: Algorithm, st: &Option<State>, p: &Params, now: i64) -> u64 {
    check(algo, st.as_ref(), p, now, Request::new(0)).0.remaining
}

/// A bucket's balance at `now` in units of 1/period (the capacity for a missing key).
fn tokens(st: &Option<State>, rate: &Rate, now: i64) -> i128 {
    match st {
        None => rate.burst as i128 * rate.period.as_i128(),
        Some(State::Gcra(s)) => s.tokens_scaled(ns(now)),
        Some(State::TokenBucket(s)) => s.tokens_scaled(ns(now)),
        Some(other) => panic!("not a bucket: {other:?}"),
    }
}

/// Applies a return to the state; the credit.
fn give(st: &mut Option<State>, n: u64, age: Option<i64>, now: i64) -> Credit {
    let c = give_back(st.as_ref().expect("a stored state"), n, age, now).expect("not refused");
    if let Some(s) = &c.state {
        *st = Some(s.clone());
    }
    c
}

fn rate_of(p: &Params) -> Rate {
    match p {
        Params::Rate(r) => *r,
        Params::Win(_) => panic!("not a rate"),
    }
}

// ---------------------------------------------------------------------------------------------
// Examples.

#[test]
fn buckets_take_units_back_up_to_a_full_bucket() {
    let rate = Rate::new(10, ns(SEC), 10).unwrap();
    let p = Params::Rate(rate);
    for algo in BUCKETS {
        let mut st = None;
        assert_eq!(call(algo, &mut st, &p, T0, Request::new(7)), 7);
        assert_eq!(peek_remaining(algo, &st, &p, T0), 3);
        let c = give(&mut st, 4, None, T0);
        assert_eq!(c.credited, 4, "{algo:?}");
        assert_eq!(peek_remaining(algo, &st, &p, T0), 7);
        // 300 ms owed: the key's TTL.
        assert_eq!(c.reset_after, 300_000_000, "{algo:?}");
        // 3 owed, 5 given: 3 credited, the bucket is full.
        let c = give(&mut st, 5, Some(0), T0);
        assert_eq!(c.credited, 3);
        assert_eq!(tokens(&st, &rate, T0), 10 * SEC as i128);
        assert_eq!(c.reset_after, 0);
        // Full: nothing to credit, nothing to store.
        assert_eq!(
            give_back(st.as_ref().unwrap(), 1, None, T0).unwrap(),
            Credit { credited: 0, state: None, reset_after: 0 }
        );
    }
}

#[test]
fn buckets_deduct_the_refill_received_while_the_units_were_out() {
    let rate = Rate::new(10, ns(SEC), 10).unwrap();
    let p = Params::Rate(rate);
    for algo in BUCKETS {
        let mut st = None;
        call(algo, &mut st, &p, T0, Request::new(7));
        // 150 ms later 1.5 units have come back by refill: balance 4.5, remaining 4.
        let now = T0 + 150_000_000;
        assert_eq!(peek_remaining(algo, &st, &p, now), 4);
        // 4 units out for 150 ms: 4 − 1.5 = 2.5 come back: balance 7, remaining 7.
        let c = give(&mut st, 4, Some(150_000_000), now);
        assert_eq!(c.credited, 3, "{algo:?}");
        assert_eq!(tokens(&st, &rate, now), 7 * SEC as i128);
        // Out for longer than they take to refill: nothing comes back, nothing is written.
        let c = give(&mut st, 2, Some(200_000_000), now);
        assert_eq!((c.credited, c.state), (0, None), "{algo:?}");
        // Less than a unit, when `remaining` would not grow: nothing either.
        let c = give(&mut st, 1, Some(50_000_000), now);
        assert_eq!((c.credited, c.state), (0, None), "{algo:?}");
    }
}

/// Many callers claim every unit as it refills and give each batch back unused after L, then
/// claim it again. Were returns credited in full, the units out at once would grow by rate × L
/// every cycle, all of them servable at the same instant. With the refill deducted, the units
/// out never exceed BURST + rate × L.
#[test]
fn claim_and_return_cycles_do_not_inflate_capacity() {
    let rate = Rate::new(1, ns(SEC), 10).unwrap(); // 1/s, BURST 10
    let p = Params::Rate(rate);
    let lease = 5 * SEC;
    let most_out = |with_age: bool| -> u64 {
        let mut st = None;
        let mut out: Vec<(i64, u64)> = Vec::new(); // (claimed at, units)
        let mut most = 0;
        for step in 0..200 {
            let now = T0 + step * SEC / 2;
            let (expired, kept): (Vec<_>, Vec<_>) = out.into_iter().partition(|(at, _)| now - at >= lease);
            out = kept;
            for (at, units) in expired {
                give(&mut st, units, with_age.then_some(now - at), now);
            }
            let got = call(Algorithm::Gcra, &mut st, &p, now, Request { cost: 1000, partial: true });
            if got > 0 {
                out.push((now, got));
            }
            most = most.max(out.iter().map(|(_, u)| u).sum());
        }
        most
    };
    assert!(most_out(true) <= 10 + 5, "{}", most_out(true));
    assert!(most_out(false) > 40, "without AGE the cycle inflates: {}", most_out(false));
}

#[test]
fn fixed_window_credits_only_the_current_window() {
    let win = Window::new(10, ns(60 * SEC)).unwrap();
    let p = Params::Win(win);
    let start = (T0 / (60 * SEC)) * 60 * SEC; // a window's first instant
    let mut st = None;
    assert_eq!(call(Algorithm::Fixed, &mut st, &p, start + 10 * SEC, Request::new(6)), 6);
    // 20 s later, claimed 20 s ago: same window.
    let c = give(&mut st, 2, Some(20 * SEC), start + 30 * SEC);
    assert_eq!(c.credited, 2);
    assert_eq!(c.reset_after, 30 * SEC);
    assert!(matches!(&st, Some(State::Fixed(f)) if f.count == 4));
    // An age reaching into the previous window proves nothing: no credit.
    assert_eq!(give(&mut st, 2, Some(31 * SEC), start + 30 * SEC).credited, 0);
    // The next window: the units are gone for good.
    assert_eq!(give(&mut st, 2, Some(0), start + 60 * SEC).credited, 0);
    // More than the window counts: only what it counts.
    assert_eq!(give(&mut st, 100, Some(0), start + 59 * SEC).credited, 4);
    assert!(matches!(&st, Some(State::Fixed(f)) if f.count == 0));
}

#[test]
fn sliding_credits_the_current_count_only() {
    let win = Window::new(10, ns(60 * SEC)).unwrap();
    let p = Params::Win(win);
    let start = (T0 / (60 * SEC)) * 60 * SEC;
    let mut st = None;
    call(Algorithm::Sliding, &mut st, &p, start + 10 * SEC, Request::new(5));
    call(Algorithm::Sliding, &mut st, &p, start + 70 * SEC, Request::new(3));
    let Some(State::Sliding(before)) = st.clone() else { panic!() };
    assert_eq!((before.prev, before.curr), (5, 3));
    // Giving back 5 (say, from the previous window's claim): only the current 3 can come back.
    let c = give(&mut st, 5, Some(0), start + 80 * SEC);
    assert_eq!(c.credited, 3);
    let Some(State::Sliding(after)) = st.clone() else { panic!() };
    assert_eq!((after.index, after.prev, after.curr), (before.index, 5, 0));
    // The previous window still counts until it has slid out: the end of this window.
    assert_eq!(c.reset_after, 40 * SEC);
}

#[test]
fn give_back_refuses_the_sliding_log_the_leaky_bucket_and_unaged_windows() {
    let win = Window::new(10, ns(60 * SEC)).unwrap();
    let mut log = None;
    call(Algorithm::SlidingLog, &mut log, &Params::Win(win), T0, Request::new(3));
    for age in [None, Some(0)] {
        assert_eq!(give_back(log.as_ref().unwrap(), 1, age, T0), Err(Refusal::SlidingLog));
    }
    for algo in WINDOWS {
        let mut st = None;
        call(algo, &mut st, &Params::Win(win), T0, Request::new(3));
        assert_eq!(give_back(st.as_ref().unwrap(), 1, None, T0), Err(Refusal::AgeRequired), "{algo:?}");
    }
    // A leaky bucket's queue slots are all promised to admitted requests: whatever the age,
    // even a unit claimed just now (tests/core_closure_props.rs: no slot is given twice).
    let rate = Rate::new(1, ns(SEC), 10).unwrap();
    let mut queue = None;
    call(Algorithm::Leaky, &mut queue, &Params::Rate(rate), T0, Request::new(3));
    for age in [None, Some(0), Some(SEC)] {
        assert_eq!(give_back(queue.as_ref().unwrap(), 1, age, T0), Err(Refusal::Leaky));
    }
}

#[test]
fn a_clock_stepped_back_into_an_earlier_window_credits_nothing() {
    let win = Window::new(10, ns(60 * SEC)).unwrap();
    let start = (T0 / (60 * SEC)) * 60 * SEC;
    for algo in WINDOWS {
        let mut st = None;
        call(algo, &mut st, &Params::Win(win), start + 61 * SEC, Request::new(3));
        assert_eq!(give(&mut st, 3, Some(0), start + 59 * SEC).credited, 0, "{algo:?}");
    }
}

#[test]
fn extreme_values_do_not_overflow() {
    let rate = Rate::new(1_000_000_000_000_000, ns(1), 1_000_000_000_000_000).unwrap();
    let st = State::Gcra(gcra::State { rate, tat: 1 << 115 });
    // A debt far beyond the capacity (a clock stepped back): remaining stays 0, nothing credited.
    assert_eq!(give_back(&st, 1_000_000_000_000_000, None, T0).unwrap().credited, 0);
    let st = State::Gcra(gcra::State { rate, tat: T0 as i128 * rate.limit as i128 + 5 });
    assert_eq!(give_back(&st, 1_000_000_000_000_000, Some(0), T0).unwrap().credited, 5);
    let tb = State::TokenBucket(token_bucket::State { rate, tokens: -(1 << 115), last: ns(i64::MAX) });
    assert!(give_back(&tb, 1_000_000_000_000_000, None, i64::MIN).is_ok());
    let win = Window::new(1_000_000_000_000_000, ns(36_525 * 86_400 * SEC)).unwrap();
    for (index, now) in [(i64::MIN, i64::MIN), (i64::MAX, i64::MAX), (0, 0)] {
        let f = State::Fixed(fixed::State { win, index, count: 2_000_000_000_000_000 });
        let s = State::Sliding(sliding::State { win, index, prev: 1, curr: 2_000_000_000_000_000 });
        for st in [f, s] {
            for age in [0, i64::MAX] {
                assert!(give_back(&st, 1_000_000_000_000_000, Some(age), now).is_ok());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Properties.

fn rate_params() -> impl Strategy<Value = Params> {
    prop_oneof![
        4 => (1u64..=20, prop_oneof![Just(SEC), 1i64..1_000_000, Just(60 * SEC)], 1u64..=20),
        1 => (1u64..=1_000_000_000, prop_oneof![Just(1i64), Just(SEC)], 1u64..=1_000_000_000),
    ]
    .prop_filter_map("valid rate", |(l, p, b)| Rate::new(l, ns(p), b).ok().map(Params::Rate))
}

fn window_params() -> impl Strategy<Value = Params> {
    (1u64..=20, prop_oneof![Just(SEC), 1i64..1_000_000, Just(60 * SEC)])
        .prop_map(|(l, w)| Params::Win(Window::new(l, ns(w)).unwrap()))
}

/// A step of traffic: how far the clock moves (in thousandths of the limiter's time unit) and
/// the request.
fn traffic() -> impl Strategy<Value = Vec<(u32, u64, bool)>> {
    prop::collection::vec((0u32..3000, 0u64..6, any::<bool>()), 0..12)
}

/// The natural time unit: one emission interval, or one window.
fn unit(p: &Params) -> i64 {
    p.unit().clamp(1, 1 << 50) as i64
}

fn advance(p: &Params, thousandths: u32) -> i64 {
    (unit(p) as i128 * thousandths as i128 / 1000) as i64
}

/// Runs traffic from `now`; returns the clock afterwards and the admitted (instant, units).
fn run(algo: Algorithm, st: &mut Option<State>, p: &Params, now: &mut i64, t: &[(u32, u64, bool)]) -> Vec<(i64, u64)> {
    let mut admitted = Vec::new();
    for &(dt, cost, partial) in t {
        *now += advance(p, dt);
        let got = call(algo, st, p, *now, Request { cost, partial });
        if got > 0 {
            admitted.push((*now, got));
        }
    }
    admitted
}

/// A key after `before` and a batch claim (up to k units, PARTIAL) at the end of it, and the
/// same key had that claim taken j fewer units (1 ≤ j ≤ granted, picked by `j_pick`):
/// (key, other key, claim instant, j). None when nothing was granted.
fn claim_with_alternative(
    algo: Algorithm,
    p: &Params,
    before: &[(u32, u64, bool)],
    k: u64,
    j_pick: u64,
) -> Option<(Option<State>, Option<State>, i64, u64)> {
    let (mut st, mut t) = (None, T0);
    run(algo, &mut st, p, &mut t, before);
    let mut alt = st.clone();
    let g = call(algo, &mut st, p, t, Request { cost: k, partial: true });
    if g == 0 {
        return None;
    }
    let j = 1 + j_pick % g;
    if g > j {
        assert_eq!(call(algo, &mut alt, p, t, Request::new(g - j)), g - j, "a smaller claim passes too");
    }
    Some((st, alt, t, j))
}

proptest! {
    #![proptest_config(config(600))]

    /// Any state, any n, any age: credited ≤ n, the balance becomes min(capacity, balance +
    /// n − rate × age) when that makes `remaining` grow (by exactly `credited`), and is left
    /// alone otherwise; never above the capacity; what is stored decodes.
    #[test]
    fn bucket_credit_is_capped_and_counted(
        algo in prop::sample::select(BUCKETS.to_vec()), p in rate_params(), before in traffic(),
        dt in 0u32..5000, n in 1u64..40, age in prop_oneof![Just(0u32), 0u32..3000],
    ) {
        let rate = rate_of(&p);
        let (mut st, mut now) = (None, T0);
        run(algo, &mut st, &p, &mut now, &before);
        prop_assume!(st.is_some());
        now += advance(&p, dt);
        let age = advance(&p, age);
        let cap = rate.burst as i128 * rate.period.as_i128();
        let (t0, r0) = (tokens(&st, &rate, now), peek_remaining(algo, &st, &p, now));
        let c = give(&mut st, n, Some(age), now);
        let (t1, r1) = (tokens(&st, &rate, now), peek_remaining(algo, &st, &p, now));
        prop_assert!(c.credited <= n);
        prop_assert!(t1 <= cap);
        prop_assert_eq!(r1 - r0, c.credited);
        prop_assert_eq!(c.state.is_some(), c.credited > 0);
        let added = (n as i128 * rate.period.as_i128() - age as i128 * rate.limit as i128).max(0);
        prop_assert_eq!(t1, if c.credited > 0 { (t0 + added).min(cap) } else { t0 });
        if let Some(s) = &c.state {
            // What is stored and replicated decodes (the codec refuses a balance above capacity).
            prop_assert_eq!(&State::decode(&s.encode()).unwrap(), s);
            if let State::TokenBucket(tb) = s {
                let stored = tb.tokens;
                prop_assert!(stored <= cap, "{} above {}", stored, cap);
            }
        }
        if c.credited > 0 {
            prop_assert_eq!(c.reset_after, check(algo, st.as_ref(), &p, now, Request::new(0)).0.reset_after);
        }
    }

    /// Claim g units and give j ≤ g back at once: the key is exactly as if only g − j had been
    /// claimed (same balance, same decisions from then on).
    #[test]
    fn bucket_return_at_once_equals_claiming_fewer(
        algo in prop::sample::select(BUCKETS.to_vec()), p in rate_params(), before in traffic(),
        k in 1u64..30, j_pick in any::<u64>(), after in traffic(),
    ) {
        let rate = rate_of(&p);
        let claimed = claim_with_alternative(algo, &p, &before, k, j_pick);
        prop_assume!(claimed.is_some());
        let (mut st, mut alt, mut t, j) = claimed.unwrap();
        prop_assert_eq!(give(&mut st, j, Some(0), t).credited, j);
        prop_assert_eq!(tokens(&st, &rate, t), tokens(&alt, &rate, t));
        for &(dt, cost, partial) in &after {
            t += advance(&p, dt);
            let req = Request { cost, partial };
            let (a, b) = (check(algo, st.as_ref(), &p, t, req), check(algo, alt.as_ref(), &p, t, req));
            prop_assert_eq!(a.0, b.0);
            if let Some(s) = a.1 { st = Some(s); }
            if let Some(s) = b.1 { alt = Some(s); }
        }
    }

    /// Bounded generosity of an unaged return (AGE 0, as for undoing a claim): claim g, other
    /// admissions, return j ≤ g. Compared with claiming g − j and making the same admissions, the
    /// balance is never lower and at most rate × (time the units were held) higher: the refill
    /// the other history lost to a full bucket. This excess is what RL.RETURN's AGE deduction
    /// removes (the next property).
    #[test]
    fn bucket_unaged_return_generosity_is_bounded(
        algo in prop::sample::select(BUCKETS.to_vec()), p in rate_params(), before in traffic(),
        k in 1u64..30, j_pick in any::<u64>(), between in traffic(), dt in 0u32..3000,
    ) {
        let rate = rate_of(&p);
        let claimed = claim_with_alternative(algo, &p, &before, k, j_pick);
        prop_assume!(claimed.is_some());
        let (mut st, mut alt, t1, j) = claimed.unwrap();
        let mut t2 = t1;
        for (at, units) in run(algo, &mut st, &p, &mut t2, &between) {
            prop_assert_eq!(call(algo, &mut alt, &p, at, Request::new(units)), units);
        }
        t2 += advance(&p, dt);
        let (before_return, other) = (tokens(&st, &rate, t2), tokens(&alt, &rate, t2));
        give(&mut st, j, None, t2);
        let real = tokens(&st, &rate, t2);
        let held = (t2 - t1) as i128 * rate.limit as i128;
        let p_scaled = rate.period.as_i128();
        // A credit writes only whole growth of `remaining`: the balance may stay put (lower).
        prop_assert!(real >= other || real == before_return, "{real} < {other}");
        prop_assert!(real <= other + held.min(j as i128 * p_scaled), "{real} vs {other} + {held}");
        prop_assert!(real <= rate.burst as i128 * p_scaled);
    }

    /// The safety property behind the client's bound. Leases (claims with PARTIAL), plain
    /// admissions and returns (with an AGE at least the true age) interleave freely. Compared with
    /// the history where every returned unit was never claimed (the same admissions, each lease
    /// claiming only what it kept), the key's balance is never higher, at any instant; so every
    /// admission of that history passes, and the units kept, dated at their claim, conform to
    /// the bucket: at most BURST + rate × T in any interval of length T.
    #[test]
    fn returns_never_leave_more_than_never_claiming(
        algo in prop::sample::select(BUCKETS.to_vec()), p in rate_params(),
        ops in prop::collection::vec((0u8..3, any::<u64>(), 0u32..2500, 0u32..300), 1..40),
    ) {
        let rate = rate_of(&p);
        #[derive(Debug)]
        enum Ev { Lease(usize), Admit(u64) }
        let mut leases: Vec<(i64, u64, u64, bool)> = Vec::new(); // (claimed at, granted, returned, open)
        let (mut st, mut now) = (None, T0);
        let mut steps: Vec<(i64, Option<Ev>, i128)> = Vec::new();
        for &(kind, a, dt, slack) in &ops {
            now += advance(&p, dt);
            let ev = match kind {
                0 => {
                    let g = call(algo, &mut st, &p, now, Request { cost: 1 + a % 40, partial: true });
                    (g > 0).then(|| { leases.push((now, g, 0, true)); Ev::Lease(leases.len() - 1) })
                }
                1 => {
                    let got = call(algo, &mut st, &p, now, Request::new(1 + a % 5));
                    (got > 0).then_some(Ev::Admit(got))
                }
                _ => {
                    let open: Vec<usize> = (0..leases.len()).filter(|&i| leases[i].3).collect();
                    if let Some(&i) = open.get((a % (open.len() as u64).max(1)) as usize) {
                        let (at, g, _, _) = leases[i];
                        let j = (a >> 8) % (g + 1); // 0: all served
                        if j > 0 {
                            give(&mut st, j, Some(now - at + advance(&p, slack)), now);
                        }
                        leases[i] = (at, g, j, false);
                    }
                    None
                }
            };
            steps.push((now, ev, tokens(&st, &rate, now)));
        }
        let mut alt = None;
        for (now, ev, real) in &steps {
            match ev {
                Some(Ev::Lease(i)) => {
                    let kept = leases[*i].1 - leases[*i].2;
                    if kept > 0 {
                        prop_assert_eq!(call(algo, &mut alt, &p, *now, Request::new(kept)), kept);
                    }
                }
                Some(Ev::Admit(u)) => prop_assert_eq!(call(algo, &mut alt, &p, *now, Request::new(*u)), *u),
                None => {}
            }
            let other = tokens(&alt, &rate, *now);
            prop_assert!(*real <= other, "at {}: {} above the never-claimed {}", now - T0, real, other);
        }
    }

    /// Windows: claim g at t_c, traffic, return j ≤ g at t_r with an age ≥ t_r − t_c. Credit
    /// happens only when t_r − age and t_r share the stored window (then all j come back); the
    /// window index, the previous window's count and the parameters never change; the count
    /// drops by exactly `credited`.
    #[test]
    fn windows_credit_only_the_claims_window(
        algo in prop::sample::select(WINDOWS.to_vec()), p in window_params(), before in traffic(),
        k in 1u64..10, j_pick in any::<u64>(), between in traffic(), dt in 0u32..3000,
        slack in prop_oneof![Just(0u32), 0u32..2000],
    ) {
        let (mut st, mut tc) = (None, T0);
        run(algo, &mut st, &p, &mut tc, &before);
        let g = call(algo, &mut st, &p, tc, Request { cost: k, partial: true });
        prop_assume!(g > 0);
        let j = 1 + j_pick % g;
        let mut tr = tc;
        run(algo, &mut st, &p, &mut tr, &between);
        tr += advance(&p, dt);
        let age = tr - tc + advance(&p, slack);
        let w = unit(&p);
        let before_return = st.clone().unwrap();
        let c = give(&mut st, j, Some(age), tr);
        let same_window = (tr - age).div_euclid(w) == tr.div_euclid(w);
        if tc.div_euclid(w) != tr.div_euclid(w) || !same_window {
            prop_assert_eq!(c.credited, 0);
            prop_assert!(c.state.is_none());
        } else {
            prop_assert_eq!(c.credited, j);
        }
        let after_return = st.clone().unwrap();
        prop_assert_eq!(&State::decode(&after_return.encode()).unwrap(), &after_return);
        match (&before_return, &after_return) {
            (State::Fixed(a), State::Fixed(b)) => {
                prop_assert_eq!((a.win, a.index), (b.win, b.index));
                prop_assert_eq!(a.count - b.count, c.credited);
            }
            (State::Sliding(a), State::Sliding(b)) => {
                prop_assert_eq!((a.win, a.index, a.prev), (b.win, b.index, b.prev));
                prop_assert_eq!(a.curr - b.curr, c.credited);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }
}
