//! Every state the core writes can be loaded again (issue 17.1), and a leaky bucket never hands
//! one departure slot to two requests (issue 17.4). No Redis needed; run with
//! `cargo test --release --test core_closure_props`.
//!
//! Closure: from any state the decoder accepts (the bytes of an RDB file, a DUMP payload, an AOF
//! or a replication stream, or whatever a user hands RL.SETSTATE), any sequence of calls (checks
//! with parameters changing on the live key, extreme costs and limits, PARTIAL, DRYRUN, returns,
//! sliding-log commits as RL.SETSTATE applies them, the clock moving anywhere, backwards too)
//! leaves a state that encodes and decodes to itself, byte for byte; every update a call would
//! replicate decodes on the replica as the same update.

use proptest::prelude::*;

use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::give_back::{self, Credit, Refusal};
use redis_ratelimit_core::spec::{AlgorithmMismatch, Spec, Update};
use redis_ratelimit_core::Algorithm;
use redis_ratelimit_core::{
    fixed, gcra, leaky, sliding, sliding_log, token_bucket, Rate, Request, Window, MAX_COUNT, NANOS_PER_MICRO,
    NANOS_PER_MILLI, NANOS_PER_SEC,
};

#[path = "common/core_dispatch.rs"]
mod core_dispatch;

use core_dispatch::{config, ns, RawDecision};

const MAX_PERIOD: i64 = redis_ratelimit_core::MAX_PERIOD.as_i64();

/// `spec.check` at a raw instant, its decision raw.
fn check_spec(
    spec: &Spec,
    st: Option<&State>,
    now: i64,
    req: Request,
) -> Result<(RawDecision, Option<Update>), AlgorithmMismatch> {
    spec.check(st, ns(now), req).map(|(d, u)| (d.into(), u))
}

/// The core's `give_back` at raw instants and ages.
fn give_back(state: &State, n: u64, age: Option<i64>, now: i64) -> Result<Credit, Refusal> {
    give_back::give_back(state, n, age.map(ns), ns(now))
}

const SEC: i64 = NANOS_PER_SEC;
const T0: i64 = 1_800_000_000 * SEC;
/// Latest instant the module's clock reaches (the debug clock's and the sliding log's range).
const MAX_NOW: i64 = sliding_log::MAX_TS * NANOS_PER_MICRO;
/// The decoder's bound on stored scaled values (codec.rs).
const SCALED_BOUND: i128 = 1 << 115;

// ---------------------------------------------------------------------------------------------
// The loadability check.

/// `s` survives what every stored state goes through (RDB save and load, DUMP/RESTORE, a
/// replica's full sync, an AOF rewrite): encode, decode, the same state and the same bytes.
fn assert_loadable(s: &State, what: &str) -> Result<(), TestCaseError> {
    let bytes = s.encode();
    match State::decode(&bytes) {
        Ok(back) => {
            prop_assert_eq!(&back, s, "{}: decode(encode(state)) is another state", what);
            prop_assert_eq!(back.encode(), bytes, "{}: re-encoding differs", what);
            Ok(())
        }
        Err(e) => Err(TestCaseError::fail(format!("{what}: a state the module holds does not decode ({e}): {s:?}"))),
    }
}

/// What a replica does with a replicated update: decode it (RL.SETSTATE) as the same update.
fn assert_replicable(u: &Update, what: &str) -> Result<(), TestCaseError> {
    let mut bytes = Vec::new();
    u.encode_into(&mut bytes);
    match Update::decode(&bytes) {
        Ok(back) => {
            prop_assert_eq!(&back, u, "{}: the replica decodes another update", what);
            Ok(())
        }
        Err(e) => Err(TestCaseError::fail(format!("{what}: the replica refuses the replicated update ({e}): {u:?}"))),
    }
}

// ---------------------------------------------------------------------------------------------
// Generators: parameters, instants and stored values at and around every bound.

fn count() -> impl Strategy<Value = u64> {
    prop_oneof![Just(1u64), Just(MAX_COUNT), 1u64..=20, 1u64..=1_000_000, (MAX_COUNT - 3)..=MAX_COUNT, 1u64..=MAX_COUNT,]
}

fn period() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(1i64),
        Just(NANOS_PER_MICRO),
        Just(SEC),
        Just(3_600 * SEC),
        Just(7_200 * SEC),
        Just(MAX_PERIOD),
        1i64..=1_000_000,
        1i64..=MAX_PERIOD,
    ]
}

