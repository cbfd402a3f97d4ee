//! Property tests for the pure algorithm core (`redis_ratelimit_core`): capacity bounds,
//! agreement with naive models, GCRA ≡ token bucket, clocks stepping backwards, exact
//! retry/reset times, partial grants, decision invariants and the state codec.
//! No Redis needed. Run with `cargo test --release --test core_props`.

use proptest::prelude::*;

use redis_ratelimit_core::{
    codec, leaky, sliding_log, Rate, Request, Window, MAX_COUNT, NANOS_PER_MICRO, NANOS_PER_MILLI, NANOS_PER_SEC,
};

use codec::State;
use redis_ratelimit_core::Algorithm;

#[path = "common/core_dispatch.rs"]
mod core_dispatch;

use core_dispatch::{check, config, ns, raw, Params, RawDecision};

const T0: i64 = 1_700_000_000 * NANOS_PER_SEC;
const US: i64 = NANOS_PER_MICRO;
const SEC: i64 = NANOS_PER_SEC;

// ---------------------------------------------------------------------------------------------
// A uniform driver over all six algorithms: `check` and `Params` in common/core_dispatch.rs.

/// The parameters a stored state was written with.
fn params_of(s: &State) -> Params {
    match s {
        State::Gcra(g) | State::Leaky(leaky::State(g)) => Params::Rate(g.rate),
        State::TokenBucket(t) => Params::Rate(t.rate),
        State::Sliding(x) => Params::Win(x.win),
        State::Fixed(x) => Params::Win(x.win),
        State::SlidingLog(x) => Params::Win(x.win),
    }
}

// ---------------------------------------------------------------------------------------------
// Random traces.

#[derive(Clone, Copy, Debug)]
struct Op {
    /// Picks how far the clock moves.
    step: u8,
    u: u32,
    /// Picks the cost.
    cost: u64,
    partial: bool,
    /// Picks a backwards step (when the property allows them).
    back: u8,
    /// Picks the parameter set (when the property changes parameters).
    pi: u8,
}

fn op() -> impl Strategy<Value = Op> {
    (any::<u8>(), 0u32..4000, any::<u64>(), any::<bool>(), any::<u8>(), any::<u8>())
        .prop_map(|(step, u, cost, partial, back, pi)| Op { step, u, cost, partial, back, pi })
}

fn ops(max: usize) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..max)
}

impl Op {
    /// How far the clock moves forward, scaled to the limiter's own time unit.
    fn advance(&self, unit: i128) -> i64 {
        let u = self.u as i128;
        let dt = match self.step % 8 {
            0 | 1 => 0,
            2..=4 => u * unit / 1000,              // up to 4 units, anywhere
            5 => (u % 9) * unit / 4,               // quarter-unit grid: exact edges
            6 => u % 5,                            // a few ns
            _ => (u % 5) * unit + (u / 5 % 3) - 1, // a whole number of units, ±1 ns
        };
        dt.clamp(0, 1 << 50) as i64
    }

    /// How far the clock steps back, if it does.
    fn retreat(&self, unit: i128) -> Option<i64> {
        if !self.back.is_multiple_of(6) {
            return None;
        }
        let u = self.u as i128;
        let d = match self.back / 6 % 4 {
            0 => 1 + u % 3,
            1 => 1 + u * unit / 1000,
            2 => 1 + u * unit / 200,
            _ => 1 + u * 1_000_000_000_000, // up to 46 days: far beyond the time scale
        };
        Some(d.clamp(1, 1 << 50) as i64)
    }

    fn request(&self, cap: u64) -> Request {
        let hi = self.cost >> 8;
        let cost = match self.cost % 8 {
            0 => 0,
            1..=4 => 1,
            5 => 1 + hi % cap,
            6 => cap + 1 + hi % 3,
            _ => 1 + hi % 3,
        };
        Request { cost, partial: self.partial }
    }
}

fn period() -> impl Strategy<Value = i64> {
    prop_oneof![Just(1), 1i64..1000, 1_000i64..100_000_000, Just(SEC), Just(60 * SEC), Just(86_400 * SEC),]
}

fn rate_params() -> impl Strategy<Value = Params> {
    prop_oneof![
        4 => (1u64..=20, period(), 1u64..=20),
        2 => (1u64..=1000, period(), 1u64..=1000),
        1 => (Just(1_000_000_000u64), Just(SEC), 1u64..=1_000_000_000),
        1 => (1u64..=3, Just(36_525 * 86_400 * SEC), 1u64..=2),
        1 => (100_000_000_000_000u64..=MAX_COUNT, 1i64..=1000, 1u64..=MAX_COUNT),
    ]
    .prop_filter_map("valid rate", |(l, p, b)| Rate::new(l, ns(p), b).ok().map(Params::Rate))
}

fn window_len() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(US),
        (1i64..=10_000).prop_map(|k| k * US),
        Just(60 * SEC),
        1i64..=20_000_000, // not a whole number of µs
    ]
}

fn window_params() -> impl Strategy<Value = Params> {
    prop_oneof![3 => (1u64..=20, window_len()), 1 => (1u64..=1000, window_len())]
        .prop_map(|(l, w)| Params::Win(Window::new(l, ns(w)).unwrap()))
}

/// µs-aligned windows only.
fn us_window_params() -> impl Strategy<Value = Params> {
    (1u64..=20, 1i64..=10_000).prop_map(|(l, k)| Params::Win(Window::new(l, ns(k * US)).unwrap()))
}

