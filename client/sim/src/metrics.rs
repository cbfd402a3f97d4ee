//! Metrics of a run (calls per admitted unit, most admitted in any window against the bound,
//! utilisation, fairness, added latency, expiry) and the bounds themselves.

use crate::engine::Record;
use redis_ratelimit_core::spec::Spec;

/// Most instants of `ts` (sorted) inside any closed interval of length `w`: an exact sliding
/// two-pointer sweep.
pub fn max_in_window(ts: &[i64], w: i64) -> u64 {
    let (mut best, mut lo) = (0, 0);
    for hi in 0..ts.len() {
        while ts[hi] - ts[lo] > w {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best as u64
}

/// Jain's fairness index of `xs`: (Σx)² / (n·Σx²); 1 when all equal.
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sq == 0.0 {
        return 1.0;
    }
    sum * sum / (xs.len() as f64 * sq)
}

/// The p-th percentile (0..=100) of `v`, nearest rank; sorts `v`.
pub fn percentile(v: &mut [u32], p: f64) -> u32 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// How late an admission can come after its units were counted by the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lag {
    /// Reserve first with expiry: a unit is served at most `L` after its claim was sent (for a
    /// window limiter never past the end of the window it was counted in).
    Lease(i64),
    /// Per-request checking: the caller is let through when the answer arrives, at most the
    /// call timeout after the server counted it.
    Answer(i64),
}

/// The most units that can be admitted in any closed interval of length `w` (see
/// docs/local-reservations.md for the proofs).
pub fn bound(spec: &Spec, w: i64, lag: Lag) -> u64 {
    match spec {
        Spec::Gcra(r) | Spec::TokenBucket(r) | Spec::Leaky(r) => {
            let l = match lag {
                Lag::Lease(l) | Lag::Answer(l) => l,
            };
            // c + r·(W + L), floored: whole units.
            r.burst + (r.limit as i128 * (w as i128 + l as i128) / r.period.as_i128()) as u64
        }
        Spec::Fixed(win) => {
            // Units are counted in one window and served in it (a lease never outlives its
            // window); answers can arrive up to the timeout later.
            let lag = match lag {
                Lag::Lease(_) => 0,
                Lag::Answer(t) => t,
            };
            let touched = (w as i128 + lag as i128 + win.window.as_i128() - 1) / win.window.as_i128() + 1;
            win.limit * touched as u64
        }
        Spec::Sliding(win) | Spec::SlidingLog(win) => {
            // Not used by the scenarios: the weaker window bound, 2·limit per window touched.
            let touched = (w as i128 + win.window.as_i128() - 1) / win.window.as_i128() + 1;
            win.limit * touched as u64
        }
    }
}

/// The period of a spec (W = period and W = period ÷ 10 are reported).
pub fn period(spec: &Spec) -> i64 {
    match spec {
        Spec::Gcra(r) | Spec::TokenBucket(r) | Spec::Leaky(r) => r.period.as_i64(),
        Spec::Fixed(w) | Spec::Sliding(w) | Spec::SlidingLog(w) => w.window.as_i64(),
    }
}

/// The summary of one run.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub scenario: String,
    pub mode: String,
    pub algorithm: String,
    pub requests: u64,
    pub admitted: u64,
    pub redis_calls: u64,
    pub redis_calls_per_admitted: f64,
    /// Calls per request in the phase named "limited", when there is one.
    pub calls_per_request_limited: Option<f64>,
    pub max_in_window: u64,
    pub bound: u64,
    pub max_in_window_tenth: u64,
    pub bound_tenth: u64,
    pub utilisation: f64,
    pub jain: f64,
    pub p50_added_us: f64,
    pub p99_added_us: f64,
    pub p999_added_us: f64,
    pub max_added_us: f64,
    pub expired_units: u64,
    pub returned_units: u64,
    pub credited_units: u64,
    pub timeouts: u64,
    pub refused: u64,
    pub phases: Vec<(String, crate::engine::PhaseCounters)>,
    pub violations: Vec<String>,
}

