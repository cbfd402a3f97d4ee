//! The response headers (`response_headers_to_add`), behind one function ([`render`]) so that
//! the client crate's renderer (client/src/headers.rs, the one place the workspace renders rate
//! limit headers) replaces it in one swap once it lands. The model ([`LimitStatus`]) and the
//! mapping are that renderer's and docs/http-headers.md's:
//!
//! * [`HeaderMode::Draft`] (draft-ietf-httpapi-ratelimit-headers-08 onwards):
//!   `RateLimit-Policy: "name";q=<capacity>;w=<window s>` and `RateLimit: "name";r=<remaining>;t=<reset s>`,
//!   one list item per descriptor that has a limit.
//! * [`HeaderMode::Legacy`]: the three fields envoyproxy/ratelimit sends
//!   (`LIMIT_RESPONSE_HEADERS_ENABLED`): `RateLimit-Limit`, `RateLimit-Remaining`,
//!   `RateLimit-Reset` of the binding descriptor, names configurable as there.
//!
//! `Retry-After` (seconds, rounded up) on a refusal that can pass later, in both modes.

use std::fmt::Write as _;
use std::time::Duration;

/// Which headers the service adds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderMode {
    Off,
    Draft,
    /// The three-field form, with envoyproxy/ratelimit's configurable names.
    Legacy {
        limit: String,
        remaining: String,
        reset: String,
    },
}

/// One descriptor's state as the headers show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitStatus {
    /// The policy name (the rule's `name`, else its stats key).
    pub policy: String,
    /// The capacity (`q`).
    pub limit: u64,
    pub remaining: u64,
    /// Time until the limit is fresh.
    pub reset: Duration,
    /// The policy's window (`w`): the window, or for a bucket the time to refill from empty.
    pub window: Duration,
    pub refused: bool,
    /// When refused: when this descriptor would admit (None: never).
    pub retry_after: Option<Duration>,
}

pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The binding limit: when nothing refused, the fewest remaining (ties: the longest reset);
/// when refused, the refusing limit with the longest retry (or, refused for good, the fewest
/// remaining among the refusing).
pub fn binding(limits: &[LimitStatus]) -> Option<&LimitStatus> {
    fn fewest<'a>(it: impl Iterator<Item = &'a LimitStatus>) -> Option<&'a LimitStatus> {
        it.min_by(|a, b| a.remaining.cmp(&b.remaining).then(b.reset.cmp(&a.reset)))
    }
    if !limits.iter().any(|s| s.refused) {
        return fewest(limits.iter());
    }
    if retry_after(limits).is_some() {
        return limits.iter().filter(|s| s.refused).max_by_key(|s| s.retry_after);
    }
    fewest(limits.iter().filter(|s| s.refused && s.retry_after.is_none()))
}

/// The request's `Retry-After`: the longest retry among the refusing limits; None when nothing
/// refused or one of them never admits.
pub fn retry_after(limits: &[LimitStatus]) -> Option<Duration> {
    let mut refusing = limits.iter().filter(|s| s.refused).peekable();
    refusing.peek()?;
    refusing.map(|s| s.retry_after).try_fold(Duration::ZERO, |m, r| r.map(|r| m.max(r)))
}

fn item(out: &mut String, name: &str) {
    if !out.is_empty() {
        out.push_str(", ");
    }
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
}

/// The headers for a request decided by `limits` (its descriptors that have a limit, in order).
pub fn render(limits: &[LimitStatus], mode: &HeaderMode) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if limits.is_empty() || *mode == HeaderMode::Off {
        return out;
    }
    match mode {
        HeaderMode::Off => {}
        HeaderMode::Draft => {
            let (mut policy, mut state) = (String::new(), String::new());
            for s in limits {
                item(&mut policy, &s.policy);
                let _ = write!(policy, ";q={};w={}", s.limit, ceil_secs(s.window).max(1));
                item(&mut state, &s.policy);
                // A refusing limit's t is no later than its retry.
                let t = match (s.refused, s.retry_after) {
                    (true, Some(r)) => s.reset.min(r),
                    _ => s.reset,
                };
                let _ = write!(state, ";r={};t={}", s.remaining, ceil_secs(t));
            }
            out.push(("RateLimit-Policy".to_string(), policy));
            out.push(("RateLimit".to_string(), state));
        }
        HeaderMode::Legacy { limit, remaining, reset } => {
            if let Some(b) = binding(limits) {
                out.push((limit.clone(), b.limit.to_string()));
                out.push((remaining.clone(), b.remaining.to_string()));
                out.push((reset.clone(), ceil_secs(b.reset).to_string()));
            }
        }
    }
    if let Some(r) = retry_after(limits) {
        out.push(("Retry-After".to_string(), ceil_secs(r).to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(policy: &str, limit: u64, remaining: u64, reset_ms: u64, refused: bool, retry_ms: Option<u64>) -> LimitStatus {
        LimitStatus {
            policy: policy.into(),
            limit,
            remaining,
            reset: Duration::from_millis(reset_ms),
            window: Duration::from_secs(60),
            refused,
            retry_after: retry_ms.map(Duration::from_millis),
        }
    }

    #[test]
    fn draft_lists_every_limit_and_retry_after_rounds_up() {
        let h = render(
            &[s("ip", 10, 0, 1500, true, Some(1001)), s("user", 100, 40, 30_000, false, None)],
            &HeaderMode::Draft,
        );
        assert_eq!(h[0], ("RateLimit-Policy".into(), "\"ip\";q=10;w=60, \"user\";q=100;w=60".into()));
        assert_eq!(h[1], ("RateLimit".into(), "\"ip\";r=0;t=2, \"user\";r=40;t=30".into()));
        assert_eq!(h[2], ("Retry-After".into(), "2".into()));
    }

    #[test]
    fn legacy_shows_the_binding_limit() {
        let mode = HeaderMode::Legacy {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        };
        let h = render(&[s("a", 10, 3, 1000, false, None), s("b", 5, 1, 4000, false, None)], &mode);
        assert_eq!(
            h,
            vec![
                ("RateLimit-Limit".to_string(), "5".to_string()),
                ("RateLimit-Remaining".to_string(), "1".to_string()),
                ("RateLimit-Reset".to_string(), "4".to_string())
            ]
        );
        // Refused for good: no Retry-After.
        let h = render(&[s("a", 10, 3, 1000, true, None)], &mode);
        assert!(h.iter().all(|(k, _)| k != "Retry-After"));
    }
}
