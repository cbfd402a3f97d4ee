//! Fuzz targets for redis-ratelimit, as plain functions of a byte slice, so that the same code
//! runs under libFuzzer (`cargo fuzz`, fuzz_targets/*.rs, built with debug assertions and
//! overflow checks) and as proptest "fuzz" tests in CI (tests/fuzz_props.rs includes this file).
//!
//! Every target panics on a broken invariant; a panic in the code under test (including an
//! arithmetic overflow under overflow checks) is a finding too.

#![allow(clippy::manual_range_contains)]

use redis_ratelimit::args;
use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::give_back::{give_back, Refusal};
use redis_ratelimit_core::spec::{Spec, Update};
use redis_ratelimit_core::Algorithm;
use redis_ratelimit_core::{
    sliding_log, Decision, Nanos, Rate, Request, Window, MAX_COUNT, MAX_PERIOD, NANOS_PER_MICRO, NANOS_PER_MILLI,
    NANOS_PER_SEC,
};

/// Reads structure from fuzz bytes; past the end every read is 0.
pub struct Bytes<'a>(pub &'a [u8]);

impl Bytes<'_> {
    pub fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        let n = self.0.len().min(8);
        b[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        u64::from_le_bytes(b)
    }
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.u64() % n
        }
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

// ---------------------------------------------------------------------------------------------
// Target 1: argument parsing.

/// A reference parser for the module's integers: ASCII digits only (leading zeros allowed),
/// no sign, a value that fits a u64.
fn ref_digits(a: &[u8]) -> Option<u128> {
    if a.is_empty() || !a.iter().all(|b| b.is_ascii_digit()) {
        return None;
    }
    a.iter()
        .try_fold(0u128, |acc, &d| acc.checked_mul(10)?.checked_add((d - b'0') as u128))
        .filter(|&v| v <= u64::MAX as u128)
}

/// A reference parser for periods: digits, then an optional unit (case-insensitive).
fn ref_period(a: &[u8]) -> Option<i64> {
    let split = a.iter().position(|b| !b.is_ascii_digit()).unwrap_or(a.len());
    let n = ref_digits(&a[..split]).filter(|&n| n > 0)?;
    let unit = a[split..].to_ascii_lowercase();
    let scale: u128 = match unit.as_slice() {
        b"" | b"s" => 1_000_000_000,
        b"us" => 1_000,
        b"ms" => 1_000_000,
        b"m" => 60_000_000_000,
        b"h" => 3_600_000_000_000,
        b"d" => 86_400_000_000_000,
        _ => return None,
    };
    let ns = n.checked_mul(scale)?;
    (ns <= MAX_PERIOD.as_i64() as u128).then_some(ns as i64)
}

fn assert_err_message(e: &str) {
    assert!(e.starts_with("ERR "), "error without ERR: {e:?}");
    assert!(!e.contains(['\r', '\n', '\0']), "error message breaks the protocol: {e:?}");
    assert!(e.len() < 300, "error message too long ({} bytes)", e.len());
}

fn capacity(spec: &Spec) -> u64 {
    match spec {
        Spec::Gcra(r) | Spec::TokenBucket(r) | Spec::Leaky(r) => r.burst,
        Spec::Sliding(w) | Spec::Fixed(w) | Spec::SlidingLog(w) => w.limit,
    }
}

/// Renders a parsed check as canonical arguments (which must parse back to the same check).
fn render(c: &args::CheckArgs) -> Vec<Vec<u8>> {
    let (limit, period, burst) = match c.spec {
        Spec::Gcra(r) | Spec::TokenBucket(r) | Spec::Leaky(r) => (r.limit, r.period, Some(r.burst)),
        Spec::Sliding(w) | Spec::Fixed(w) | Spec::SlidingLog(w) => (w.limit, w.window, None),
    };
    let mut v = vec![limit.to_string().into_bytes(), format!("{}us", period.as_i64() / NANOS_PER_MICRO).into_bytes()];
    if let Some(b) = burst {
        v.extend([b"burst".to_vec(), b.to_string().into_bytes()]);
    }
    v.extend([b"Cost".to_vec(), c.req.cost.to_string().into_bytes()]);
    if c.dryrun {
        v.push(b"dryRun".to_vec());
    }
    if c.req.partial {
        v.push(b"PARTIAL".to_vec());
    }
    v
}

