//! RL.MULTI's all-or-nothing decision (`redis_ratelimit_core::multi`), without a server:
//! admitted calls consume on every limit as single calls would, refused ones consume nothing
//! and show each limit's own view, the retry time is the longest wait or never, PARTIAL grants
//! the least any limit has, and conversions to new parameters are kept as single calls keep
//! them. The same behaviour through redis-server: tests/multi.rs.

use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::multi::{check, MultiDecision};
use redis_ratelimit_core::spec::{AlgorithmMismatch, Spec, Update};
use redis_ratelimit_core::Algorithm;
use redis_ratelimit_core::{Decision, Nanos, Rate, Request, Window, NANOS_PER_SEC};

/// 2023-11-14T22:13:20Z.
const T0: Nanos = Nanos::new(1_700_000_000 * NANOS_PER_SEC);
const SEC: Nanos = Nanos::from_secs(1);
const MIN: Nanos = Nanos::from_secs(60);

fn gcra(limit: u64, period: Nanos) -> Spec {
    Spec::Gcra(Rate::new(limit, period, limit).unwrap())
}

fn fixed(limit: u64, window: Nanos) -> Spec {
    Spec::Fixed(Window::new(limit, window).unwrap())
}

fn sliding_log(limit: u64, window: Nanos) -> Spec {
    Spec::SlidingLog(Window::new(limit, window).unwrap())
}

fn leaky(limit: u64, period: Nanos) -> Spec {
    Spec::Leaky(Rate::new(limit, period, limit).unwrap())
}

fn cost(n: u64) -> Request {
    Request::new(n)
}

fn partial(n: u64) -> Request {
    Request { cost: n, partial: true }
}

/// A key's state after one single call of `spec` with `req` at `now` (from `prior`).
fn after(spec: &Spec, prior: Option<&State>, now: Nanos, req: Request) -> Option<State> {
    let (_, update) = spec.check(prior, now, req).unwrap();
    match (update, prior) {
        (Some(u), p) => {
            let mut s = p.cloned();
            match u.apply(s.as_mut()).unwrap() {
                Some(new) => Some(new),
                None => s,
            }
        }
        (None, p) => p.cloned(),
    }
}

fn single(spec: &Spec, st: Option<&State>, now: Nanos, req: Request) -> (Decision, Option<Update>) {
    spec.check(st, now, req).unwrap()
}

fn multi(specs: &[Spec], states: &[Option<State>], now: Nanos, req: Request) -> MultiDecision {
    check(specs, states.iter().map(Option::as_ref), now, req).unwrap()
}

#[test]
fn admitted_consumes_cost_on_every_limit_as_single_calls_would() {
    let specs = [gcra(10, MIN), fixed(10, MIN), sliding_log(10, MIN), leaky(10, MIN)];
    let states = [None, None, None, None];
    let o = multi(&specs, &states, T0, cost(3));
    assert_eq!((o.allowed, o.limited, o.retry_after), (3, false, None));
    for (i, (spec, limit)) in specs.iter().zip(&o.limits).enumerate() {
        let (d, u) = single(spec, None, T0, cost(3));
        assert_eq!(limit.decision, d, "limit {i}");
        let store = limit.store.as_ref().expect("an admitted limit stores its update");
        assert_eq!(Some(&store.update), u.as_ref(), "limit {i}");
        assert_eq!(store.reset_after, d.reset_after, "limit {i}");
    }
}

#[test]
fn refused_consumes_nothing_and_shows_each_limits_own_view() {
    let (a, b) = (gcra(10, MIN), fixed(2, MIN));
    // b is full (2 of 2 this minute); a is missing and would admit.
    let b_state = after(&b, None, T0, cost(2));
    let now = T0 + SEC * 15;
    let o = multi(&[a, b], &[None, b_state.clone()], now, cost(1));
    assert_eq!((o.allowed, o.limited), (0, true));
    assert!(o.limits.iter().all(|l| l.store.is_none()), "a refused call stores nothing: {o:?}");
    // a: its own view (a peek), no retry of its own.
    assert_eq!(o.limits[0].decision, single(&a, None, now, cost(0)).0);
    // b: what a refused single call answers.
    let (b_alone, _) = single(&b, b_state.as_ref(), now, cost(1));
    assert_eq!(o.limits[1].decision, b_alone);
    assert_eq!(o.limits[1].decision.allowed, 0);
    assert_eq!(o.retry_after, b_alone.retry_after);
    assert!(o.retry_after.is_some_and(|r| r > Nanos::ZERO));
    // The order of the limits changes nothing but the order of the replies.
    let o2 = multi(&[b, a], &[b_state, None], now, cost(1));
    assert_eq!((o2.allowed, o2.retry_after), (o.allowed, o.retry_after));
    assert_eq!(o2.limits[0], o.limits[1]);
    assert_eq!(o2.limits[1], o.limits[0]);
}