fn rate() -> impl Strategy<Value = Rate> {
    (count(), period(), count(), 0u8..4).prop_map(|(limit, period, burst, pick)| {
        let burst = match pick {
            0 => limit,
            1 => 1,
            _ => burst,
        };
        // BURST × period / limit is bounded (200 years): fall back to BURST = limit, always valid.
        Rate::new(limit, ns(period), burst).unwrap_or_else(|_| Rate::new(limit, ns(period), limit).unwrap())
    })
}

fn window() -> impl Strategy<Value = Window> {
    (count(), period()).prop_map(|(l, w)| Window::new(l, ns(w)).unwrap())
}

/// Any instant a core function may be called at, mostly the module's clock range.
fn instant() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => (0i64..1_000_000_000_000).prop_map(|o| T0 + o),
        2 => 0i64..=MAX_NOW,
        1 => Just(0i64),
        1 => Just(MAX_NOW),
        1 => Just(i64::MAX),
        1 => Just(i64::MIN),
        1 => any::<i64>(),
    ]
}

/// Stored counts: the decoder accepts up to 2 × MAX_COUNT.
fn stored_units() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1u64),
        Just(MAX_COUNT),
        Just(MAX_COUNT + 1),
        Just(2 * MAX_COUNT),
        0u64..=20,
        0u64..=2 * MAX_COUNT,
    ]
}

/// Stored scaled values (arrival times, balances): anywhere the decoder accepts.
fn scaled() -> impl Strategy<Value = i128> {
    prop_oneof![
        Just(0i128),
        Just(SCALED_BOUND),
        Just(-SCALED_BOUND),
        (-3i128..=3).prop_map(|k| SCALED_BOUND - 3 + k),
        (-3i128..=3).prop_map(|k| -SCALED_BOUND + 3 + k),
        // Around now × limit for today's clock.
        (0i128..1 << 20, 1u64..=MAX_COUNT).prop_map(|(o, l)| T0 as i128 * l as i128 + o),
        any::<i64>().prop_map(i128::from),
        -SCALED_BOUND..=SCALED_BOUND,
    ]
}

fn window_index() -> impl Strategy<Value = i64> {
    prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(0i64), any::<i64>(), 0i64..2_000_000_000]
}

/// A sliding log as a payload may hold it: entries in order, counts ≥ 1, total ≤ 2 × MAX_COUNT.
fn stored_log() -> impl Strategy<Value = sliding_log::State> {
    let entry = (
        prop_oneof![Just(0i64), 0i64..1_000, 0i64..100_000_000, 0i64..=sliding_log::MAX_TS],
        prop_oneof![Just(1u64), 1u64..5_000, (sliding_log::BIG - 2)..(sliding_log::BIG + 2), 1u64..=2 * MAX_COUNT],
    );
    (window(), 0i64..=sliding_log::MAX_TS, prop::collection::vec(entry, 0..12)).prop_map(|(win, start, entries)| {
        let mut s = sliding_log::State::new(win);
        let (mut ts, mut total) = (start, 0u64);
        for (gap, c) in entries {
            ts = ts.saturating_add(gap).min(sliding_log::MAX_TS);
            if total + c > 2 * MAX_COUNT {
                break;
            }
            total += c;
            s.log.push_stored(ts, c);
        }
        s
    })
}

/// A state with arbitrary fields, in or near the decoder's range.
fn raw_state() -> impl Strategy<Value = State> {
    prop_oneof![
        (rate(), scaled()).prop_map(|(rate, tat)| State::Gcra(gcra::State { rate, tat })),
        (rate(), scaled()).prop_map(|(rate, tat)| State::Leaky(leaky::State(gcra::State { rate, tat }))),
        (rate(), scaled(), instant()).prop_map(|(rate, t, last)| {
            // The decoder refuses a balance above the capacity.
            let tokens = t.min(rate.burst as i128 * rate.period.as_i128());
            State::TokenBucket(token_bucket::State { rate, tokens, last: ns(last) })
        }),
        (window(), window_index(), stored_units(), stored_units())
            .prop_map(|(win, index, prev, curr)| State::Sliding(sliding::State { win, index, prev, curr })),
        (window(), window_index(), stored_units()).prop_map(|(win, index, count)| State::Fixed(fixed::State {
            win,
            index,
            count
        })),
        stored_log().prop_map(|s| State::SlidingLog(Box::new(s))),
    ]
}