pub fn summarize(scenario: &str, mode: &str, specs: &[Spec], lag: Lag, rec: &mut Record) -> Summary {
    let mut s = Summary { scenario: scenario.into(), mode: mode.into(), ..Default::default() };
    s.algorithm = match specs[0] {
        Spec::Gcra(r) => format!("GCRA {}/{}s burst {}", r.limit, r.period.as_i64() / 1_000_000_000, r.burst),
        Spec::TokenBucket(r) => {
            format!("token bucket {}/{}s burst {}", r.limit, r.period.as_i64() / 1_000_000_000, r.burst)
        }
        Spec::Fixed(w) => format!("fixed window {}/{}s", w.limit, w.window.as_i64() / 1_000_000_000),
        other => format!("{:?}", other.algorithm()),
    };
    s.requests = rec.demand.iter().sum();
    s.admitted = rec.instances.iter().map(|i| i.admitted).sum();
    s.redis_calls = rec.checks_sent + rec.returns_sent;
    s.redis_calls_per_admitted = ratio(s.redis_calls, s.admitted);
    s.calls_per_request_limited =
        rec.phases.iter().find(|(n, _, _)| *n == "limited").map(|(_, _, c)| ratio(c.calls, c.requests));
    for (key, ts) in rec.enforced_at.iter().enumerate() {
        let p = period(&specs[key]);
        for (w, got, b) in
            [(p, &mut s.max_in_window, &mut s.bound), (p / 10, &mut s.max_in_window_tenth, &mut s.bound_tenth)]
        {
            let m = max_in_window(ts, w);
            let bd = bound(&specs[key], w, lag);
            // The key closest to (or furthest over) its bound is the one reported.
            if m as i128 - bd as i128 > *got as i128 - *b as i128 || (*got == 0 && *b == 0) {
                *got = m;
                *b = bd;
            }
        }
    }
    let ideal: u64 = rec.ideal_admitted.iter().sum();
    s.utilisation = ratio(s.admitted, ideal);
    let xs: Vec<f64> =
        rec.instances.iter().filter(|i| i.demand > 0).map(|i| i.admitted as f64 / i.demand as f64).collect();
    s.jain = jain(&xs);
    let lat = &mut rec.latency;
    s.p50_added_us = percentile(lat, 50.0) as f64 / 1e3;
    s.p99_added_us = percentile(lat, 99.0) as f64 / 1e3;
    s.p999_added_us = percentile(lat, 99.9) as f64 / 1e3;
    s.max_added_us = lat.last().copied().unwrap_or(0) as f64 / 1e3;
    s.expired_units = rec.instances.iter().map(|i| i.counters.units_expired).sum();
    s.returned_units = rec.instances.iter().map(|i| i.units_sent_back).sum();
    s.credited_units = rec.credited.iter().sum();
    s.timeouts = rec.timeouts;
    s.refused = rec.refused;
    s.phases = rec.phases.iter().map(|(n, _, c)| (n.to_string(), *c)).collect();
    s
}

pub fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis_ratelimit_core::{Nanos, Rate, Window};

    #[test]
    fn window_sweep() {
        assert_eq!(max_in_window(&[], 10), 0);
        assert_eq!(max_in_window(&[0, 5, 10, 11, 30], 10), 3);
        assert_eq!(max_in_window(&[0, 5, 10, 11, 30], 100), 5);
        assert_eq!(max_in_window(&[7, 7, 7], 0), 3);
    }

    #[test]
    fn jain_extremes() {
        assert!((jain(&[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn bounds() {
        let g = Spec::Gcra(Rate::new(10_000, Nanos::from_secs(1), 1_000).unwrap());
        assert_eq!(bound(&g, 1_000_000_000, Lag::Lease(100_000_000)), 1_000 + 11_000);
        let f = Spec::Fixed(Window::new(100, Nanos::from_secs(60)).unwrap());
        assert_eq!(bound(&f, 60_000_000_000, Lag::Lease(1)), 200);
        assert_eq!(bound(&f, 6_000_000_000, Lag::Lease(1)), 200);
        assert_eq!(bound(&f, 60_000_000_000, Lag::Answer(50_000_000)), 300);
    }
}
