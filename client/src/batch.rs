//! Adaptive batch size, sans IO: how many units a claim asks for, from the local demand rate
//! and the `remaining` the server last reported.
//!
//! * Demand: an exponentially decayed count of the units requested, `rate(t) = Σ units ·
//!   e^{−(t−tᵢ)/τ} / τ` (units per ns), which tends to the arrival rate for steady traffic and
//!   decays to 0 on an idle key.
//! * Batch: the units the demand will need until the next claim, `ceil(rate × span)` (span: the
//!   refill horizon, or the pacing interval of a key that ran dry), capped by `max_batch`, the
//!   capacity, and what the server can grant over that span (its last `remaining` plus its
//!   refill). Asks proportional to each instance's own demand keep the grants fair across
//!   instances with uneven traffic.
//! * Exact mode: when that is no more than the request needs (a cold key, or a slow key with
//!   little left), the claim is exactly the request (`COST need`, no `PARTIAL`): one call per
//!   request, the same call a per-request check makes. A first request on a cold key is always
//!   exact.

use redis_ratelimit_core::Nanos;

/// A span as a float of nanoseconds, for the demand estimate (the core has no floats).
pub(crate) trait ToF64 {
    fn to_f64(self) -> f64;
}

impl ToF64 for Nanos {
    #[inline]
    fn to_f64(self) -> f64 {
        self.as_i64() as f64
    }
}

/// `e^{−dt/τ}`: the weight of an observation `dt` old. A hot key sees `dt ≪ τ` between its
/// checks: there the Taylor polynomial to x⁴ stands in for `exp` (relative error below
/// x⁵/120 < 1e-11 for x < 1/64, so `expected`'s ceiling changes only for a product within
/// 1e-11 of an integer), and the other calls of the same check see `dt = 0`. Slower keys (fewer
/// than 64 checks per τ) pay one `exp` per check.
#[inline]
pub(crate) fn decay(dt: Nanos, tau: Nanos) -> f64 {
    if dt.is_zero() {
        // The other calls of the same check (the polynomial's value too, exactly).
        return 1.0;
    }
    let x = dt.to_f64() / tau.to_f64().max(1.0);
    if x < 1.0 / 64.0 {
        1.0 - x * (1.0 - x * (0.5 - x * (1.0 / 6.0 - x / 24.0)))
    } else {
        (-x).exp()
    }
}

/// Decayed demand of one key. The newest observation's units (`last`) are kept by the owner
/// (a key's state packs them with its other small fields): the rate with it is
/// `before + last/τ`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Demand {
    /// Units per ns, as of `at`, without the newest observation: what the traffic said before
    /// the request being decided (a sparse key's single arrival must not look like a rate of
    /// 1/τ).
    before: f64,
    at: Nanos,
}

impl Demand {
    /// Records `units` requested at `now` (time constant `tau`); `last` is the previous
    /// observation's units, and becomes this one's.
    #[inline]
    pub fn observe(&mut self, now: Nanos, units: u64, tau: Nanos, last: &mut u32) {
        self.before = self.rate_at(now, tau, *last);
        *last = units.min(u32::MAX as u64) as u32;
        self.at = self.at.max(now);
    }

    /// The decayed rate at `now`, in units per ns (`last`: the newest observation's units).
    #[inline]
    pub fn rate_at(&self, now: Nanos, tau: Nanos, last: u32) -> f64 {
        (self.before + last as f64 / tau.to_f64().max(1.0)) * decay(now - self.at, tau)
    }

    /// The decayed rate at `now` without the newest observation.
    #[inline]
    pub fn rate_before(&self, now: Nanos, tau: Nanos) -> f64 {
        self.before * decay(now - self.at, tau)
    }

    /// Whether [`Demand::expected`] over `span` is above `held`, without rounding it up:
    /// `held < ⌈e⌉` ⟺ `held < e` for a whole `held` (exact below 2^53 units).
    #[inline]
    pub fn exceeds(&self, held: u64, now: Nanos, tau: Nanos, span: Nanos) -> bool {
        let e = self.rate_before(now, tau) * span.to_f64();
        e.is_finite() && (held as f64) < e
    }

    /// Expected units over the next `span`, rounded up, from the traffic before the newest
    /// request.
    pub fn expected(&self, now: Nanos, tau: Nanos, span: Nanos) -> u64 {
        let e = self.rate_before(now, tau) * span.to_f64();
        if e.is_finite() && e > 0.0 {
            e.ceil().min(u64::MAX as f64 / 2.0) as u64
        } else {
            0
        }
    }
}