/// A payload the decoder may accept: a raw state's encoding, possibly with a word overwritten.
fn payload() -> impl Strategy<Value = Vec<u8>> {
    (raw_state(), prop::collection::vec((any::<u16>(), any::<u64>(), any::<u8>()), 0..2)).prop_map(|(s, muts)| {
        let mut bytes = s.encode();
        for (at, v, pick) in muts {
            let words = (bytes.len() - 2) / 8;
            if words == 0 {
                continue;
            }
            let j = 2 + (at as usize % words) * 8;
            let word =
                [0, 1, v, u64::MAX, i64::MAX as u64, MAX_COUNT, 2 * MAX_COUNT, 2 * MAX_COUNT + 1][pick as usize % 8];
            bytes[j..j + 8].copy_from_slice(&word.to_le_bytes());
        }
        bytes
    })
}

// ---------------------------------------------------------------------------------------------
// Calls.

#[derive(Clone, Debug)]
enum Op {
    /// A check; `params`: 0 keeps the key's parameters, 1 uses `rate`/`win`, 2 and 3 change one
    /// of them only.
    Check { params: u8, rate: Rate, win: Window, cost: u64, partial: bool, dryrun: bool },
    /// RL.RETURN key n [AGE age].
    Return { n: u64, age: Option<i64> },
    /// An RL.SETSTATE sliding-log commit.
    Commit { win: Window, cutoff_back: i64, ts: i64, units: u64 },
    /// The clock moves (forward, back, or anywhere).
    Clock { kind: u8, by: i64, to: i64 },
}

fn cost() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), Just(1u64), 1u64..=20, Just(MAX_COUNT), 0u64..=MAX_COUNT]
}

fn age() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        Just(None),
        Just(Some(0i64)),
        (0i64..=10 * SEC).prop_map(Some),
        (0u64..=MAX_COUNT).prop_map(|ms| Some((ms as i128 * NANOS_PER_MILLI as i128).min(i64::MAX as i128) as i64)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4, rate(), window(), cost(), any::<bool>(), prop::bool::weighted(0.1)).prop_map(
            |(params, rate, win, cost, partial, dryrun)| Op::Check { params, rate, win, cost, partial, dryrun }
        ),
        2 => (prop_oneof![1u64..=20, Just(MAX_COUNT), 1u64..=MAX_COUNT], age()).prop_map(|(n, age)| Op::Return { n, age }),
        1 => (window(), any::<i64>(), 0i64..=sliding_log::MAX_TS, 1u64..=MAX_COUNT)
            .prop_map(|(win, cutoff_back, ts, units)| Op::Commit { win, cutoff_back, ts, units }),
        3 => (0u8..6, 0i64..1 << 40, instant()).prop_map(|(kind, by, to)| Op::Clock { kind, by, to }),
    ]
}

fn own_spec(s: &State) -> Spec {
    match s {
        State::Gcra(g) => Spec::Gcra(g.rate),
        State::Leaky(l) => Spec::Leaky(l.0.rate),
        State::TokenBucket(t) => Spec::TokenBucket(t.rate),
        State::Sliding(x) => Spec::Sliding(x.win),
        State::Fixed(x) => Spec::Fixed(x.win),
        State::SlidingLog(x) => Spec::SlidingLog(x.win),
    }
}

/// The spec of a check on a key holding `s`.
fn spec_for(s: &State, params: u8, rate: Rate, win: Window) -> Spec {
    let own = own_spec(s);
    let r = |old: Rate| match params {
        0 => old,
        1 => rate,
        2 => Rate::new(rate.limit, old.period, old.burst).unwrap_or(rate),
        _ => Rate::new(old.limit, rate.period, rate.burst).unwrap_or(rate),
    };
    let w = |old: Window| match params {
        0 => old,
        1 => win,
        2 => Window { limit: win.limit, ..old },
        _ => Window { window: win.window, ..old },
    };
    match own {
        Spec::Gcra(o) => Spec::Gcra(r(o)),
        Spec::Leaky(o) => Spec::Leaky(r(o)),
        Spec::TokenBucket(o) => Spec::TokenBucket(r(o)),
        Spec::Sliding(o) => Spec::Sliding(w(o)),
        Spec::Fixed(o) => Spec::Fixed(w(o)),
        Spec::SlidingLog(o) => Spec::SlidingLog(w(o)),
    }
}