#[test]
fn retry_after_is_the_longest_wait_or_never() {
    let (a, b) = (gcra(1, SEC * 10), gcra(1, SEC * 20));
    let states = [after(&a, None, T0, cost(1)), after(&b, None, T0, cost(1))];
    let now = T0 + SEC * 2;
    let o = multi(&[a, b], &states, now, cost(1));
    assert_eq!(o.retry_after, Some(SEC * 18));
    assert_eq!(o.limits[0].decision.retry_after, Some(SEC * 8));
    assert_eq!(o.limits[1].decision.retry_after, Some(SEC * 18));
    // PARTIAL: until one unit fits everywhere (the same here: each has room for one).
    assert_eq!(multi(&[a, b], &states, now, partial(5)).retry_after, Some(SEC * 18));
    // A COST above one limit's capacity can never be admitted: never, whatever the others say.
    let (c, d) = (gcra(5, MIN), fixed(10, MIN));
    let o = multi(&[a, c, d], &[states[0].clone(), None, None], now, cost(6));
    assert_eq!((o.allowed, o.limited, o.retry_after), (0, true, None));
    // Admitted: no retry at all.
    let o = multi(&[a, b], &states, T0 + SEC * 30, cost(1));
    assert_eq!((o.allowed, o.retry_after), (1, None));
    assert!(o.limits.iter().all(|l| l.decision.retry_after.is_none()));
}

#[test]
fn partial_grants_the_least_any_limit_has() {
    let (a, b) = (gcra(10, MIN), sliding_log(5, MIN));
    let states = [after(&a, None, T0, cost(3)), after(&b, None, T0, cost(2))];
    let now = T0 + SEC;
    // a has 7 (3 used, refilling), b has 3: PARTIAL COST 6 grants 3 everywhere.
    let o = multi(&[a, b], &states, now, partial(6));
    assert_eq!((o.allowed, o.limited), (3, false));
    for (i, (spec, st)) in [a, b].iter().zip(&states).enumerate() {
        let (d, u) = single(spec, st.as_ref(), now, cost(3));
        assert_eq!(o.limits[i].decision, d, "limit {i} grants 3 as a single COST 3 call");
        assert_eq!(o.limits[i].store.as_ref().map(|s| &s.update), u.as_ref());
    }
    // One limit with nothing left: refused, retry until one unit fits there.
    let full = [states[0].clone(), after(&b, states[1].as_ref(), now, cost(3))];
    let o = multi(&[a, b], &full, now, partial(2));
    assert_eq!((o.allowed, o.limited), (0, true));
    assert!(o.limits.iter().all(|l| l.store.is_none()));
    assert_eq!(o.retry_after, single(&b, full[1].as_ref(), now, partial(2)).0.retry_after);
}

#[test]
fn cost_zero_peeks_every_limit_and_is_not_limited() {
    let (a, b) = (gcra(10, MIN), fixed(10, MIN));
    let states = [after(&a, None, T0, cost(4)), None];
    let o = multi(&[a, b], &states, T0 + SEC, cost(0));
    assert_eq!((o.allowed, o.limited, o.retry_after), (0, false, None));
    for (i, (spec, st)) in [a, b].iter().zip(&states).enumerate() {
        let (d, u) = single(spec, st.as_ref(), T0 + SEC, cost(0));
        assert_eq!(o.limits[i].decision, d, "limit {i}: the peek of a single call");
        assert_eq!(o.limits[i].store.as_ref().map(|s| &s.update), u.as_ref(), "limit {i}");
    }
    assert!(o.limits[1].store.is_none(), "a peek on a missing key creates nothing");
}

#[test]
fn refused_limits_keep_their_conversion_to_new_parameters() {
    // The key holds a GCRA state of 10/min; the call asks for 20/min and is refused by b: a
    // single refused call under the new rate stores the converted state, and so does RL.MULTI.
    let (old, new, b) = (gcra(10, MIN), gcra(20, MIN), fixed(1, MIN));
    let a_state = after(&old, None, T0, cost(5));
    let b_state = after(&b, None, T0, cost(1));
    let now = T0 + SEC;
    let (a_alone, a_update) = single(&new, a_state.as_ref(), now, cost(20));
    assert_eq!(a_alone.allowed, 0);
    assert!(a_update.is_some(), "a refused call under a new rate converts the state");
    let o = multi(&[new, b], &[a_state.clone(), b_state.clone()], now, cost(20));
    assert_eq!(o.allowed, 0);
    assert_eq!(o.limits[0].store.as_ref().map(|s| &s.update), a_update.as_ref());
    // Admitting on a but refused by b: a stores nothing (it would have consumed).
    let o = multi(&[new, b], &[a_state, b_state], now, cost(1));
    assert_eq!(o.allowed, 0);
    assert!(o.limits[0].store.is_none(), "{o:?}");
}

#[test]
fn refused_leaky_limit_has_no_delay() {
    let l = leaky(1, MIN);
    let st = [after(&l, None, T0, cost(1))];
    let o = multi(&[l], &st, T0 + SEC, cost(1));
    assert_eq!(o.allowed, 0);
    assert_eq!(o.limits[0].decision.delay, None);
    let o = multi(&[l], &[None], T0, cost(1));
    assert_eq!(o.limits[0].decision.delay, Some(Nanos::ZERO));
}

#[test]
fn another_algorithms_state_is_the_first_mismatch() {
    let g = gcra(10, MIN);
    let f_state = after(&fixed(10, MIN), None, T0, cost(1));
    let states = [None, f_state];
    let err = check(&[g, g], states.iter().map(Option::as_ref), T0, cost(1)).unwrap_err();
    assert_eq!(err, AlgorithmMismatch { stored: Algorithm::Fixed, requested: Algorithm::Gcra });
}