/// The size of one claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimSize {
    /// Units to ask for (`COST units`).
    pub units: u64,
    /// `PARTIAL`: accept fewer. False for an exact claim (all or nothing, as a per-request check).
    pub partial: bool,
}

/// Inputs of the batch size.
#[derive(Clone, Copy, Debug)]
pub struct BatchInput {
    /// Units the demand is expected to need before the next claim ([`Demand::expected`]).
    pub expected: u64,
    /// Units the caller needs now beyond what is held (0 for a background refill).
    pub need: u64,
    /// Largest claim allowed (the configured maximum, and never above the capacity).
    pub max_batch: u64,
    /// The most the server can grant over that time, as far as known (its last `remaining`
    /// plus its refill meanwhile); `None` before the first reply.
    pub available: Option<u64>,
}

/// How many units to claim: `need` is always covered; above it, the expected demand, capped by
/// `max_batch` and by what the server can grant. Exact (no PARTIAL) when nothing is left above
/// `need`: a cold key, or a slow key with little left.
pub fn claim_size(i: BatchInput) -> ClaimSize {
    let mut b = i.expected.min(i.max_batch.max(1));
    if let Some(avail) = i.available {
        b = b.min(avail);
    }
    if b <= i.need {
        ClaimSize { units: i.need, partial: false }
    } else {
        ClaimSize { units: b, partial: true }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = Nanos::from_secs(1);
    const MS: Nanos = Nanos::from_millis(1);

    #[test]
    fn demand_tracks_a_steady_rate_and_decays() {
        let (mut d, mut last) = (Demand::default(), 0);
        for i in 0..10_000u64 {
            d.observe(MS * i, 1, S, &mut last); // 1000 per second for 10 s
        }
        let per_s = d.rate_at(S * 10, S, last) * S.to_f64();
        assert!((900.0..1100.0).contains(&per_s), "{per_s}");
        assert!(d.rate_at(S * 30, S, last) * S.to_f64() < 1.0);
        assert_eq!(d.expected(S * 10, S, S / 10), 100);
        // A single arrival says nothing about the rate.
        let (mut cold, mut last) = (Demand::default(), 0);
        cold.observe(S * 5, 1, S, &mut last);
        assert_eq!(cold.expected(S * 5, S, S * 10), 0);
    }

    #[test]
    fn decay_polynomial_agrees_with_exp() {
        let tau = S;
        for i in 0..2000u64 {
            let dt = Nanos::new(i as i64 * 10_000); // up to 20 ms = τ/50
            let exact = (-dt.to_f64() / tau.to_f64()).exp();
            assert!((decay(dt, tau) - exact).abs() <= exact * 1e-11, "{dt:?}");
        }
        assert_eq!(decay(Nanos::ZERO, tau), 1.0);
    }

    #[test]
    fn exceeds_is_below_expected() {
        let (mut d, mut last) = (Demand::default(), 0);
        for i in 0..3_000u64 {
            d.observe(Nanos::new(i as i64 * 337_123), 1 + i % 3, S, &mut last);
            let now = Nanos::new((i * 337_123 + i % 7 * 1_000_000) as i64);
            for span in [Nanos::ZERO, MS, MS * 25, S / 10, S * 3] {
                let e = d.expected(now, S, span);
                for held in [0, 1, e.saturating_sub(1), e, e + 1, 1 << 40] {
                    assert_eq!(d.exceeds(held, now, S, span), held < e, "{i} {span:?} {held} {e}");
                }
            }
        }
    }

    #[test]
    fn cold_and_near_limit_are_exact() {
        let base = BatchInput { expected: 0, need: 1, max_batch: 100, available: None };
        assert_eq!(claim_size(base), ClaimSize { units: 1, partial: false });
        let hot = BatchInput { expected: 50, available: Some(10_000), ..base };
        assert_eq!(claim_size(hot), ClaimSize { units: 50, partial: true });
        let near = BatchInput { expected: 50, available: Some(1), ..base };
        assert_eq!(claim_size(near), ClaimSize { units: 1, partial: false });
        let big = BatchInput { expected: 5000, available: Some(1_000_000), ..base };
        assert_eq!(claim_size(big).units, 100);
        let refill = BatchInput { expected: 1, need: 0, ..base };
        assert_eq!(claim_size(refill), ClaimSize { units: 1, partial: true });
    }
}