/// Input: one selector byte, then arguments separated by 0x00.
pub fn args_target(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else { return };
    let argv: Vec<&[u8]> = rest.split(|&b| b == 0).collect();
    let algo = Algorithm::ALL[(sel % 6) as usize];
    let bucket = algo.is_bucket();
    match args::check(algo, &argv, "RL.X") {
        Ok(c) => {
            let cap = capacity(&c.spec);
            assert!(cap >= 1 && cap <= MAX_COUNT, "capacity {cap}");
            assert!(c.req.cost <= MAX_COUNT);
            assert_eq!(c.spec.algorithm(), algo);
            // Nothing lenient: the limit and period arguments are exactly canonical numbers.
            let limit = ref_digits(argv[0]).expect("limit accepted but not digits");
            assert!(limit >= 1 && limit <= MAX_COUNT as u128);
            let period = ref_period(argv[1]).expect("period accepted but the reference parser refuses it");
            match c.spec {
                Spec::Gcra(r) | Spec::TokenBucket(r) | Spec::Leaky(r) => {
                    assert_eq!((r.limit as u128, r.period.as_i64()), (limit, period));
                    assert!(Rate::new(r.limit, r.period, r.burst).is_ok());
                }
                Spec::Sliding(w) | Spec::Fixed(w) | Spec::SlidingLog(w) => {
                    assert!(!bucket);
                    assert_eq!((w.limit as u128, w.window.as_i64()), (limit, period));
                }
            }
            // Round trip through canonical arguments.
            let canon = render(&c);
            let refs: Vec<&[u8]> = canon.iter().map(|v| v.as_slice()).collect();
            assert_eq!(args::check(algo, &refs, "RL.X").as_ref(), Ok(&c), "canonical form parses differently");
        }
        Err(e) => assert_err_message(&e),
    }
    // Each argument alone through each scalar parser, against the reference parsers.
    for a in &argv {
        match args::period(a, "period") {
            Ok(ns) => assert_eq!(Some(ns.as_i64()), ref_period(a), "period {:?}", String::from_utf8_lossy(a)),
            Err(e) => {
                assert_err_message(&e);
                assert_eq!(ref_period(a), None, "period {:?} refused: {e}", String::from_utf8_lossy(a));
            }
        }
        let n = ref_digits(a);
        match args::positive(a, "limit") {
            Ok(v) => assert_eq!(Some(v as u128), n.filter(|&n| n >= 1 && n <= MAX_COUNT as u128)),
            Err(e) => {
                assert_err_message(&e);
                assert!(!n.is_some_and(|n| n >= 1 && n <= MAX_COUNT as u128));
            }
        }
        match args::non_negative(a, "COST") {
            Ok(v) => assert_eq!(Some(v as u128), n.filter(|&n| n <= MAX_COUNT as u128)),
            Err(e) => {
                assert_err_message(&e);
                assert!(n.is_none_or(|n| n > MAX_COUNT as u128));
            }
        }
        let (neg, body) = match a.first() {
            Some(b'-') => (true, &a[1..]),
            _ => (false, &a[..]),
        };
        let want =
            ref_digits(body).filter(|&v| v <= i64::MAX as u128).map(|v| if neg { -(v as i128) } else { v as i128 });
        match args::integer(a, "us") {
            Ok(v) => assert_eq!(Some(v as i128), want),
            Err(e) => {
                assert_err_message(&e);
                assert_eq!(want, None);
            }
        }
    }
    // RL.MULTI's tail and CL.THROTTLE's arguments.
    let numkeys = (sel as usize >> 3) % 4 + 1;
    match args::multi(&argv, numkeys) {
        Ok(m) => {
            assert_eq!(m.specs.len(), numkeys);
            assert!(m.req.cost <= MAX_COUNT);
            for s in &m.specs {
                let cap = capacity(s);
                assert!(cap >= 1 && cap <= MAX_COUNT);
            }
        }
        Err(e) => assert_err_message(&e),
    }
    match args::cl_throttle(&argv) {
        Ok((rate, q)) => {
            assert!(argv.len() == 3 || argv.len() == 4);
            assert_eq!(rate.burst as u128, ref_digits(argv[0]).unwrap() + 1);
            assert_eq!(rate.limit as u128, ref_digits(argv[1]).unwrap());
            assert_eq!(rate.period.as_i64() as u128, ref_digits(argv[2]).unwrap() * NANOS_PER_SEC as u128);
            assert!(q <= MAX_COUNT);
        }
        Err(e) => assert_err_message(&e),
    }
    // RL.RETURN's arguments: `n [AGE ms]`.
    match args::give_back(&argv) {
        Ok(g) => {
            assert!(argv.len() == 1 || argv.len() == 3, "RL.RETURN accepted {} arguments", argv.len());
            assert_eq!(Some(g.n as u128), ref_digits(argv[0]).filter(|&n| n >= 1 && n <= MAX_COUNT as u128));
            let age_ms = argv
                .get(2)
                .map(|a| ref_digits(a).filter(|&v| v <= MAX_COUNT as u128).expect("AGE accepted but not digits"));
            assert_eq!(
                g.age.map(|ns| ns.as_i64() as u128),
                age_ms.map(|ms| (ms * NANOS_PER_MILLI as u128).min(i64::MAX as u128))
            );
        }
        Err(e) => assert_err_message(&e),
    }
}

