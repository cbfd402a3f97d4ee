//! What a limiter is: the algorithm and its parameters, as the module's commands take them
//! (the core's [`Algorithm`] and its facts, and its validated [`Limit`]), and the module's
//! duration syntax.

use std::time::Duration;

pub use redis_ratelimit_core::{Algorithm, Limit, LimitError};

/// Parses a duration the way the module parses `period` and `window`: a positive integer with an
/// optional unit `us`, `ms`, `s`, `m`, `h`, `d` (`500ms`, `60s`, `5m`, `1d`); a bare number is
/// seconds. For services that take their limits from configuration.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
        format!("invalid duration '{s}': expected a positive integer with an optional unit us, ms, s, m, h or d")
    })?;
    let unit_us: u64 = match unit.to_ascii_lowercase().as_str() {
        "us" => 1,
        "ms" => 1_000,
        "" | "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => return Err(format!("invalid duration '{s}': unknown unit '{unit}'")),
    };
    n.checked_mul(unit_us).map(Duration::from_micros).ok_or_else(|| format!("invalid duration '{s}': too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_the_module_parses_them() {
        assert_eq!(parse_duration("1500us"), Ok(Duration::from_micros(1500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("0s").is_err() && parse_duration("5x").is_err() && parse_duration("").is_err());
    }
}