fn params_for(a: Algorithm) -> BoxedStrategy<Params> {
    if a.is_bucket() {
        rate_params().boxed()
    } else {
        window_params().boxed()
    }
}

fn any_algo() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::ALL.to_vec())
}

fn bucket_algo() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(vec![Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::Leaky])
}

/// An algorithm with one or more parameter sets of its kind.
fn algo_and_params(n: usize) -> impl Strategy<Value = (Algorithm, Vec<Params>)> {
    any_algo().prop_flat_map(move |a| (Just(a), prop::collection::vec(params_for(a), 1..=n)))
}

fn start() -> impl Strategy<Value = i64> {
    (0i64..1_000_000_000_000).prop_map(|o| T0 + o)
}

#[derive(Clone, Debug)]
struct Event {
    now: i64,
    p: Params,
    req: Request,
    before: Option<State>,
    d: RawDecision,
    after: Option<State>,
}

/// Runs a trace; parameters change with `op.pi` when several are given; the clock steps back
/// when `back` is set and the op says so.
fn run(algo: Algorithm, params: &[Params], ops: &[Op], t0: i64, back: bool) -> Vec<Event> {
    let mut st: Option<State> = None;
    let mut now = t0;
    let mut out = Vec::with_capacity(ops.len());
    for (i, o) in ops.iter().enumerate() {
        let p = params[o.pi as usize % params.len()];
        if i > 0 {
            match o.retreat(p.unit()).filter(|_| back) {
                Some(d) => now -= d,
                None => now += o.advance(p.unit()),
            }
        }
        let req = o.request(p.capacity());
        let (d, n) = check(algo, st.as_ref(), &p, now, req);
        let before = st.clone();
        if let Some(n) = n {
            st = Some(n);
        }
        out.push(Event { now, p, req, before, d, after: st.clone() });
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Naive models.

/// The sliding log as a plain list of (µs, units), filtered by the window every time.
struct NaiveLog {
    log: Vec<(i64, u64)>,
}

fn micros(now: i64) -> i64 {
    now.div_euclid(US).clamp(0, sliding_log::MAX_TS)
}

impl NaiveLog {
    fn counted_after(&self, cutoff: i64) -> u64 {
        self.log.iter().filter(|e| e.0 > cutoff).map(|e| e.1).sum()
    }

    fn check(&mut self, w: &Window, now: i64, r: Request) -> RawDecision {
        let w_us = (w.window.as_i64() / US).max(1);
        let now_us = micros(now);
        let cutoff = now_us - w_us;
        let counted = self.counted_after(cutoff);
        let available = w.limit.saturating_sub(counted);
        let granted = if r.partial {
            r.cost.min(available)
        } else if r.cost <= available {
            r.cost
        } else {
            0
        };
        let need = if r.partial { r.cost.min(1) } else { r.cost };
        let until = |at_us: i64| at_us as i128 * US as i128 - now as i128;
        let ts = self.log.iter().map(|e| e.0).max().map_or(now_us, |n| n.max(now_us));
        let retry_after = if granted > 0 || r.cost == 0 || need > w.limit {
            None
        } else {
            // The first instant at which an entry leaves and the request then fits.
            self.log
                .iter()
                .map(|e| e.0)
                .filter(|&t| t > cutoff)
                .find(|&t| self.counted_after(t) + need <= w.limit)
                .map(|t| until(t + w_us) as i64)
        };
        let reset_after = if granted > 0 {
            until(ts + w_us) as i64
        } else {
            match self.log.last() {
                Some(&(n, _)) if n > cutoff => until(n + w_us) as i64,
                _ => 0,
            }
        };
        if granted > 0 {
            self.log.retain(|e| e.0 > cutoff);
            match self.log.last_mut() {
                Some(last) if last.0 == ts => last.1 += granted,
                _ => self.log.push((ts, granted)),
            }
        }
        RawDecision {
            allowed: granted,
            limit: w.limit,
            remaining: w.limit - (counted + granted).min(w.limit),
            retry_after,
            reset_after,
            delay: None,
        }
    }
}

fn grant(r: Request, available: u64) -> u64 {
    if r.partial {
        r.cost.min(available)
    } else if r.cost <= available {
        r.cost
    } else {
        0
    }
}

// ---------------------------------------------------------------------------------------------
// Properties.

proptest! {
    #![proptest_config(config(1500))]

    /// GCRA, token bucket and leaky bucket never admit more than burst + limit × elapsed / period.
    #[test]
    fn buckets_admit_at_most_burst_plus_refill(
        algo in bucket_algo(), p in rate_params(), ops in ops(80), t0 in start(),
    ) {
        let Params::Rate(r) = p else { unreachable!() };
        let ev = run(algo, &[p], &ops, t0, false);
        let mut total: u128 = 0;
        for e in &ev {
            total += e.d.allowed as u128;
            let elapsed = (e.now - ev[0].now) as i128;
            let bound = r.burst as i128 + elapsed * r.limit as i128 / r.period.as_i128();
            prop_assert!(total as i128 <= bound, "{algo:?} {r:?}: {total} admitted by +{elapsed} ns, bound {bound}");
        }
    }

    /// The sliding log answers exactly like a naive list filtered by the window, field by field,
    /// with parameter changes and clocks stepping back.
    #[test]
    fn sliding_log_matches_naive_model(
        params in prop::collection::vec(window_params(), 1..=2), ops in ops(80), t0 in start(), back in any::<bool>(),
    ) {
        let ev = run(Algorithm::SlidingLog, &params, &ops, t0, back);
        let mut naive = NaiveLog { log: Vec::new() };
        for (i, e) in ev.iter().enumerate() {
            let Params::Win(w) = e.p else { unreachable!() };
            let want = naive.check(&w, e.now, e.req);
            prop_assert_eq!(e.d, want, "call {} at {} {:?} {:?}", i, e.now, e.req, w);
            if let Some(State::SlidingLog(s)) = &e.after {
                let got: Vec<_> = s.log.iter().collect();
                prop_assert_eq!(&got, &naive.log);
                prop_assert_eq!(s.log.total, naive.log.iter().map(|e| e.1).sum::<u64>());
            }
        }
    }

    /// With µs-aligned times and windows, no half-open window (t − window, t] ever holds more
    /// than `limit` admitted units.
    #[test]
    fn sliding_log_never_exceeds_limit_in_any_window(p in us_window_params(), ops in ops(100), t0 in start()) {
        let Params::Win(w) = p else { unreachable!() };
        let ev = run(Algorithm::SlidingLog, &[p], &ops, t0 - t0 % US, false);
        let admitted: Vec<(i64, u64)> = ev
            .iter()
            .filter(|e| e.d.allowed > 0)
            .map(|e| (e.now - e.now.rem_euclid(US), e.d.allowed))
            .collect();
        // The fullest windows end at an admission.
        for &(t, _) in &admitted {
            let n: u64 = admitted.iter().filter(|&&(s, _)| s > t - w.window.as_i64() && s <= t).map(|e| e.1).sum();
            prop_assert!(n <= w.limit, "{n} units in the window ending at {t}, limit {}", w.limit);
        }
    }

    /// Fixed window: per epoch-aligned window, admitted ≤ limit (by request time on a monotonic
    /// clock; by counted window when the clock steps back).
    #[test]
    fn fixed_window_admits_at_most_limit_per_window(
        p in window_params(), ops in ops(100), t0 in start(), back in any::<bool>(),
    ) {
        let Params::Win(w) = p else { unreachable!() };
        let ev = run(Algorithm::Fixed, &[p], &ops, t0, back);
        let mut per: std::collections::HashMap<i64, u64> = Default::default();
        for e in ev.iter().filter(|e| e.d.allowed > 0) {
            let key = if back {
                let Some(State::Fixed(s)) = &e.after else { unreachable!() };
                s.index
            } else {
                e.now.div_euclid(w.window.as_i64())
            };
            let n = per.entry(key).or_default();
            *n += e.d.allowed;
            prop_assert!(*n <= w.limit, "window {key}: {n} > {}", w.limit);
        }
    }

    /// Sliding counter: an independent i128 model of the two counts gives the same grants, and
    /// the weighted estimate including the admitted units never exceeds the limit.
    #[test]
    fn sliding_counter_estimate_never_exceeds_limit(p in window_params(), ops in ops(100), t0 in start()) {
        let Params::Win(w) = p else { unreachable!() };
        let ev = run(Algorithm::Sliding, &[p], &ops, t0, false);
        let (win, limit) = (w.window.as_i128(), w.limit as i128);
        let (mut index, mut prev, mut curr): (i128, i128, i128) = (i128::MIN, 0, 0);
        for e in &ev {
            let now = e.now as i128;
            let i = now.div_euclid(win);
            if index == i128::MIN || i >= index + 2 {
                prev = 0;
                curr = 0;
            } else if i == index + 1 {
                prev = curr;
                curr = 0;
            }
            index = i;
            let elapsed = now - i * win;
            let free = limit * win - prev * (win - elapsed) - curr * win;
            let available = free.div_euclid(win).clamp(0, limit) as u64;
            prop_assert_eq!(e.d.allowed, grant(e.req, available), "at {} {:?}", e.now, e.req);
            curr += e.d.allowed as i128;
            let weighted = prev * (win - elapsed) + curr * win;
            if e.d.allowed > 0 {
                prop_assert!(weighted <= limit * win, "estimate {}/{} over the limit {}", weighted, win, limit);
            }
            prop_assert_eq!(e.d.remaining as i128, ((limit * win - weighted).div_euclid(win)).clamp(0, limit));
        }
    }

    /// GCRA and the token bucket answer identically, field by field, with rate changes and clocks
    /// stepping back; while its parameters stay the same, the leaky bucket answers like GCRA apart
    /// from `delay`, and stores the same state. (On a change it keeps its drain instant instead:
    /// `leaky_rate_change_keeps_the_drain_instant`.)
    #[test]
    fn gcra_equals_token_bucket(
        params in prop::collection::vec(rate_params(), 1..=3), ops in ops(80), t0 in start(), back in any::<bool>(),
    ) {
        let g = run(Algorithm::Gcra, &params, &ops, t0, back);
        let t = run(Algorithm::TokenBucket, &params, &ops, t0, back);
        for (g, t) in g.iter().zip(&t) {
            prop_assert_eq!(g.now, t.now);
            prop_assert_eq!(g.d, t.d, "at {} {:?} {:?}", g.now, g.req, g.p);
            if let (Some(State::Gcra(gs)), Some(State::TokenBucket(ts))) = (&g.after, &t.after) {
                prop_assert_eq!(gs.rate, ts.rate);
                prop_assert_eq!(gs.tokens_scaled(ns(g.now)), ts.tokens_scaled(ns(g.now)));
            }
        }
        let g = run(Algorithm::Gcra, &params[..1], &ops, t0, back);
        let l = run(Algorithm::Leaky, &params[..1], &ops, t0, back);
        for (g, l) in g.iter().zip(&l) {
            prop_assert_eq!(g.d, RawDecision { delay: None, ..l.d }, "at {} {:?} {:?}", g.now, g.req, g.p);
            prop_assert_eq!(l.d.delay.is_some(), l.d.allowed > 0);
            let leaky_as_gcra = l.after.as_ref().map(|s| match s {
                State::Leaky(leaky::State(s)) => State::Gcra(*s),
                other => other.clone(),
            });
            prop_assert_eq!(&g.after, &leaky_as_gcra);
        }
    }

    /// A change of rate converts the balance rounding down, never in the caller's favour:
    /// with T = the old balance in (fractional) tokens, the new remaining is ≤ ⌊T⌋ and the wait
    /// for `need` units is (need − T) × period / limit, rounded up by at most one scaled unit.
    /// (GCRA and the token bucket; the leaky bucket keeps its queue's drain instant instead.)
    #[test]
    fn rate_change_never_rounds_in_the_callers_favour(
        algo in prop::sample::select(vec![Algorithm::Gcra, Algorithm::TokenBucket]), r1 in rate_params(),
        r2 in rate_params(), ops in ops(40), t0 in start(), dt in 0u32..4000, probe in op(),
    ) {
        let (Params::Rate(a), Params::Rate(b)) = (r1, r2) else { unreachable!() };
        let ev = run(algo, &[r1], &ops, t0, false);
        let Some(st) = ev.iter().rev().find_map(|e| e.after.clone()) else { return Ok(()) };
        let now = ev.last().unwrap().now + (dt as i128 * r1.unit() / 1000).min(1 << 50) as i64;
        // The old balance in units of 1/a.period.
        let t_scaled = match &st {
            State::Gcra(g) => g.tokens_scaled(ns(now)),
            State::TokenBucket(t) => t.tokens_scaled(ns(now)),
            _ => unreachable!(),
        };
        let (pf, pt, l2) = (a.period.as_i128(), b.period.as_i128(), b.limit as i128);
        let r = probe.request(b.burst);
        let (d, _) = check(algo, Some(&st), &r2, now, r);
        prop_assert!((d.remaining as i128) * pf <= t_scaled.max(0), "remaining {} from {} / {}", d.remaining, t_scaled, pf);
        if let Some(w) = d.retry_after {
            let need = if r.partial { 1 } else { r.cost as i128 };
            // Exact wait × l2 × pf = need × pt × pf − T_scaled × pt; skip what i128 cannot hold.
            let exact = (need * pt).checked_mul(pf).and_then(|x| x.checked_sub(t_scaled.checked_mul(pt)?));
            let got = (w as i128).checked_mul(l2).and_then(|x| x.checked_mul(pf));
            if let (Some(exact), Some(got)) = (exact, got) {
                prop_assert!(got >= exact, "{algo:?} {a:?} -> {b:?}: retry {w} early");
                prop_assert!(got - l2 * pf < exact + pf, "{algo:?} {a:?} -> {b:?}: retry {w} late");
            }
        }
    }

    /// A change of parameters on a leaky bucket keeps the instant its queue drains: every
    /// admitted request holds its departure slot. With D the drain instant under the old
    /// parameters (ns, as the last admitted call's reset_after reported it) and `ahead` the
    /// queue left at `now` (D − now, or 0), a request under the new parameters:
    /// - admitted: leaves at max(now, D), and fits the new BURST behind `ahead` (a PARTIAL grant
    ///   takes as many units as fit, no more);
    /// - limited: does not fit behind `ahead` (a queue deeper than a lowered BURST refuses until
    ///   it has drained to the new depth), writes nothing, and retry_after is exact (1 ns earlier
    ///   still limited, then admitted, leaving at max(then, D));
    /// - `remaining` is what a PARTIAL request for BURST units gets right after it.
    /// All up to the < 1 ns the reported instants are rounded up by.
    #[test]
    fn leaky_rate_change_keeps_the_drain_instant(
        r1 in rate_params(), r2 in rate_params(), ops in ops(40), t0 in start(), dt in 0u32..4000, probe in op(),
    ) {
        let Params::Rate(b) = r2 else { unreachable!() };
        let ev = run(Algorithm::Leaky, &[r1], &ops, t0, false);
        let Some(last) = ev.iter().rev().find(|e| e.d.allowed > 0) else { return Ok(()) };
        let st = last.after.clone();
        let drain = last.now as i128 + last.d.reset_after as i128;
        let now = ev.last().unwrap().now + (dt as i128 * r1.unit() / 1000).min(1 << 50) as i64;
        let ahead = (drain - now as i128).max(0);
        let (l, p, cap) = (b.limit as i128, b.period.as_i128(), b.burst as i128);
        let r = probe.request(b.burst);
        let (d, u) = check(Algorithm::Leaky, st.as_ref(), &r2, now, r);
        let after = u.clone().or_else(|| st.clone());
        if d.allowed > 0 {
            let dep = now as i128 + d.delay.unwrap() as i128;
            prop_assert_eq!(dep, drain.max(now as i128), "{:?} -> {:?}: not at the drain instant", r1, r2);
            prop_assert!(
                ahead * l < (cap - d.allowed as i128) * p + l,
                "{:?} -> {:?}: {} admitted behind {} ns", r1, r2, d.allowed, ahead
            );
            if d.allowed < r.cost {
                prop_assert!(ahead * l > (cap - d.allowed as i128 - 1) * p, "{:?} -> {:?}: one more unit fits", r1, r2);
            }
        } else if r.cost > 0 {
            prop_assert!(u.is_none(), "a limited call wrote");
            let need = if r.partial { 1 } else { r.cost as i128 };
            if let Some(w) = d.retry_after {
                prop_assert!(
                    ahead * l > (cap - need) * p,
                    "{:?} -> {:?}: limited behind {} ns, which leaves room", r1, r2, ahead
                );
                let (early, _) = check(Algorithm::Leaky, st.as_ref(), &r2, now + w - 1, r);
                prop_assert_eq!(early.allowed, 0, "admitted 1 ns before retry_after {}", w);
                let (on_time, _) = check(Algorithm::Leaky, st.as_ref(), &r2, now + w, r);
                prop_assert!(on_time.allowed > 0, "limited at retry_after {}", w);
                let dep = (now + w) as i128 + on_time.delay.unwrap() as i128;
                prop_assert_eq!(dep, drain.max((now + w) as i128));
            } else {
                prop_assert!(need > cap);
            }
        }
        let (fill, _) = check(Algorithm::Leaky, after.as_ref(), &r2, now, Request { cost: b.burst, partial: true });
        prop_assert_eq!(fill.allowed, d.remaining, "{:?} -> {:?}: remaining", r1, r2);
    }

    /// After any trace, stepping the clock back never hands out capacity: what is available at
    /// an earlier instant is at most what is available at the latest instant seen, and a request
    /// admitted at the earlier instant would be admitted (at least as much) at the latest one.
    #[test]
    fn clock_stepping_back_never_adds_capacity(
        (algo, params) in algo_and_params(2), ops in ops(60), t0 in start(), back in any::<bool>(),
        d in 1u32..4000, far in any::<bool>(), probe in op(),
    ) {
        // The probe may come with changed parameters (the last set): both instants use them.
        let p = *params.last().unwrap();
        let ev = run(algo, &params[..1], &ops, t0, back);
        let latest = ev.iter().map(|e| e.now).max().unwrap();
        let st = ev.last().unwrap().after.clone();
        let back_by = if far {
            d as i64 * 1_000_000_000_000
        } else {
            (1 + d as i128 * p.unit() / 500).min(1 << 50) as i64
        };
        let earlier = latest - back_by;
        let peek = Request::new(0);
        let (at_latest, _) = check(algo, st.as_ref(), &p, latest, peek);
        let (at_earlier, _) = check(algo, st.as_ref(), &p, earlier, peek);
        prop_assert!(at_earlier.remaining <= at_latest.remaining,
            "{algo:?}: {} available {back_by} ns back, {} at the latest instant", at_earlier.remaining, at_latest.remaining);
        let r = probe.request(p.capacity());
        let (late, _) = check(algo, st.as_ref(), &p, latest, r);
        let (early, _) = check(algo, st.as_ref(), &p, earlier, r);
        prop_assert!(early.allowed <= late.allowed, "{algo:?} {r:?}: {} back vs {} latest", early.allowed, late.allowed);
    }

    /// retry_after is exact: 1 ns earlier the same request is still limited, at retry_after it
    /// is admitted.
    #[test]
    fn retry_after_is_exact(
        (algo, params) in algo_and_params(1), ops in ops(60), t0 in start(), back in any::<bool>(),
    ) {
        for e in run(algo, &params, &ops, t0, back) {
            if let Some(wait) = e.d.retry_after {
                prop_assert!(wait > 0);
                if e.now.checked_add(wait).is_none() {
                    continue; // saturated: a wait beyond the representable instants
                }
                let (early, _) = check(algo, e.before.as_ref(), &e.p, e.now + wait - 1, e.req);
                prop_assert_eq!(early.allowed, 0, "{:?}: admitted 1 ns before retry_after {} (at {} {:?})", algo, wait, e.now, e.req);
                let (on_time, _) = check(algo, e.before.as_ref(), &e.p, e.now + wait, e.req);
                prop_assert!(on_time.allowed > 0, "{:?}: limited at retry_after {} (at {} {:?})", algo, wait, e.now, e.req);
            }
        }
    }

    /// reset_after is exact: from then on the key behaves like a missing one, and not 1 ns sooner.
    #[test]
    fn reset_after_is_exact(
        (algo, params) in algo_and_params(1), ops in ops(60), t0 in start(), back in any::<bool>(), probe in op(),
    ) {
        for e in run(algo, &params, &ops, t0, back) {
            let Some(at) = e.now.checked_add(e.d.reset_after) else { continue };
            let r = probe.request(e.p.capacity());
            let (on_state, _) = check(algo, e.after.as_ref(), &e.p, at, r);
            let (fresh, _) = check(algo, None, &e.p, at, r);
            prop_assert_eq!(on_state, fresh, "{:?}: not fresh {} after {}", algo, e.d.reset_after, e.now);
            if e.d.reset_after > 0 {
                let (on_state, _) = check(algo, e.after.as_ref(), &e.p, at - 1, Request::new(0));
                let (fresh, _) = check(algo, None, &e.p, at - 1, Request::new(0));
                prop_assert_ne!(on_state, fresh, "{:?}: fresh before reset_after", algo);
            }
        }
    }

    /// A partial grant of n is what n cost-1 calls at the same instant admit (never more), and
    /// leaves the same state.
    #[test]
    fn partial_grant_equals_unit_calls(
        (algo, params) in algo_and_params(1), ops in ops(40), t0 in start(), back in any::<bool>(),
        n in 1u64..40, dt in 0u32..4000,
    ) {
        let p = params[0];
        let ev = run(algo, &params, &ops, t0, back);
        let st = ev.last().unwrap().after.clone();
        let now = ev.last().unwrap().now + (dt as i128 * p.unit() / 1000).min(1 << 50) as i64;
        let (d, after_partial) = check(algo, st.as_ref(), &p, now, Request { cost: n, partial: true });
        let mut s1 = st.clone();
        let mut singles = 0;
        for _ in 0..n {
            let (d1, n1) = check(algo, s1.as_ref(), &p, now, Request::new(1));
            singles += d1.allowed;
            if let Some(n1) = n1 {
                s1 = Some(n1);
            }
        }
        prop_assert!(d.allowed <= singles, "{algo:?}: partial {n} granted {}, single calls {singles}", d.allowed);
        prop_assert_eq!(d.allowed, singles);
        prop_assert_eq!(after_partial.or(st), s1);
    }

    /// Invariants of every decision, whatever the trace (parameter changes, clocks stepping back).
    #[test]
    fn every_decision_is_within_capacity_and_consistent(
        (algo, params) in algo_and_params(3), ops in ops(80), t0 in start(), back in any::<bool>(),
    ) {
        for e in run(algo, &params, &ops, t0, back) {
            let (d, cap, r) = (e.d, e.p.capacity(), e.req);
            prop_assert_eq!(d.limit, cap);
            prop_assert!(d.remaining <= cap, "{:?}", d);
            prop_assert!(d.remaining + d.allowed <= cap, "{:?}", d);
            prop_assert!(d.allowed <= r.cost);
            if !r.partial {
                prop_assert!(d.allowed == 0 || d.allowed == r.cost);
            }
            let limited = d.limited(&r);
            let need = if r.partial { r.cost.min(1) } else { r.cost };
            prop_assert_eq!(d.retry_after.is_some(), limited && need <= cap, "{:?} {:?}", r, d);
            if let Some(w) = d.retry_after {
                prop_assert!(w > 0);
            }
            prop_assert!(d.reset_after >= 0);
            if d.allowed > 0 {
                prop_assert!(d.reset_after > 0);
            }
            prop_assert_eq!(d.delay.is_some(), algo == Algorithm::Leaky && d.allowed > 0);
            // Limited and peeking calls return no new state, except that a limited call under
            // new parameters keeps the converted state (nothing consumed): asked again at once
            // it answers the same.
            if d.allowed == 0 && e.after != e.before {
                prop_assert!(r.cost > 0, "a peek wrote");
                let (again, _) = check(algo, e.after.as_ref(), &e.p, e.now, r);
                prop_assert_eq!(again, d);
            }
        }
    }

    /// Every state a trace produces survives encode → decode unchanged.
    #[test]
    fn every_state_a_trace_produces_survives_encode_decode(
        (algo, params) in algo_and_params(3), ops in ops(60), t0 in start(), back in any::<bool>(),
    ) {
        for e in run(algo, &params, &ops, t0, back) {
            if let Some(s) = &e.after {
                let bytes = s.encode();
                let back = State::decode(&bytes);
                prop_assert_eq!(back.as_ref(), Ok(s));
                prop_assert_eq!(back.unwrap().encode(), bytes);
                prop_assert_eq!(s.algorithm(), algo);
            }
        }
    }

    /// Arbitrary bytes never make decode panic.
    #[test]
    fn decode_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = State::decode(&bytes);
    }

    /// Same, with a valid header so the algorithm-specific decoding is reached.
    #[test]
    fn decode_random_body_never_panics(tag in 0u8..8, body in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut bytes = vec![codec::ENCODING_VERSION, tag];
        bytes.extend(body);
        if let Ok(s) = State::decode(&bytes) {
            exercise_decoded(&s)?;
        }
    }

    /// Mutated valid encodings never make decode panic, and whatever decodes can be used.
    #[test]
    fn decode_mutated_encodings_never_panics(
        (algo, params) in algo_and_params(1), ops in ops(30), t0 in start(),
        muts in prop::collection::vec((any::<u8>(), any::<u16>(), any::<u64>()), 1..4),
    ) {
        let ev = run(algo, &params, &ops, t0, true);
        let Some(s) = ev.iter().rev().find_map(|e| e.after.clone()) else { return Ok(()) };
        let mut bytes = s.encode();
        for (kind, at, v) in muts {
            let len = bytes.len();
            let i = at as usize % len.max(1);
            match kind % 6 {
                0 if len > 0 => bytes[i] ^= 1 << (v % 8),
                1 if len > 0 => bytes[i] = v as u8,
                0 | 1 => {}
                2 => bytes.truncate(i),
                3 => bytes.extend_from_slice(&v.to_le_bytes()[..(v % 9) as usize]),
                _ => {
                    // Overwrite an aligned word (after the 2-byte header) with a boundary value.
                    let word = [0, 1, u64::MAX, i64::MAX as u64, i64::MIN as u64, v, 1 << 53, (1 << 53) - 1][(v % 8) as usize];
                    let j = 2 + (i.saturating_sub(2) / 8) * 8;
                    if j + 8 <= len {
                        bytes[j..j + 8].copy_from_slice(&word.to_le_bytes());
                    }
                }
            }
        }
        if let Ok(s) = State::decode(&bytes) {
            exercise_decoded(&s)?;
        }
    }
}

/// Runs a few calls on a decoded (possibly forged) state: no panic, and the basic invariants
/// hold.
fn exercise_decoded(s: &State) -> Result<(), TestCaseError> {
    let algo = s.algorithm();
    let own = params_of(s);
    let other = match own {
        Params::Rate(_) => Params::Rate(Rate::new(3, ns(7 * SEC), 5).unwrap()),
        Params::Win(_) => Params::Win(Window::new(3, ns(7 * NANOS_PER_MILLI)).unwrap()),
    };
    for p in [own, other] {
        for now in [T0, 0, T0 + 3 * SEC, 4_000_000_000 * SEC] {
            for r in [Request::new(0), Request::new(1), Request { cost: 5, partial: true }] {
                let (d, n) = check(algo, Some(s), &p, now, r);
                let cap = p.capacity();
                prop_assert!(d.remaining <= cap && d.remaining + d.allowed <= cap, "{:?}", d);
                prop_assert!(d.reset_after >= 0);
                prop_assert!(d.retry_after.is_none_or(|w| w > 0));
                if let Some(n) = n {
                    prop_assert_eq!(State::decode(&n.encode()), Ok(n));
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The 64-bit fast paths of the division helpers against their 128-bit definitions.

/// Integers around every place the 64-bit path starts or stops applying (±2^63, 0, ±1), and
/// anywhere in the range the core's scaled values take (|x| ≤ 2^115).
fn edge_i128() -> impl Strategy<Value = i128> {
    let near = |c: i128| (-3i128..=3).prop_map(move |k| c + k);
    prop_oneof![
        near(0),
        near(i64::MAX as i128),
        near(i64::MIN as i128),
        near(u64::MAX as i128),
        any::<i64>().prop_map(i128::from),
        (-(1i128 << 115)..=(1i128 << 115)),
        (0u32..116, any::<bool>(), any::<u128>()).prop_map(|(bits, neg, r)| {
            let x = (r % (1u128 << bits).max(1)) as i128;
            if neg {
                -x
            } else {
                x
            }
        }),
    ]
}

/// Positive divisors, fitting i64 or not.
fn divisor() -> impl Strategy<Value = i128> {
    prop_oneof![
        1i128..=3,
        (1i64..=i64::MAX).prop_map(i128::from),
        (i64::MAX as i128 - 3)..=(i64::MAX as i128 + 3),
        (1i128 << 63)..=(1i128 << 100),
        (0u32..100).prop_map(|b| 1i128 << b),
    ]
}

proptest! {
    #![proptest_config(config(20_000))]

    /// Floor, ceiling and truncating division give the same quotient on both paths.
    #[test]
    fn division_fast_paths_are_exact(n in edge_i128(), d in divisor()) {
        use redis_ratelimit_core::{div_ceil_i128, div_floor_i128, div_trunc_i128, exact};
        prop_assert_eq!(div_floor_i128(n, d), exact::div_floor(n, d));
        prop_assert_eq!(div_ceil_i128(n, d), exact::div_ceil(n, d));
        prop_assert_eq!(div_trunc_i128(n, d), exact::div_trunc(n, d));
        // (and the definitions are what their names say)
        let (q, r) = (n.div_euclid(d), n.rem_euclid(d));
        prop_assert_eq!(exact::div_floor(n, d), q);
        prop_assert_eq!(exact::div_ceil(n, d), q + (r != 0) as i128);
    }
}

// ---------------------------------------------------------------------------------------------
// The byte log against the word log it replaced.

#[path = "common/old_sliding_log.rs"]
mod old_sliding_log;

/// Any window: sub-µs to a century, limits from 1 to MAX_COUNT.
fn any_window() -> impl Strategy<Value = Window> {
    let limit = prop_oneof![1u64..=20, 1u64..=5_000, 1u64..=MAX_COUNT];
    let len = prop_oneof![
        1i64..=3 * US,
        1i64..=10 * NANOS_PER_MILLI,
        SEC..=3_600 * SEC,
        86_400 * SEC..=redis_ratelimit_core::MAX_PERIOD.as_i64(),
    ];
    (limit, len).prop_map(|(l, w)| Window::new(l, ns(w)).unwrap())
}

/// One call: (how far the clock moves, cost, partial, which window).
fn log_op() -> impl Strategy<Value = (i64, u64, bool, usize)> {
    let big = sliding_log::BIG;
    let dt = prop_oneof![
        3 => Just(0i64),                                  // the same µs: merges
        2 => 0i64..1_000,                                  // within a µs or just past it
        4 => (1i64..64).prop_map(|u| u * US),              // one-byte gaps
        2 => (64i64..8_192).prop_map(|u| u * US),
        2 => (8_192i64..2_000_000).prop_map(|u| u * US),
        2 => SEC..7_200 * SEC,
        1 => 86_400 * SEC..200 * 365 * 86_400 * SEC,      // beyond any window: gaps of 8 bytes
        2 => (-10 * SEC)..0,                               // the clock steps back
    ];
    let cost = prop_oneof![
        1 => Just(0u64),
        6 => Just(1u64),
        3 => 2u64..200,
        2 => (big - 3)..(big + 3),
        1 => big..4 * big,
        1 => 1u64..=MAX_COUNT,
    ];
    (dt, cost, any::<bool>(), 0usize..3)
}

proptest! {
    #![proptest_config(config(3000))]

    /// The byte log holds exactly what the word log held (entries, total, encoding byte for
    /// byte) and decides as the naive model does, on traces with merges, big counts, window
    /// changes, clocks stepping back and gaps of every length; decoding gives the same log
    /// back; the buffer stays within 4× its bytes (the shrink rule).
    #[test]
    fn byte_log_matches_word_log(
        wins in prop::collection::vec(any_window(), 3), ops in prop::collection::vec(log_op(), 1..120), t0 in start(),
    ) {
        let mut now = t0;
        let mut naive = NaiveLog { log: Vec::new() };
        let (mut new, mut old): (Option<sliding_log::State>, Option<old_sliding_log::State>) = (None, None);
        for (i, &(dt, cost, partial, wi)) in ops.iter().enumerate() {
            now = now.saturating_add(dt).clamp(0, sliding_log::MAX_TS * US);
            let w = wins[wi];
            let req = Request { cost, partial };
            let (d, c) = raw::sliding_log(new.as_ref(), &w, now, req);
            prop_assert_eq!(d, naive.check(&w, now, req), "call {} at {}", i, now);
            if let Some(c) = c {
                let s = new.get_or_insert_with(|| sliding_log::State::new(c.win));
                let o = old.get_or_insert_with(|| old_sliding_log::State::new(c.win));
                prop_assert_eq!(s.total_after(&c), o.total_after(&c));
                prop_assert!(s.total_after(&c) <= MAX_COUNT);
                s.apply(&c);
                o.apply(&c);
            }
            let (Some(s), Some(o)) = (&new, &old) else { continue };
            prop_assert_eq!(s.log.iter().collect::<Vec<_>>(), o.log.iter().collect::<Vec<_>>());
            prop_assert_eq!((s.log.total, s.log.len()), (o.log.total, o.log.entries.len()));
            prop_assert_eq!((s.log.oldest(), s.log.newest()), (o.log.oldest(), o.log.newest()));
            let enc = State::SlidingLog(Box::new(s.clone())).encode();
            prop_assert_eq!(&enc, &old_sliding_log::encode(o));
            prop_assert_eq!(State::decode(&enc), Ok(State::SlidingLog(Box::new(s.clone()))));
            let used: usize = s.log.iter().scan(None, |prev: &mut Option<i64>, (ts, c)| {
                let gap = (ts - prev.unwrap_or(ts)) as u64;
                *prev = Some(ts);
                Some(varint_len(gap << 1) + if c > 1 { varint_len(c) } else { 0 })
            }).sum();
            // (`used` counts the oldest entry's gap from itself; the log's from the entry
            // dropped before it: up to 7 bytes more.)
            prop_assert!(s.log.heap_bytes() <= 64.max(4 * (used + 7)), "{} bytes held for {}", s.log.heap_bytes(), used);
        }
    }
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// The bytes a log holds per entry, growing only: at most the entry's varints × 1.25 (the next
/// size class), from 100 entries up; one byte for requests under 64 µs apart, three under a
/// second, five under 4.8 hours (docs/PERFORMANCE.md).
#[test]
fn byte_log_memory_per_entry() {
    for (gap, bytes) in [(US, 1), (7 * NANOS_PER_MILLI, 2), (SEC / 2, 3), (60 * SEC, 4), (3_600 * SEC, 5)] {
        for n in [10u64, 100, 1_000, 10_000] {
            let w = Window::new(n, redis_ratelimit_core::MAX_PERIOD).unwrap();
            let mut s = sliding_log::State::new(w);
            for i in 0..n as i64 {
                let (_, c) = raw::sliding_log(Some(&s), &w, T0 + i * gap, Request::new(1));
                s.apply(&c.expect("admitted"));
            }
            assert_eq!(s.log.len() as u64, n);
            let per_entry = s.log.heap_bytes() as f64 / n as f64;
            let bound = if n >= 100 { 1.25 * bytes as f64 } else { 2.0 * bytes as f64 };
            assert!(per_entry <= bound, "gap {gap} ns, {n} entries: {per_entry} B/entry, bound {bound}");
        }
    }
}

/// A log's memory follows its traffic: once the entries have left the window, the buffer is
/// given back down to a small one (a quarter used at most before it shrinks).
#[test]
fn byte_log_memory_follows_traffic() {
    let w = Window::new(100_000, ns(SEC)).unwrap();
    let mut s = sliding_log::State::new(w);
    let mut now = T0;
    let call = |s: &mut sliding_log::State, now: i64| {
        let (_, c) = raw::sliding_log(Some(s), &w, now, Request::new(1));
        s.apply(&c.expect("admitted"));
    };
    for _ in 0..50_000 {
        now += 10 * US; // 10 µs apart: one byte each
        call(&mut s, now);
    }
    let full = s.log.heap_bytes();
    assert!(full <= 50_000 * 5 / 4, "{full}");
    // Half a window on, half the entries are left: more than a quarter used, nothing given back.
    now += 3 * SEC / 4;
    call(&mut s, now);
    assert_eq!(s.log.len(), 25_001);
    assert_eq!(s.log.heap_bytes(), full);
    // Past the window: one entry left, and the buffer with it.
    now += 2 * SEC;
    call(&mut s, now);
    assert_eq!(s.log.len(), 1);
    assert!(s.log.heap_bytes() <= 64, "{}", s.log.heap_bytes());
}