// ---------------------------------------------------------------------------------------------
// Target 2: the codec, and what the server does with decoded payloads (RL.SETSTATE).

/// Applies a payload the way RL.SETSTATE does (same validation); Err when it would be refused.
fn setstate(stored: &mut Option<State>, payload: &[u8]) -> Result<(), String> {
    let u = Update::decode(payload).map_err(|e| e.to_string())?;
    if let Update::Log(c) = &u {
        if c.units > c.win.limit {
            return Err("more units than the limit".into());
        }
    }
    if let Some(new) = u.apply(stored.as_mut()).map_err(|e| e.to_string())? {
        *stored = Some(new);
    }
    Ok(())
}

/// A state the server holds must be storable: RDB, DUMP and replicas all go through decode.
fn assert_loadable(s: &State, what: &str) {
    let enc = s.encode();
    match State::decode(&enc) {
        Ok(back) => assert_eq!(&back, s, "{what}: decode(encode(state)) differs"),
        Err(e) => panic!("{what}: a state the module holds does not decode ({e}): {s:?}"),
    }
}

/// Input: chunks, each a u16 length (LE) and that many bytes. Each chunk is decoded as a state
/// and as an update; valid encodings must be canonical; the chunks are then applied in order as
/// RL.SETSTATE payloads to one key, and whatever the key holds must stay loadable and usable.
pub fn codec_target(data: &[u8]) {
    let mut rest = data;
    let mut chunks = Vec::new();
    while rest.len() >= 2 && chunks.len() < 16 {
        let n = (u16::from_le_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 2);
        chunks.push(&rest[2..2 + n]);
        rest = &rest[2 + n..];
    }
    if chunks.is_empty() {
        chunks.push(data);
    }
    let mut key: Option<State> = None;
    for (i, c) in chunks.iter().enumerate() {
        if let Ok(s) = State::decode(c) {
            // Canonical, but for the values decoding brings into the range calls store
            // (codec.rs): those re-encode in place, same length, and load as the same state.
            let enc = s.encode();
            if enc[..] != **c {
                assert_eq!(
                    (enc.len(), &enc[..2]),
                    (c.len(), &c[..2]),
                    "State::decode accepted a non-canonical encoding"
                );
                assert_eq!(State::decode(&enc).as_ref(), Ok(&s), "a normalised state loads as another");
            }
        }
        if let Ok(u) = Update::decode(c) {
            let mut out = Vec::new();
            u.encode_into(&mut out);
            if out[..] != **c {
                assert_eq!(
                    (out.len(), &out[..2]),
                    (c.len(), &c[..2]),
                    "Update::decode accepted a non-canonical encoding"
                );
                assert_eq!(Update::decode(&out).as_ref(), Ok(&u), "a normalised update loads as another");
            }
        }
        let before = key.clone();
        if setstate(&mut key, c).is_ok() {
            let s = key.as_ref().expect("an accepted payload leaves a state");
            if skip_known() && State::decode(&s.encode()).is_err() {
                key = before; // the known log-commit bug (see algorithms_target)
                continue;
            }
            assert_loadable(s, &format!("after RL.SETSTATE #{i}"));
        }
    }
    // Every limiter, at a few instants, on whatever the key holds.
    if let Some(s) = &key {
        let mut b = Bytes(rest);
        for now in [0, 1_700_000_000 * NANOS_PER_SEC, sliding_log::MAX_TS * NANOS_PER_MICRO, b.u64() as i64 & i64::MAX]
        {
            let spec = same_params(s);
            let req = Request { cost: b.below(4), partial: b.bool() };
            check_once(&spec, Some(s), now, req);
        }
    }
}

