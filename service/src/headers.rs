//! The response headers (`response_headers_to_add`), rendered by the client crate's renderer
//! (`redis_ratelimit_client::headers`, the one place the workspace renders rate limit headers,
//! docs/http-headers.md's mapping):
//!
//! * [`HeaderMode::Draft`] (draft-ietf-httpapi-ratelimit-headers-08 onwards):
//!   `RateLimit-Policy: "name";q=<capacity>;w=<window s>` and `RateLimit: "name";r=<remaining>;t=<reset s>`,
//!   one list item per descriptor that has a limit.
//! * [`HeaderMode::Legacy`]: the three fields envoyproxy/ratelimit sends
//!   (`LIMIT_RESPONSE_HEADERS_ENABLED`): `RateLimit-Limit`, `RateLimit-Remaining`,
//!   `RateLimit-Reset` of the binding descriptor, under envoyproxy/ratelimit's configurable names.
//!
//! `Retry-After` (seconds, rounded up) on a refusal that can pass later, in both modes. Names
//! are lower case (HTTP/2's form; Envoy matches them case-insensitively).

use std::time::Duration;

use redis_ratelimit_client::headers::{
    render as render_headers, RATELIMIT_LIMIT, RATELIMIT_REMAINING, RATELIMIT_RESET,
};
use redis_ratelimit_client::{HeaderFormat, LimitStatus as ClientStatus};

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

/// The headers for a request decided by `limits` (its descriptors that have a limit, in order).
pub fn render(limits: &[LimitStatus], mode: &HeaderMode) -> Vec<(String, String)> {
    let format = match mode {
        HeaderMode::Off => return Vec::new(),
        HeaderMode::Draft => HeaderFormat::Draft,
        HeaderMode::Legacy { .. } => HeaderFormat::ThreeField,
    };
    if limits.is_empty() {
        return Vec::new();
    }
    let statuses: Vec<ClientStatus> = limits
        .iter()
        .map(|s| ClientStatus {
            policy: s.policy.clone().into(),
            limit: Some(s.limit),
            remaining: Some(s.remaining),
            reset: Some(s.reset),
            window: Some(s.window),
            refused: s.refused,
            retry_after: s.retry_after,
        })
        .collect();
    let map = render_headers(&statuses, &[format]);
    let mut out: Vec<(String, String)> = map
        .iter()
        .map(|(k, v)| {
            let name = match mode {
                HeaderMode::Legacy { limit, .. } if *k == RATELIMIT_LIMIT => limit.clone(),
                HeaderMode::Legacy { remaining, .. } if *k == RATELIMIT_REMAINING => remaining.clone(),
                HeaderMode::Legacy { reset, .. } if *k == RATELIMIT_RESET => reset.clone(),
                _ => k.as_str().to_string(),
            };
            (name, v.to_str().unwrap_or_default().to_string())
        })
        .collect();
    // Policies first, then state, then Retry-After: a stable order for logs and tests.
    out.sort_by_key(|(k, _)| match k.as_str() {
        "ratelimit-policy" => 0,
        "ratelimit" => 1,
        "retry-after" => 9,
        _ => 5,
    });
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
        assert_eq!(h[0], ("ratelimit-policy".into(), "\"ip\";q=10;w=60, \"user\";q=100;w=60".into()));
        assert_eq!(h[1], ("ratelimit".into(), "\"ip\";r=0;t=2, \"user\";r=40;t=30".into()));
        assert_eq!(h[2], ("retry-after".into(), "2".into()));
    }

    #[test]
    fn legacy_shows_the_binding_limit_under_its_configured_names() {
        let mode = HeaderMode::Legacy {
            limit: "X-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        };
        let mut h = render(&[s("a", 10, 3, 1000, false, None), s("b", 5, 1, 4000, false, None)], &mode);
        h.sort();
        assert_eq!(
            h,
            vec![
                ("RateLimit-Remaining".to_string(), "1".to_string()),
                ("RateLimit-Reset".to_string(), "4".to_string()),
                ("X-Limit".to_string(), "5".to_string()),
            ]
        );
        // Refused for good: no Retry-After.
        let h = render(&[s("a", 10, 3, 1000, true, None)], &mode);
        assert!(h.iter().all(|(k, _)| k != "retry-after"));
    }
}
