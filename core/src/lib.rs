//! The pure core: every algorithm is a function of (stored state, parameters, now, request).
//! No Redis types, no clock reads, no floating point, no IO. Time is [`Nanos`], integer
//! nanoseconds (the module's instants count from the Unix epoch); rates are kept exact by
//! scaling time by the limit where a division would otherwise round (see `gcra`).
//!
//! Used by every crate of the workspace (the module, the client, the service, the simulator),
//! so that each fact they share is written once here.

pub mod algorithm;
pub mod codec;
pub mod fixed;
pub mod gcra;
pub mod give_back;
pub mod info;
pub mod leaky;
pub mod limit;
pub mod multi;
pub mod sliding;
pub mod sliding_log;
pub mod spec;
pub mod time;
pub mod token_bucket;

pub use algorithm::{Algorithm, PolicyWindow, Refill};
pub use limit::{Limit, LimitError};
pub use time::{AtomicNanos, Nanos, NANOS_PER_MICRO, NANOS_PER_MILLI, NANOS_PER_SEC};

/// Largest limit, burst or cost accepted: large enough for any real quota, small enough that
/// every scaled product (now × limit, burst × period) fits an i128 with room to spare.
pub const MAX_COUNT: u64 = 1_000_000_000_000_000;
/// Largest count a window limiter stores (and the decoder accepts): a count above the limit is
/// reachable (a lowered limit, or a window change carrying the estimate of an earlier one), and a
/// window change saturates the carried estimate here, so no call can store more.
pub const MAX_STORED_COUNT: u64 = 2 * MAX_COUNT;
/// Longest period or window: 100 Julian years.
pub const MAX_PERIOD: Nanos = Nanos::from_secs(36_525 * 86_400);
/// Longest time a bucket may take to refill from empty (burst × period / limit): 200 years.
/// Keeps every TTL and retry time a sane i64 of milliseconds.
pub const MAX_HORIZON: Nanos = Nanos::from_secs(2 * 36_525 * 86_400);

/// One check: how many units the caller asks for, and whether a partial grant is acceptable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Units asked for; 0 peeks.
    pub cost: u64,
    /// Grant as many units as are available now, up to `cost`.
    pub partial: bool,
}

impl Request {
    #[inline]
    pub const fn new(cost: u64) -> Self {
        Request { cost, partial: false }
    }

    /// How many units are granted when `available` are free now.
    pub(crate) fn grant(&self, available: u64) -> u64 {
        if self.partial {
            self.cost.min(available)
        } else if self.cost <= available {
            self.cost
        } else {
            0
        }
    }

    /// The units a limited request waits for: all of them, or one when partial grants are fine.
    pub(crate) fn needed(&self) -> u64 {
        if self.partial {
            1.min(self.cost)
        } else {
            self.cost
        }
    }
}

/// The answer to one check, in nanoseconds; the module converts to milliseconds, rounding up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Units admitted (0 when limited or peeking).
    pub allowed: u64,
    /// The capacity: BURST for buckets, the limit for windows.
    pub limit: u64,
    /// Units that would still be admitted right after this call.
    pub remaining: u64,
    /// When limited: time until the same request would be admitted; `None` when admitted
    /// or when it never can be (its cost exceeds the capacity).
    pub retry_after: Option<Nanos>,
    /// Time until the limiter is back to the state of a missing key.
    pub reset_after: Nanos,
    /// RL.LEAKY only: how long an admitted request waits before it leaves the queue.
    pub delay: Option<Nanos>,
}

impl Decision {
    /// True when the request asked for units and got none.
    #[inline]
    pub fn limited(&self, req: &Request) -> bool {
        req.cost > 0 && self.allowed == 0
    }

    /// The integers of a limiter command's reply, named by [`DECISION_FIELDS`]: the first five,
    /// or all six with `delay_ms` (RL.LEAKY). Durations in milliseconds rounded up (never early),
    /// -1 for none.
    #[inline]
    pub fn reply_values(&self, with_delay: bool) -> ([i64; 6], usize) {
        let values = [
            self.allowed as i64,
            self.limit as i64,
            self.remaining as i64,
            ms_or_minus_one(self.retry_after),
            self.reset_after.as_millis_ceil() as i64,
            ms_or_minus_one(self.delay),
        ];
        (values, if with_delay { 6 } else { 5 })
    }
}