/// The spec that matches a stored state's algorithm and parameters.
fn same_params(s: &State) -> Spec {
    match s {
        State::Gcra(g) => Spec::Gcra(g.rate),
        State::Leaky(l) => Spec::Leaky(l.0.rate),
        State::TokenBucket(t) => Spec::TokenBucket(t.rate),
        State::Sliding(x) => Spec::Sliding(x.win),
        State::Fixed(x) => Spec::Fixed(x.win),
        State::SlidingLog(x) => Spec::SlidingLog(x.win),
    }
}

/// One check with the decision invariants; returns the decision and the state after it.
fn check_once(spec: &Spec, stored: Option<&State>, now: i64, req: Request) -> (Decision, Option<State>) {
    let (d, u) = spec.check(stored, Nanos::new(now), req).expect("same algorithm");
    let cap = capacity(spec);
    let ctx = || format!("{spec:?} at {now} with {req:?} on {stored:?}: {d:?}");
    assert_eq!(d.limit, cap, "{}", ctx());
    assert!(d.remaining <= cap, "remaining above capacity: {}", ctx());
    assert!(d.allowed <= req.cost, "allowed above cost: {}", ctx());
    assert!(req.partial || d.allowed == 0 || d.allowed == req.cost, "partial grant without PARTIAL: {}", ctx());
    assert!(d.reset_after >= Nanos::ZERO, "{}", ctx());
    let limited = d.limited(&req);
    assert!(d.retry_after.is_none() || limited, "retry_after on an admitted call or a peek: {}", ctx());
    if let Some(r) = d.retry_after {
        assert!(r > Nanos::ZERO, "retry_after {r:?}: {}", ctx());
    }
    let needed = if req.partial { req.cost.min(1) } else { req.cost };
    if limited && needed <= cap {
        assert!(d.retry_after.is_some(), "limited, the request fits the capacity, but no retry_after: {}", ctx());
    }
    assert_eq!(d.delay.is_some(), matches!(spec, Spec::Leaky(_)) && d.allowed > 0, "delay: {}", ctx());
    // An update when units are granted, or when a limited call keeps new parameters (the
    // converted state, nothing consumed): asked again at once, that state answers the same.
    let params_changed = stored.is_some_and(|s| same_params(s) != *spec);
    assert!(u.is_some() == (d.allowed > 0) || (params_changed && limited), "unexpected update: {}", ctx());
    let mut after = stored.cloned();
    if let Some(u) = &u {
        if let Some(new) = u.apply(after.as_mut()).expect("apply") {
            after = Some(new);
        }
        assert_loadable(after.as_ref().unwrap(), "after an admitted check");
        if d.allowed == 0 {
            let (again, _) = spec.check(after.as_ref(), Nanos::new(now), req).expect("same algorithm");
            assert_eq!(again, d, "the converted state answers differently: {}", ctx());
        }
    }
    (d, after)
}

// ---------------------------------------------------------------------------------------------
// Target 3: the algorithms on arbitrary parameters, clocks and requests.

fn pick_count(b: &mut Bytes) -> u64 {
    match b.u8() % 6 {
        0 => 1,
        1 => MAX_COUNT,
        2 => b.below(MAX_COUNT) + 1,
        _ => b.below(20) + 1,
    }
}

