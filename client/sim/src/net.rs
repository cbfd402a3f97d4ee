//! The network between an instance and Redis: a round-trip time model with a heavy tail, and
//! the server's availability over time.
//!
//! Round trip (documented in docs/local-reservations.md): with probability 0.98 a lognormal
//! with median 200 µs and σ = 0.3 (p99 of that part ≈ 400 µs); with probability 0.02 a Pareto
//! tail with scale 400 µs and shape 1.2 (a GC pause, a busy server, a retransmit), capped at
//! 200 ms. Overall median ≈ 0.2 ms, p99 ≈ 0.9 ms, p99.99 ≈ 40 ms; about 1 call in 15,000
//! exceeds a 50 ms timeout. The command reaches the server after half the round trip.

use crate::rng::Rng;

pub const RTT_MEDIAN: i64 = 200_000;
const RTT_SIGMA: f64 = 0.3;
const TAIL_PROBABILITY: f64 = 0.02;
const TAIL_SCALE: i64 = 400_000;
const TAIL_SHAPE: f64 = 1.2;
const RTT_CAP: i64 = 200_000_000;

pub fn sample_rtt(rng: &mut Rng) -> i64 {
    let x = if rng.unit() < TAIL_PROBABILITY {
        TAIL_SCALE as f64 / rng.unit().powf(1.0 / TAIL_SHAPE)
    } else {
        RTT_MEDIAN as f64 * (RTT_SIGMA * rng.normal()).exp()
    };
    (x as i64).clamp(10_000, RTT_CAP)
}

/// What the server does with a command at a given instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Availability {
    Up,
    /// Connections are refused: the caller gets an error after half a round trip.
    Refusing,
    /// The server accepts and never answers: the caller waits for its timeout.
    Hanging,
}

/// The server's availability as a list of (from, state), sorted by time; Up before the first.
#[derive(Clone, Debug, Default)]
pub struct Outages(pub Vec<(i64, Availability)>);

impl Outages {
    pub fn at(&self, t: i64) -> Availability {
        self.0.iter().rev().find(|(from, _)| *from <= t).map_or(Availability::Up, |(_, a)| *a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtt_median_and_tail() {
        let mut rng = Rng::new(42);
        let mut v: Vec<i64> = (0..200_000).map(|_| sample_rtt(&mut rng)).collect();
        v.sort_unstable();
        let median = v[v.len() / 2];
        assert!((180_000..220_000).contains(&median), "median {median}");
        let p99 = v[v.len() * 99 / 100];
        assert!(p99 > 600_000 && p99 < 2_000_000, "p99 {p99}");
    }
}