/// Field names of a limiter command's reply, in order ([`Decision::reply_values`]).
pub const DECISION_FIELDS: [&str; 6] =
    ["allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "delay_ms"];

/// Milliseconds rounded up, or -1 for "none" (a reply's optional durations).
#[inline]
pub fn ms_or_minus_one(ns: Option<Nanos>) -> i64 {
    ns.map_or(-1, |ns| ns.as_millis_ceil() as i64)
}

/// Sustained rate `limit` per `period` with a capacity of `burst` units (GCRA, token bucket,
/// leaky bucket).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    pub limit: u64,
    pub period: Nanos,
    pub burst: u64,
}

impl Rate {
    /// Validates a rate; the error names the setting at fault.
    #[inline]
    pub fn new(limit: u64, period: Nanos, burst: u64) -> Result<Rate, LimitError> {
        check_count(limit).map_err(LimitError::Limit)?;
        check_count(burst).map_err(LimitError::Burst)?;
        check_period(period)?;
        let r = Rate { limit, period, burst };
        if div_trunc_i128(r.capacity_scaled(), limit as i128) > MAX_HORIZON.as_i128() {
            return Err(LimitError::Refill);
        }
        Ok(r)
    }

    /// Capacity in scaled time units (ns × limit): burst × period.
    #[inline]
    pub fn capacity_scaled(&self) -> i128 {
        self.burst as i128 * self.period.as_i128()
    }
}

/// `limit` units per `window` (sliding counter, fixed window, sliding log).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    pub limit: u64,
    pub window: Nanos,
}

impl Window {
    /// Validates a window; the error names the setting at fault.
    #[inline]
    pub fn new(limit: u64, window: Nanos) -> Result<Window, LimitError> {
        check_count(limit).map_err(LimitError::Limit)?;
        check_period(window)?;
        Ok(Window { limit, window })
    }
}

/// A limit or BURST from 1 to MAX_COUNT (the value back as the error).
#[inline]
fn check_count(n: u64) -> Result<(), u64> {
    if n == 0 || n > MAX_COUNT {
        return Err(n);
    }
    Ok(())
}

/// A period or window from 1 ns to MAX_PERIOD (a `Limit` also asks for whole microseconds).
#[inline]
pub(crate) fn check_period(p: Nanos) -> Result<(), LimitError> {
    if p <= Nanos::ZERO || p > MAX_PERIOD {
        return Err(LimitError::Period(p));
    }
    Ok(())
}

// Divisions. Scaled instants need 128 bits, but the values divided on the hot path (balances,
// debts, durations, window weights) nearly always fit 64, where a division is one instruction
// instead of a call to the 128-bit routine (~60 instructions). Each helper takes the 64-bit path
// only when both operands fit, where it computes the same quotient; `exact` holds the 128-bit
// definitions, the fallback, which tests/core_props.rs compares them against.

/// The 128-bit definitions of the division helpers.
pub mod exact {
    /// Ceiling division for positive divisors.
    pub fn div_ceil(n: i128, d: i128) -> i128 {
        debug_assert!(d > 0);
        if n <= 0 {
            -((-n) / d)
        } else {
            (n + d - 1) / d
        }
    }

    /// Floor division (towards −∞).
    pub fn div_floor(n: i128, d: i128) -> i128 {
        n.div_euclid(d)
    }

    /// Truncating division (towards 0).
    pub fn div_trunc(n: i128, d: i128) -> i128 {
        n / d
    }
}

/// Both operands as i64 when they fit and the divisor is positive (so no quotient overflows).
#[inline(always)]
fn narrow(n: i128, d: i128) -> Option<(i64, i64)> {
    match (i64::try_from(n), i64::try_from(d)) {
        (Ok(n), Ok(d)) if d > 0 => Some((n, d)),
        _ => None,
    }
}

/// Ceiling division for positive divisors.
#[inline]
pub fn div_ceil_i128(n: i128, d: i128) -> i128 {
    match narrow(n, d) {
        // Truncation rounds up for n ≤ 0; one more for a positive remainder.
        Some((n, d)) => (n / d + (n % d > 0) as i64) as i128,
        None => exact::div_ceil(n, d),
    }
}

