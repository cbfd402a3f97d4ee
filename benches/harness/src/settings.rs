//! Environment knobs: `NAME=value` read once at the start, with a default when unset or empty.

use std::str::FromStr;

/// `$name` parsed, or `default` when unset or empty; an unparsable value is an error naming it.
pub fn env_or<T: FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().map_err(|_| format!("{name}={v:?} is not a valid value")),
        _ => Ok(default),
    }
}

/// `$name` as text, or None when unset or empty.
pub fn env_text(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `$name` as a space-separated list of numbers, or `default`.
pub fn env_list(name: &str, default: &[u64]) -> Result<Vec<u64>, String> {
    match env_text(name) {
        None => Ok(default.to_vec()),
        Some(v) => v
            .split_whitespace()
            .map(|x| x.parse().map_err(|_| format!("{name}={v:?}: {x:?} is not a number")))
            .collect(),
    }
}