fn pick_period(b: &mut Bytes) -> i64 {
    match b.u8() % 7 {
        0 => NANOS_PER_MICRO,
        1 => NANOS_PER_SEC,
        2 => MAX_PERIOD.as_i64(),
        3 => (b.below(MAX_PERIOD.as_i64() as u64 / 1000) as i64 + 1) * NANOS_PER_MICRO,
        4 => b.below(MAX_PERIOD.as_i64() as u64) as i64 + 1, // any ns: decode allows it
        _ => (b.below(10_000) as i64 + 1) * NANOS_PER_MILLI,
    }
}

fn pick_spec(b: &mut Bytes, algo: Algorithm) -> Option<Spec> {
    let limit = pick_count(b);
    let period = pick_period(b);
    Some(match algo {
        Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::Leaky => {
            let burst = if b.bool() { pick_count(b) } else { limit };
            let r = Rate::new(limit, Nanos::new(period), burst).ok()?;
            match algo {
                Algorithm::Gcra => Spec::Gcra(r),
                Algorithm::TokenBucket => Spec::TokenBucket(r),
                _ => Spec::Leaky(r),
            }
        }
        _ => {
            let w = Window::new(limit, Nanos::new(period)).ok()?;
            match algo {
                Algorithm::Sliding => Spec::Sliding(w),
                Algorithm::Fixed => Spec::Fixed(w),
                _ => Spec::SlidingLog(w),
            }
        }
    })
}

fn unit_of(spec: &Spec) -> i64 {
    match spec {
        Spec::Gcra(r) | Spec::TokenBucket(r) | Spec::Leaky(r) => (r.period.as_i64() / r.limit as i64).max(1),
        Spec::Sliding(w) | Spec::Fixed(w) | Spec::SlidingLog(w) => w.window.as_i64(),
    }
}

