//! Statistics over a benchmark's samples. On a noisy machine a row's samples are summarised by
//! their median (with the least and the most, and the spread), and rows are compared by ratios
//! of medians; latencies by percentiles.

use std::fmt;

/// The median, least and most of a set of samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// None for no samples.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        let sorted = sorted(samples);
        Some(Summary { median: median_of_sorted(&sorted)?, min: *sorted.first()?, max: *sorted.last()? })
    }

    /// ± half the range relative to the median (0.23 for ±23%); None for a zero median.
    pub fn spread(&self) -> Option<f64> {
        ratio(0.5 * (self.max - self.min), self.median)
    }

    /// The summary of the values rounded to `decimals`, as a report shows them (ratios taken
    /// between shown values then agree with the table).
    pub fn rounded(&self, decimals: usize) -> Summary {
        Summary {
            median: round_to(self.median, decimals),
            min: round_to(self.min, decimals),
            max: round_to(self.max, decimals),
        }
    }
}

fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

fn median_of_sorted(v: &[f64]) -> Option<f64> {
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The middle sample, or the mean of the two middle ones; None for no samples.
pub fn median(samples: &[f64]) -> Option<f64> {
    median_of_sorted(&sorted(samples))
}

/// The `p`-th percentile (0 < p ≤ 100) by nearest rank: the least sample that at least p% of
/// the samples do not exceed (p50 of 1..=10 is 5, p99 is 10). None for no samples or p out of
/// range.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if !(p > 0.0 && p <= 100.0) || samples.is_empty() {
        return None;
    }
    let v = sorted(samples);
    let rank = (p / 100.0 * v.len() as f64).ceil() as usize;
    v.get(rank.clamp(1, v.len()) - 1).copied()
}

/// a ÷ b; None when b is zero (or not finite).
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    let r = a / b;
    (b != 0.0 && r.is_finite()).then_some(r)
}

/// `x` rounded to `decimals` places exactly as `format!("{x:.decimals$}")` (and printf) shows it.
pub fn round_to(x: f64, decimals: usize) -> f64 {
    format!("{x:.decimals$}").parse().unwrap_or(x)
}

/// a\[i\] ÷ b\[i\] for every i (samples taken in the same round), rounded to 4 places; None when
/// the lengths differ or any b\[i\] is zero.
pub fn ratios_within(a: &[f64], b: &[f64]) -> Option<Vec<f64>> {
    if a.len() != b.len() {
        return None;
    }
    a.iter().zip(b).map(|(x, y)| ratio(*x, *y).map(|r| round_to(r, 4))).collect()
}

/// (a\[i\] ÷ b\[i\]) ÷ (c\[i\] ÷ d\[i\]) for every i, rounded to 4 places: one row's ratio to its
/// baseline against another's to its own; None when any divisor is zero.
pub fn ratios_of_ratios_within(a: &[f64], b: &[f64], c: &[f64], d: &[f64]) -> Option<Vec<f64>> {
    if [b.len(), c.len(), d.len()].iter().any(|&n| n != a.len()) {
        return None;
    }
    (0..a.len())
        .map(|i| {
            let ours = ratio(a[i], b[i])?;
            let theirs = ratio(c[i], d[i])?;
            ratio(ours, theirs).map(|r| round_to(r, 4))
        })
        .collect()
}

/// A target's bound on a measured value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    AtMost(f64),
    AtLeast(f64),
}

impl Bound {
    pub fn holds(&self, x: f64) -> bool {
        match *self {
            Bound::AtMost(limit) => x <= limit,
            Bound::AtLeast(limit) => x >= limit,
        }
    }

    /// In how many of `values` the bound holds.
    pub fn held_in(&self, values: &[f64]) -> usize {
        values.iter().filter(|x| self.holds(**x)).count()
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bound::AtMost(x) => write!(f, "≤ {x}"),
            Bound::AtLeast(x) => write!(f, "≥ {x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn summary_has_least_most_and_spread() {
        let s = Summary::of(&[1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(s.spread(), Some(0.5));
        assert_eq!(Summary::of(&[0.0]).unwrap().spread(), None);
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(5.0));
        assert_eq!(percentile(&v, 90.0), Some(9.0));
        assert_eq!(percentile(&v, 99.0), Some(10.0));
        assert_eq!(percentile(&v, 100.0), Some(10.0));
        assert_eq!(percentile(&v, 1.0), Some(1.0));
        assert_eq!(percentile(&v, 0.0), None);
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn ratio_refuses_a_zero_divisor() {
        assert_eq!(ratio(1.0, 4.0), Some(0.25));
        assert_eq!(ratio(1.0, 0.0), None);
    }

    #[test]
    fn round_to_matches_formatting() {
        assert_eq!(round_to(1.23456, 3), 1.235);
        assert_eq!(round_to(2.5, 0), 2.0);
    }

    #[test]
    fn ratios_within_pair_samples_of_the_same_round() {
        assert_eq!(ratios_within(&[2.0, 3.0], &[1.0, 2.0]), Some(vec![2.0, 1.5]));
        assert_eq!(ratios_within(&[2.0], &[0.0]), None);
        assert_eq!(ratios_of_ratios_within(&[2.0], &[1.0], &[3.0], &[1.0]), Some(vec![0.6667]));
    }

    #[test]
    fn bounds_count_where_they_hold() {
        assert_eq!(Bound::AtMost(1.25).held_in(&[1.0, 1.25, 1.3]), 2);
        assert_eq!(Bound::AtLeast(4.0).held_in(&[3.9, 4.0]), 1);
    }
}
