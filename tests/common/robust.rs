//! Helpers shared by the robustness tests (load, hostile, faults): reply validation and a driver
//! of the pure core used as the exact model of the server (the seeded PRNG is `common::Rng`).
//! Included with `#[path = "common/robust.rs"] mod robust;` next to `mod common;`.
#![allow(dead_code)]

use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::spec::{Spec, Update};
use redis_ratelimit_core::{Decision, Nanos, Rate, Request, Window, NANOS_PER_MICRO, NANOS_PER_SEC};

use crate::common::resp::Reply;
use crate::common::{CellReply, LimiterReply, LIMITER_FIELDS};

/// Seed from `RL_SEED` (decimal) or the given default; printed by the tests so a failure can
/// be replayed.
pub fn seed(default: u64) -> u64 {
    std::env::var("RL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// True when the long variants were asked for (`RL_LONG=1`, e.g. `make test-long`).
pub fn long() -> bool {
    matches!(std::env::var("RL_LONG").as_deref(), Ok(v) if !v.is_empty() && v != "0")
}

/// The six limiter commands (CL.THROTTLE is separate: other arguments and reply).
pub const LIMITERS: [&str; 6] = ["RL.GCRA", "RL.TOKENBUCKET", "RL.LEAKY", "RL.SLIDING", "RL.FIXED", "RL.SLIDINGLOG"];

/// A command of a bucket algorithm (the core's facts; CL.THROTTLE is GCRA).
pub fn is_bucket(cmd: &str) -> bool {
    cmd.eq_ignore_ascii_case("CL.THROTTLE")
        || redis_ratelimit_core::Algorithm::ALL.iter().any(|a| a.is_bucket() && a.command().eq_ignore_ascii_case(cmd))
}

/// A limiter reply (RESP2 array or RESP3 map, see `LimiterReply::from_value`), after checking
/// its shape (six fields for RL.LEAKY, five for the others) and that its fields are in range.
pub fn limiter_reply(r: &Reply, leaky: bool) -> Result<LimiterReply, String> {
    let v: Vec<i64> = match r {
        Reply::Array(Some(a)) => a.iter().map(|x| x.int()).collect::<Option<Vec<_>>>().ok_or("non-integer field")?,
        Reply::Map(m) => {
            let mut out = Vec::new();
            for (i, (k, v)) in m.iter().enumerate() {
                if k.bulk() != LIMITER_FIELDS.get(i).map(|s| s.as_bytes()) {
                    return Err(format!("map key {i} is {k:?}"));
                }
                out.push(v.int().ok_or("non-integer map value")?);
            }
            out
        }
        other => return Err(format!("not an array: {other:?}")),
    };
    let n = if leaky { 6 } else { 5 };
    if v.len() != n {
        return Err(format!("{} fields, expected {n}: {v:?}", v.len()));
    }
    let r = LimiterReply::from_ints(&v)?;
    let ok = r.allowed >= 0
        && r.allowed <= r.limit
        && r.limit >= 1
        && (0..=r.limit).contains(&r.remaining)
        && (r.retry_after_ms == -1 || r.retry_after_ms >= 1)
        && r.reset_after_ms >= 0
        && (r.allowed == 0 || r.retry_after_ms == -1);
    if !ok {
        return Err(format!("fields out of range: {r:?}"));
    }
    if let Some(delay) = r.delay_ms {
        if (r.allowed > 0 && delay < 0) || (r.allowed == 0 && delay != -1) {
            return Err(format!("delay_ms inconsistent: {r:?}"));
        }
    }
    Ok(r)
}

/// [`limiter_reply`] as its RESP2 integers.
pub fn limiter_ints(r: &Reply, leaky: bool) -> Result<Vec<i64>, String> {
    limiter_reply(r, leaky).map(|r| r.ints())
}

/// CL.THROTTLE's reply, after checking that its fields are in range.
pub fn cell_reply(r: &Reply) -> Result<CellReply, String> {
    let v = r.ints().ok_or_else(|| format!("CL.THROTTLE reply not an integer array: {r:?}"))?;
    let c = CellReply::from_ints(&v).map_err(|_| format!("CL.THROTTLE reply out of range: {v:?}"))?;
    let ok = (c.limited == 0 || c.limited == 1)
        && c.limit >= 1
        && (0..=c.limit).contains(&c.remaining)
        && c.retry_after_s >= -1
        && c.reset_after_s >= 0
        && (c.limited == 1 || c.retry_after_s == -1);
    if !ok {
        return Err(format!("CL.THROTTLE reply out of range: {v:?}"));
    }
    Ok(c)
}

/// [`cell_reply`] as its integers.
pub fn throttle_ints(r: &Reply) -> Result<Vec<i64>, String> {
    cell_reply(r).map(|c| c.ints())
}

/// Strips DUMP's trailer (2-byte RDB version + 8-byte CRC64) so payloads compare across Redis
/// versions.
pub fn dump_body(d: &[u8]) -> &[u8] {
    &d[..d.len().saturating_sub(10)]
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

// ---------------------------------------------------------------------------------------------
// The core as the server's exact model.

/// The spec a limiter command builds (period in ns).
pub fn spec_of(cmd: &str, limit: u64, period_ns: i64, burst: Option<u64>) -> Spec {
    let period = Nanos::new(period_ns);
    let rate = || Rate::new(limit, period, burst.unwrap_or(limit)).unwrap();
    let win = || Window::new(limit, period).unwrap();
    match cmd.to_ascii_uppercase().as_str() {
        "RL.GCRA" => Spec::Gcra(rate()),
        "RL.TOKENBUCKET" => Spec::TokenBucket(rate()),
        "RL.LEAKY" => Spec::Leaky(rate()),
        "RL.SLIDING" => Spec::Sliding(win()),
        "RL.FIXED" => Spec::Fixed(win()),
        "RL.SLIDINGLOG" => Spec::SlidingLog(win()),
        other => panic!("no spec for {other}"),
    }
}

/// What a spec admits at once: BURST for the buckets, the limit for the windows (the `limit`
/// field of its replies).
pub fn capacity(spec: &Spec) -> u64 {
    match spec {
        Spec::Gcra(r) | Spec::TokenBucket(r) | Spec::Leaky(r) => r.burst,
        Spec::Sliding(w) | Spec::Fixed(w) | Spec::SlidingLog(w) => w.limit,
    }
}

/// CL.THROTTLE's model: GCRA at `count` per `secs` with a burst of max_burst + 1.
pub fn throttle_spec(max_burst: u64, count: u64, secs: i64) -> Spec {
    Spec::Gcra(Rate::new(count, Nanos::new(secs * NANOS_PER_SEC), max_burst + 1).unwrap())
}

/// One key's model state.
#[derive(Clone, Debug, Default)]
pub struct Model {
    pub state: Option<State>,
}

impl Model {
    /// Runs one check at `now_us` and stores the update unless `dryrun`.
    pub fn check(&mut self, spec: &Spec, now_us: i64, req: Request, dryrun: bool) -> Decision {
        let now = Nanos::new(now_us * NANOS_PER_MICRO);
        let (d, u) = spec.check(self.state.as_ref(), now, req).expect("model: algorithm mismatch");
        if let (Some(u), false) = (u, dryrun) {
            self.apply(&u);
        }
        d
    }

    pub fn apply(&mut self, u: &Update) {
        if let Some(new) = u.apply(self.state.as_mut()).expect("model: apply") {
            self.state = Some(new);
        }
    }

    pub fn encoded(&self) -> Option<Vec<u8>> {
        self.state.as_ref().map(|s| s.encode())
    }
}

/// The RESP2 integers the module replies for a decision.
pub fn decision_ints(d: &Decision, leaky: bool) -> Vec<i64> {
    let ceil_ms = |x: Nanos| x.as_millis_ceil() as i64;
    let ms = |x: Option<Nanos>| x.map_or(-1, ceil_ms);
    let mut v = vec![d.allowed as i64, d.limit as i64, d.remaining as i64, ms(d.retry_after), ceil_ms(d.reset_after)];
    if leaky {
        v.push(ms(d.delay));
    }
    v
}

/// redis-cell's whole seconds (as the module computes them for CL.THROTTLE).
pub fn cell_seconds(ns: Option<Nanos>) -> i64 {
    match ns {
        None => -1,
        Some(ns) => {
            let ns = ns.as_i64();
            ns / NANOS_PER_SEC + ((ns % NANOS_PER_SEC) / 1_000_000 >= 1) as i64
        }
    }
}

/// The CL.THROTTLE reply for a decision of a quantity-`q` request.
pub fn throttle_ints_of(d: &Decision, q: u64) -> Vec<i64> {
    let limited = q > 0 && d.allowed == 0;
    vec![
        limited as i64,
        d.limit as i64,
        d.remaining as i64,
        cell_seconds(d.retry_after),
        cell_seconds(Some(d.reset_after)),
    ]
}