/// Floor division (towards −∞) for positive divisors.
#[inline]
pub fn div_floor_i128(n: i128, d: i128) -> i128 {
    match narrow(n, d) {
        Some((n, d)) => n.div_euclid(d) as i128,
        None => exact::div_floor(n, d),
    }
}

/// Truncating division (towards 0) for positive divisors.
#[inline]
pub fn div_trunc_i128(n: i128, d: i128) -> i128 {
    match narrow(n, d) {
        Some((n, d)) => (n / d) as i128,
        None => exact::div_trunc(n, d),
    }
}

/// The index of the window of `window` that holds `now`: `now ÷ window`, rounded down.
#[inline]
pub fn window_index(now: Nanos, window: Nanos) -> i64 {
    now.as_i64().div_euclid(window.as_i64())
}

/// A window index as calls store it: that of some i64 instant ([`window_index`]).
pub(crate) fn clamp_index(index: i64, window: Nanos) -> i64 {
    index.clamp(window_index(Nanos::MIN, window), window_index(Nanos::MAX, window))
}

/// Narrows a non-negative i128 duration to Nanos, saturating (validated parameters keep every
/// real value far below the bound).
#[inline]
pub(crate) fn to_nanos(x: i128) -> Nanos {
    Nanos::new(x.clamp(0, i64::MAX as i128) as i64)
}

/// Narrows an i128 count to u64, clamped to [0, max].
#[inline]
pub(crate) fn clamp_units(x: i128, max: u64) -> u64 {
    x.clamp(0, max as i128) as u64
}

/// The lowest rescaled balance kept: −2^120 scaled units is a wait of at least
/// 2^120 / MAX_COUNT > 2^70 ns, beyond any Nanos; far from i128 overflow when added to an
/// instant × limit (< 2^114).
const DEEPEST_DEBT: i128 = -(1 << 120);

/// Converts a token balance kept in units of 1/period (scaled time) from one rate to another,
/// rounding down so a change of parameters never hands out a fraction of a token, and capping
/// at the new capacity.
pub(crate) fn rescale_tokens(tokens: i128, from: &Rate, to: &Rate) -> i128 {
    let (pf, pt) = (from.period.as_i128(), to.period.as_i128());
    let rescaled = if pf == pt {
        tokens
    } else {
        // Whole tokens and the fraction separately, so nothing overflows. A debt so deep that
        // `whole × pt` leaves i128 (a clock stepped back far with a large limit, or a forged
        // state) is clamped at DEEPEST_DEBT: every wait it implies already exceeds i64 ns, so
        // the answers are unchanged.
        let whole = div_floor_i128(tokens, pf);
        let frac = tokens - whole * pf;
        match whole.checked_mul(pt) {
            Some(w) => (w + div_floor_i128(frac * pt, pf)).max(DEEPEST_DEBT),
            None => DEEPEST_DEBT,
        }
    };
    rescaled.min(to.capacity_scaled())
}

/// The bucket model's answer (GCRA, token bucket, leaky bucket) given the balance found on
/// arrival, `tokens` in units of 1/period (at most the capacity). Shared, so the algorithms
/// that keep this balance in different forms answer identically. Returns the decision and the
/// balance left after it.
pub(crate) fn bucket_decision(rate: &Rate, tokens: i128, req: Request) -> (Decision, i128) {
    let l = rate.limit as i128;
    let p = rate.period.as_i128();
    let cap = rate.capacity_scaled();
    let available = clamp_units(div_floor_i128(tokens, p), rate.burst);
    let granted = req.grant(available);
    let left = tokens - granted as i128 * p;
    let need = req.needed() as i128 * p;
    let retry_after =
        if granted > 0 || req.cost == 0 || need > cap { None } else { Some(to_nanos(div_ceil_i128(need - tokens, l))) };
    let decision = Decision {
        allowed: granted,
        limit: rate.burst,
        remaining: clamp_units(div_floor_i128(left, p), rate.burst),
        retry_after,
        reset_after: bucket_reset_after(rate, left),
        delay: None,
    };
    (decision, left)
}

/// How long a bucket holding `tokens` (scaled) takes to be full again: a decision's
/// `reset_after`.
#[inline]
pub(crate) fn bucket_reset_after(rate: &Rate, tokens: i128) -> Nanos {
    to_nanos(div_ceil_i128(rate.capacity_scaled() - tokens, rate.limit as i128))
}