/// `RL_FUZZ_SKIP_KNOWN=1`: do not stop on the known, reported bugs (to fuzz past them).
fn skip_known() -> bool {
    std::env::var_os("RL_FUZZ_SKIP_KNOWN").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Latest instant the module can see (the debug clock's range, in ns).
const MAX_NOW: i64 = sliding_log::MAX_TS * NANOS_PER_MICRO;

pub fn algorithms_target(data: &[u8]) {
    let mut b = Bytes(data);
    let algo = Algorithm::ALL[(b.u8() % 6) as usize];
    let Some(mut spec) = pick_spec(&mut b, algo) else { return };
    let mut now: i64 = match b.u8() % 4 {
        0 => 1_700_000_000 * NANOS_PER_SEC,
        1 => 0,
        2 => MAX_NOW - b.below(1 << 40) as i64,
        _ => (b.below(MAX_NOW as u64 / 1000) as i64) * NANOS_PER_MICRO,
    };
    let mut state: Option<State> = None;
    let mut latest = now;
    let mut steps = 0;
    let trace = std::env::var_os("RL_FUZZ_TRACE").is_some();
    while !b.is_empty() && steps < 64 {
        steps += 1;
        let unit = unit_of(&spec);
        if trace {
            eprintln!("step {steps}: now {now} latest {latest} spec {spec:?} state {state:?}");
        }
        match b.u8() % 10 {
            // Time moves forward by a little, or by whole units.
            0 | 1 => now = now.saturating_add(b.below(1 << 20) as i64).min(MAX_NOW),
            2 => now = now.saturating_add(unit.saturating_mul(b.below(8) as i64)).min(MAX_NOW),
            // The clock steps back (what is available then never exceeds what was at `latest`).
            3 => {
                let back = match b.u8() % 3 {
                    0 => b.below(1 << 20) as i64,
                    1 => unit.saturating_mul(b.below(4) as i64 + 1),
                    _ => now,
                };
                now = (now - back).max(0);
                if let Some(s) = &state {
                    let (early, _) = check_once(&spec, Some(s), now, Request::new(0));
                    let (late, _) = check_once(&spec, Some(s), latest, Request::new(0));
                    assert!(
                        early.remaining <= late.remaining,
                        "{spec:?}: {} available at {now}, {} at the latest instant {latest}",
                        early.remaining,
                        late.remaining
                    );
                }
            }
            // New parameters (same algorithm).
            4 => {
                if let Some(s) = pick_spec(&mut b, algo) {
                    spec = s;
                }
            }
            // A sliding-log commit from outside (RL.SETSTATE), validated as the server does.
            5 if algo == Algorithm::SlidingLog => {
                let Spec::SlidingLog(win) = spec else { unreachable!() };
                let c = sliding_log::Commit {
                    win,
                    cutoff: (now / NANOS_PER_MICRO) - b.below(1 << 40) as i64,
                    ts: (b.below(sliding_log::MAX_TS as u64 + 1)) as i64,
                    units: b.below(win.limit) + 1,
                };
                let mut p = Vec::new();
                Update::Log(c).encode_into(&mut p);
                let before = state.clone();
                if setstate(&mut state, &p).is_ok() {
                    // Known bug (tests/faults.rs setstate_log_commits_keep_the_state_loadable):
                    // commits that are each valid may add up to a log the decoder refuses.
                    if skip_known() && State::decode(&state.as_ref().unwrap().encode()).is_err() {
                        state = before;
                    } else {
                        assert_loadable(state.as_ref().unwrap(), "after an RL.SETSTATE log commit");
                    }
                }
            }
            // Units given back (RL.RETURN): never a panic, never more than asked, and what the key
            // then holds stays loadable.
            5 => {
                let n = match b.u8() % 3 {
                    0 => b.below(MAX_COUNT) + 1,
                    _ => b.below(capacity(&spec)) + 1,
                };
                let age = match b.u8() % 3 {
                    0 => None,
                    1 => Some(0),
                    _ => Some(b.below(1 << 50) as i64),
                };
                if let Some(s) = &state {
                    let windowed = algo.returnable() && !algo.is_bucket();
                    match give_back(s, n, age.map(Nanos::new), Nanos::new(now)) {
                        Ok(c) => {
                            assert!(c.credited <= n && (c.credited > 0) == c.state.is_some(), "{c:?} for {n}");
                            assert!(!windowed || age.is_some());
                            if let Some(new) = c.state {
                                assert_loadable(&new, "after RL.RETURN");
                                state = Some(new);
                            }
                        }
                        Err(Refusal::AgeRequired) => assert!(windowed && age.is_none()),
                        Err(Refusal::SlidingLog) => panic!("{algo:?} refused as a sliding log"),
                        Err(Refusal::Leaky) => assert_eq!(algo, Algorithm::Leaky),
                    }
                }
            }
            // A request.
            _ => {
                let cost = match b.u8() % 5 {
                    0 => 0,
                    1 => capacity(&spec),
                    2 => capacity(&spec) + 1,
                    3 => b.below(MAX_COUNT + 1),
                    _ => b.below(4) + 1,
                };
                let req = Request { cost, partial: b.bool() };
                let dryrun = b.bool();
                let (d, after) = check_once(&spec, state.as_ref(), now, req);
                // retry_after is exact when the clock has not stepped back: admitted then, not
                // a nanosecond earlier (sliding log: a microsecond, its resolution).
                // A limited call under new parameters stores the converted state: retry_after is
                // measured against what the key holds after the call.
                let held = if d.allowed == 0 { after.as_ref() } else { state.as_ref() };
                if let (Some(r), false, true) = (d.retry_after.map(Nanos::as_i64), req.partial, now >= latest) {
                    let at = now.saturating_add(r);
                    if at <= MAX_NOW {
                        let (later, _) = check_once(&spec, held, at, req);
                        assert!(
                            later.allowed > 0,
                            "{spec:?}: told to retry after {r} ns at {now}, still limited then ({later:?})"
                        );
                        let step = if algo == Algorithm::SlidingLog { NANOS_PER_MICRO } else { 1 };
                        if r > step && !matches!(spec, Spec::Sliding(_)) {
                            let (earlier, _) = check_once(&spec, held, at - step, req);
                            assert_eq!(
                                earlier.allowed, 0,
                                "{spec:?}: retry_after {r} ns at {now} is late: admitted {step} ns earlier"
                            );
                        }
                    }
                }
                if !dryrun {
                    state = after;
                }
            }
        }
        latest = latest.max(now);
    }
}