/// Runs `ops` on a key holding `st` from `now`; every state it holds must stay loadable.
fn run_from(mut st: State, mut now: i64, ops: &[Op]) -> Result<(), TestCaseError> {
    assert_loadable(&st, "the state as loaded")?;
    for (i, op) in ops.iter().enumerate() {
        let what = format!("op {i} {op:?} at {now}");
        match *op {
            Op::Check { params, rate, win, cost, partial, dryrun } => {
                let spec = spec_for(&st, params, rate, win);
                let req = Request { cost, partial };
                let (_, u) = check_spec(&spec, Some(&st), now, req).expect("same algorithm");
                let Some(u) = u else { continue };
                assert_replicable(&u, &what)?;
                if dryrun {
                    continue;
                }
                match u.apply(Some(&mut st)) {
                    Ok(None) => {}
                    Ok(Some(_)) => unreachable!("an update on a stored key returns no new state"),
                    Err(e) => {
                        return Err(TestCaseError::fail(format!("{what}: the check's own update is refused: {e}")))
                    }
                }
                assert_loadable(&st, &what)?;
            }
            Op::Return { n, age } => {
                // (A refusal writes nothing.)
                if let Ok(c) = give_back(&st, n, age, now) {
                    prop_assert!(c.credited <= n);
                    if let Some(new) = c.state {
                        assert_replicable(&Update::Replace(new.clone()), &what)?;
                        assert_loadable(&new, &what)?;
                        st = new;
                    }
                }
            }
            Op::Commit { win, cutoff_back, ts, units } => {
                if !matches!(st, State::SlidingLog(_)) {
                    continue;
                }
                // As RL.SETSTATE: decode the payload, refuse more units than the limit, apply.
                let c = sliding_log::Commit {
                    win,
                    cutoff: (now / NANOS_PER_MICRO).saturating_sub(cutoff_back),
                    ts,
                    units: 1 + (units - 1) % win.limit,
                };
                let mut bytes = Vec::new();
                Update::Log(c).encode_into(&mut bytes);
                let Ok(u) = Update::decode(&bytes) else { continue };
                if u.apply(Some(&mut st)).is_ok() {
                    assert_loadable(&st, &what)?;
                }
            }
            Op::Clock { kind, by, to } => {
                now = match kind {
                    0 => now.saturating_add(by % (1 << 20)),
                    1 => now.saturating_add(by),
                    2 => now.saturating_sub(by % (1 << 20)),
                    3 => now.saturating_sub(by),
                    _ => to,
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(4000))]

    /// From any payload the decoder accepts, any sequence of calls leaves loadable states.
    #[test]
    fn every_state_written_from_any_loaded_state_loads(
        bytes in payload(), now in instant(), ops in prop::collection::vec(op(), 1..24),
    ) {
        let Ok(st) = State::decode(&bytes) else { return Ok(()) };
        run_from(st, now, &ops)?;
    }

    /// From states the module's own calls write (a fresh key, any parameters), the same.
    #[test]
    fn every_state_written_from_a_fresh_key_loads(
        spec_pick in 0usize..6, rate in rate(), win in window(), now in instant(),
        first in cost(), ops in prop::collection::vec(op(), 1..32),
    ) {
        let spec = match Algorithm::ALL[spec_pick] {
            Algorithm::Gcra => Spec::Gcra(rate),
            Algorithm::TokenBucket => Spec::TokenBucket(rate),
            Algorithm::Leaky => Spec::Leaky(rate),
            Algorithm::Sliding => Spec::Sliding(win),
            Algorithm::Fixed => Spec::Fixed(win),
            Algorithm::SlidingLog => Spec::SlidingLog(win),
        };
        let (_, u) = check_spec(&spec, None, now, Request { cost: first.max(1), partial: true }).unwrap();
        let Some(u) = u else { return Ok(()) };
        assert_replicable(&u, "the first check")?;
        let st = u.apply(None).unwrap().expect("a new key");
        run_from(st, now, &ops)?;
    }
}

/// The reproduction of issue 17.1: RL.SETSTATE accepts a sliding counter with previous =
/// current = 2·10^15 for a limit of 10^15 (window 1 h); one RL.SLIDING call under a 2 h window
/// stored current = 4·10^15, which the decoder refuses.
#[test]
fn sliding_window_change_on_an_overfull_key_stays_loadable() {
    let hex = "01030080c6a47e8d030000a0b8304603000020a107000000000000008d49fd1a070000008d49fd1a0700";
    let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    let st = State::decode(&bytes).expect("the payload RL.SETSTATE accepted");
    let State::Sliding(s) = &st else { panic!("{st:?}") };
    assert_eq!(
        (s.win.limit, s.win.window.as_i64(), s.prev, s.curr),
        (MAX_COUNT, 3_600 * SEC, 2 * MAX_COUNT, 2 * MAX_COUNT)
    );
    let now = 1_800_000_000_000_000 * NANOS_PER_MICRO;
    let spec = Spec::Sliding(Window::new(MAX_COUNT, ns(7_200 * SEC)).unwrap());
    let (d, u) = check_spec(&spec, Some(&st), now, Request::new(1)).unwrap();
    assert_eq!((d.allowed, d.remaining), (0, 0));
    let mut st = st;
    u.expect("a limited call under new parameters keeps them").apply(Some(&mut st)).unwrap();
    let bytes = st.encode();
    assert_eq!(State::decode(&bytes), Ok(st.clone()), "the stored state must load again");
}

// ---------------------------------------------------------------------------------------------
// Normalising on load changes no answer that matters.

proptest! {
    #![proptest_config(config(3000))]

    /// What decoding brings back into range answers as the payload would have: the same units
    /// granted and remaining for every request at every instant of the module's clock (but for
    /// a window index beyond every instant, made the last window's); the whole
    /// decision where an equivalent in-range state exists (GCRA's arrival time far in the past,
    /// a token debt that fits a later `last` exactly, a fixed-window count above any limit).
    #[test]
    fn normalising_on_load_keeps_the_answers(
        raw in raw_state(), now in 0i64..=MAX_NOW, near in any::<bool>(), cost in cost(), partial in any::<bool>(),
    ) {
        let Ok(loaded) = State::decode(&raw.encode()) else { return Ok(()) };
        let spec = own_spec(&raw);
        // Instants near the stored ones, where the states have something to say.
        let now = match (&raw, near) {
            (State::TokenBucket(t), true) => t.last.as_i64().saturating_add(now % (1 << 30)).clamp(0, MAX_NOW),
            (State::Gcra(g), true) => (g.tat / g.rate.limit as i128).clamp(0, MAX_NOW as i128) as i64,
            _ => now,
        };
        // A window that begins after the last representable instant has no equivalent: it
        // becomes the last window, which the clock reaches.
        let future_window = match (&raw, &loaded) {
            (State::Sliding(r), State::Sliding(l)) => r.index > l.index,
            (State::Fixed(r), State::Fixed(l)) => r.index > l.index,
            _ => false,
        };
        if future_window {
            return Ok(());
        }
        let req = Request { cost, partial };
        let (want, _) = check_spec(&spec, Some(&raw), now, req).unwrap();
        let (got, _) = check_spec(&spec, Some(&loaded), now, req).unwrap();
        prop_assert_eq!((got.allowed, got.remaining), (want.allowed, want.remaining), "{:?} loaded as {:?}", raw, loaded);
        let exact = match (&raw, &loaded) {
            (State::Gcra(r), State::Gcra(l)) => { let (rt, lt) = (r.tat, l.tat); rt <= lt }
            (State::TokenBucket(r), State::TokenBucket(l)) => {
                let (rt, lt, rl, ll) = (r.tokens, l.tokens, r.last.as_i64(), l.last.as_i64());
                rt >= 0 || (ll != i64::MAX && (lt - rt) == (ll as i128 - rl as i128) * r.rate.limit as i128)
            }
            (State::Fixed(r), State::Fixed(l)) => r.index == l.index,
            _ => raw == loaded,
        };
        if exact {
            prop_assert_eq!(got, want, "{:?} loaded as {:?}", raw, loaded);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The leaky bucket: no departure slot is ever handed out twice (issue 17.4), also when the
// parameters of the live key change.

#[derive(Clone, Debug)]
enum LeakyOp {
    /// A batch claimed with `COST n PARTIAL`, or one request.
    Claim(u64, bool),
    /// RL.RETURN: always refused.
    Return(u64, Option<i64>),
    /// The clock moves forward, or back.
    Forward(i64),
    Back(i64),
    /// New parameters on the live key from now on: the limit, the period, BURST (up or down),
    /// or all three.
    Limit(u64),
    Period(i64),
    Burst(u64),
    Rate(Rate),
}

fn queue_period() -> impl Strategy<Value = i64> {
    prop_oneof![Just(SEC), Just(7 * SEC), 1i64..=3 * SEC]
}

fn queue_rate() -> impl Strategy<Value = Rate> {
    (1u64..=20, queue_period(), 1u64..=60).prop_map(|(l, p, b)| Rate::new(l, ns(p), b).unwrap())
}

fn leaky_op() -> impl Strategy<Value = LeakyOp> {
    prop_oneof![
        5 => (1u64..=12, any::<bool>()).prop_map(|(n, p)| LeakyOp::Claim(n, p)),
        3 => (1u64..=12, age()).prop_map(|(n, a)| LeakyOp::Return(n, a)),
        3 => (0i64..5 * SEC).prop_map(LeakyOp::Forward),
        1 => (0i64..5 * SEC).prop_map(LeakyOp::Back),
        1 => (1u64..=20).prop_map(LeakyOp::Limit),
        1 => queue_period().prop_map(LeakyOp::Period),
        1 => (1u64..=60).prop_map(LeakyOp::Burst),
        1 => queue_rate().prop_map(LeakyOp::Rate),
    ]
}

/// An admitted request as the caller sees it (ns): it leaves at `dep` (arrival + delay) with
/// `units` slots one interval of `rate` apart, and the queue drains at `drain` (arrival +
/// reset_after).
#[derive(Clone, Copy, Debug)]
struct Admitted {
    dep: i128,
    drain: i128,
    units: u64,
    rate: Rate,
}

proptest! {
    #![proptest_config(config(3000))]

    /// Claims, single requests, returns, the clock (back too) and changes of limit, period and
    /// BURST on the live key, interleaved. What holds, from the replies alone (all in ns):
    ///
    /// - FIFO without idling: an admitted request leaves exactly at max(its arrival, the instant
    ///   the queue drained after the previous admitted one), whatever changed in between. So the
    ///   queue's promises survive every change: no request takes a slot an earlier one holds.
    /// - The queue drains `units` intervals (`period / limit` of the parameters it was admitted
    ///   under) after a request's first unit leaves, up to the 1 ns the reported instants are
    ///   rounded up by. With the above: consecutive departures are at least `units` × the
    ///   earlier request's interval apart (less than 1 ns of rounding): where the parameters
    ///   changed, the first departure under the new ones follows the last one under the old
    ///   ones by the old interval (≥ min(old, new)), and the next by the new interval.
    /// - The queue is what limits: an admitted request fits the queue depth (BURST) after the
    ///   queue found on arrival; a limited one does not (a queue deeper than a lowered BURST
    ///   refuses until it has drained to the new depth). A limited call writes nothing, and
    ///   retry_after is exact: 1 ns earlier the same request is still limited, at retry_after it
    ///   is admitted, leaving when the queue drains at the earliest.
    /// - RL.RETURN is refused and leaves the key as it was; every state stored encodes and
    ///   decodes to itself.
    #[test]
    fn leaky_bucket_never_gives_a_slot_twice(
        rate in queue_rate(), ops in prop::collection::vec(leaky_op(), 1..80), t0 in instant(),
    ) {
        let t0 = t0.clamp(10 * SEC * 80, MAX_NOW);
        let mut rate = rate;
        let mut st: Option<State> = None;
        let mut now = t0;
        let mut prev: Option<Admitted> = None;
        let change = |old: Rate, limit: u64, period: i64, burst: u64| Rate::new(limit, ns(period), burst).unwrap_or(old);
        for op in &ops {
            let r = rate;
            match *op {
                LeakyOp::Claim(n, partial) => {
                    let spec = Spec::Leaky(r);
                    let req = Request { cost: n, partial };
                    let (l, p, b) = (r.limit as i128, r.period.as_i128(), r.burst as i128);
                    let (d, u) = check_spec(&spec, st.as_ref(), now, req).unwrap();
                    // The queue found on arrival, in ns (none before the first admission).
                    let ahead = prev.map_or(0, |a| (a.drain - now as i128).max(0));
                    if d.allowed == 0 {
                        prop_assert!(u.is_none(), "{:?}: a limited call wrote {:?}", r, u);
                        let need = if partial { 1 } else { n };
                        let Some(w) = d.retry_after else {
                            prop_assert!(need > r.burst, "{:?} {:?}: limited for good", r, req);
                            continue;
                        };
                        prop_assert!(
                            ahead * l > (b - need as i128) * p,
                            "{:?} {:?}: limited with {} ns queued, which leaves room", r, req, ahead
                        );
                        let (early, _) = check_spec(&spec, st.as_ref(), now + w - 1, req).unwrap();
                        prop_assert_eq!(early.allowed, 0, "{:?} {:?}: admitted 1 ns before retry_after {}", r, req, w);
                        let (on_time, _) = check_spec(&spec, st.as_ref(), now + w, req).unwrap();
                        prop_assert!(on_time.allowed > 0, "{:?} {:?}: limited at retry_after {}", r, req, w);
                        let drain = prev.map_or(0, |a| a.drain);
                        let dep = (now + w) as i128 + on_time.delay.unwrap() as i128;
                        prop_assert_eq!(dep, drain.max((now + w) as i128), "{:?}: at retry_after", r);
                        continue;
                    }
                    if let Some(new) = u.expect("an admitted call stores").apply(st.as_mut()).unwrap() {
                        st = Some(new);
                    }
                    assert_loadable(st.as_ref().unwrap(), &format!("{op:?} under {r:?} at {now}"))?;
                    let dep = now as i128 + d.delay.expect("an admitted leaky call has a delay") as i128;
                    let drain = now as i128 + d.reset_after as i128;
                    if let Some(a) = prev {
                        prop_assert_eq!(
                            dep, a.drain.max(now as i128),
                            "{:?} after {:?}: not at the previous drain instant (or on arrival)", r, a
                        );
                        let (pl, pp) = (a.rate.limit as i128, a.rate.period.as_i128());
                        prop_assert!(
                            (dep - a.dep) * pl + pl > a.units as i128 * pp,
                            "{:?}: departure at {} after {:?}: closer than its {} intervals", r, dep, a, a.units
                        );
                    }
                    prop_assert!(
                        (dep - now as i128) * l < (b - d.allowed as i128) * p + l,
                        "{:?}: {} admitted behind {} ns of queue: deeper than BURST", r, d.allowed, dep - now as i128
                    );
                    prop_assert!(
                        ((drain - dep) * l - d.allowed as i128 * p).abs() < l,
                        "{:?}: {} units leaving from {} drain at {}", r, d.allowed, dep, drain
                    );
                    prev = Some(Admitted { dep, drain, units: d.allowed, rate: r });
                }
                LeakyOp::Return(n, age) => {
                    if let Some(s) = &st {
                        prop_assert_eq!(give_back(s, n, age, now), Err(Refusal::Leaky));
                    }
                }
                LeakyOp::Forward(dt) => now += dt,
                LeakyOp::Back(dt) => now -= dt,
                LeakyOp::Limit(limit) => rate = change(r, limit, r.period.as_i64(), r.burst),
                LeakyOp::Period(period) => rate = change(r, r.limit, period, r.burst),
                LeakyOp::Burst(burst) => rate = change(r, r.limit, r.period.as_i64(), burst),
                LeakyOp::Rate(new) => rate = new,
            }
        }
    }
}

/// The reproduction of issue 17.4: three requests queued 1 s apart, one unit returned, and the
/// next request used to get the third one's slot (delay 2000 ms twice).
#[test]
fn leaky_return_does_not_hand_out_a_promised_slot() {
    let rate = Rate::new(1, ns(SEC), 10).unwrap();
    let spec = Spec::Leaky(rate);
    let now = 1_800_000_000_000_000 * NANOS_PER_MICRO;
    let mut st: Option<State> = None;
    let admit = |st: &mut Option<State>| {
        let (d, u) = check_spec(&spec, st.as_ref(), now, Request::new(1)).unwrap();
        if let Some(new) = u.unwrap().apply(st.as_mut()).unwrap() {
            *st = Some(new);
        }
        d.delay.unwrap()
    };
    assert_eq!([admit(&mut st), admit(&mut st), admit(&mut st)], [0, SEC, 2 * SEC]);
    assert_eq!(give_back(st.as_ref().unwrap(), 1, Some(0), now), Err(Refusal::Leaky));
    assert_eq!(admit(&mut st), 3 * SEC, "the next request queues after the third");
}
