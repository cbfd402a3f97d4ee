//! The HTTP rate-limit headers, rendered in one place for every caller: [`Decision`],
//! [`MultiDecision`], [`ThrottleDecision`], the [`Limiter`](crate::Limiter)'s [`Outcome`], the
//! tower layer (`redis-ratelimit-tower`) and the Envoy rate limit service's
//! `response_headers_to_add`. The mapping is docs/http-headers.md's.
//!
//! The input is a list of [`LimitStatus`] (one per limit that decided the request: a name, the
//! capacity, what remains, when it resets, the policy's window, whether it refused and when to
//! retry), so a caller that is not this crate's decision type fills the struct and renders the
//! same headers. The output is an [`http::HeaderMap`]: names are lower case (HTTP/2 and
//! `HeaderName::from_static` require it), values are checked ASCII.
//!
//! Formats ([`HeaderFormat`]), any combination:
//!
//! | format | fields | several limits |
//! |---|---|---|
//! | [`HeaderFormat::Draft`] (draft-ietf-httpapi-ratelimit-headers-08 onwards) | `ratelimit-policy: "name";q=20;w=2`, `ratelimit: "name";r=0;t=2` | one item per limit |
//! | [`HeaderFormat::ThreeField`] (drafts -00 to -06) | `ratelimit-limit`, `ratelimit-remaining`, `ratelimit-reset` | the binding limit |
//! | [`HeaderFormat::XRateLimit`] | `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset` (Unix time or seconds) | the binding limit |
//!
//! `retry-after` is added on a refusal that can pass later, whatever the formats (seconds,
//! rounded up, as every duration here: a client is never told to come back early).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use http::{HeaderMap, HeaderName, HeaderValue};

use crate::decision::{ceil_secs, Decision, MultiDecision, ThrottleDecision};
use crate::engine::Outcome;
use crate::spec::Limit;

/// `RateLimit-Policy` (draft -08 onwards).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft -08 onwards).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Limit` (drafts -00 to -06).
pub const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
/// `RateLimit-Remaining` (drafts -00 to -06).
pub const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
/// `RateLimit-Reset` (drafts -00 to -06): delta seconds.
pub const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`: Unix time in seconds, or delta seconds ([`XReset`]).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `Retry-After` (delta seconds).
pub const RETRY_AFTER: HeaderName = http::header::RETRY_AFTER;

/// A set of header fields to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HeaderFormat {
    /// The current IETF draft (draft-ietf-httpapi-ratelimit-headers-08 onwards, named
    /// policies): `RateLimit-Policy: "name";q=<capacity>;w=<window s>` and
    /// `RateLimit: "name";r=<remaining>;t=<reset s>`, one list item per limit.
    Draft,
    /// Drafts -00 to -06: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (delta
    /// seconds), from the binding limit ([`binding`]).
    ThreeField,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`, from the binding limit.
    XRateLimit(XReset),
}

/// What `X-RateLimit-Reset` carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum XReset {
    /// The Unix time in seconds at which the limit is fresh (GitHub's and Twitter's
    /// convention): `ceil(now + reset)` on this server's clock.
    #[default]
    UnixTime,
    /// Delta seconds, like `RateLimit-Reset` (Envoy's `x-ratelimit-reset`).
    Seconds,
}

/// The formats `headers()` sends: the current draft and the three-field form beside it, so a
/// client written for any revision finds the fields it reads (their names do not collide).
pub const DEFAULT_FORMATS: &[HeaderFormat] = &[HeaderFormat::Draft, HeaderFormat::ThreeField];

/// One limit's state as the headers show it; fields that are unknown (e.g. while Redis is
/// unavailable) are left out of the headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitStatus {
    /// The policy's name in the draft form (an sf-string: printable ASCII; `"` and `\` are
    /// escaped, other bytes become `_`). Default `default`.
    pub policy: Cow<'static, str>,
    /// The capacity (`q`, `RateLimit-Limit`): BURST for the buckets, the window's limit for
    /// the windows.
    pub limit: Option<u64>,
    /// Units still admissible (`r`, `RateLimit-Remaining`).
    pub remaining: Option<u64>,
    /// Time until the limit is fresh (`RateLimit-Reset`; `t` unless refused, below).
    pub reset: Option<Duration>,
    /// The policy's window (`w`): the window, or for a bucket the time to refill it from empty
    /// ([`Limit::policy_window`]).
    pub window: Option<Duration>,
    /// This limit refused the request.
    pub refused: bool,
    /// When refused: when this limit would admit it; `None` when it never can or it is unknown.
    pub retry_after: Option<Duration>,
}

impl Default for LimitStatus {
    fn default() -> Self {
        LimitStatus {
            policy: Cow::Borrowed("default"),
            limit: None,
            remaining: None,
            reset: None,
            window: None,
            refused: false,
            retry_after: None,
        }
    }
}

impl LimitStatus {
    /// Sets the policy name.
    pub fn named(mut self, policy: impl Into<Cow<'static, str>>) -> Self {
        self.policy = policy.into();
        self
    }

    /// Sets the window from the limit's definition ([`Limit::policy_window`]).
    pub fn with_limit(mut self, limit: &Limit) -> Self {
        self.window = Some(limit.policy_window());
        self
    }

    /// The headers of this limit alone.
    pub fn headers(&self, formats: &[HeaderFormat]) -> HeaderMap {
        render(std::slice::from_ref(self), formats)
    }

    /// `t`: the reset, but for a refusing limit no later than its retry (the draft: a
    /// `Retry-After` never points earlier than `t`).
    fn draft_reset(&self) -> Option<Duration> {
        match (self.refused, self.retry_after) {
            (true, Some(r)) => Some(self.reset.map_or(r, |t| t.min(r))),
            _ => self.reset,
        }
    }
}

impl From<&Decision> for LimitStatus {
    fn from(d: &Decision) -> Self {
        LimitStatus {
            limit: Some(d.limit),
            remaining: Some(d.remaining),
            reset: Some(d.reset_after),
            refused: !d.admitted(),
            retry_after: if d.admitted() { None } else { d.retry_after },
            ..LimitStatus::default()
        }
    }
}

impl From<&ThrottleDecision> for LimitStatus {
    fn from(t: &ThrottleDecision) -> Self {
        LimitStatus {
            limit: Some(t.limit),
            remaining: Some(t.remaining),
            reset: Some(Duration::from_secs(t.reset_after_secs)),
            refused: t.limited,
            retry_after: if t.limited { t.retry_after_secs.map(Duration::from_secs) } else { None },
            ..LimitStatus::default()
        }
    }
}

impl From<&Outcome> for LimitStatus {
    /// What the outcome knows; not refused in shadow mode (`allowed` is what the client sees).
    fn from(o: &Outcome) -> Self {
        LimitStatus {
            limit: o.limit,
            remaining: o.remaining,
            reset: o.reset_after(),
            refused: !o.allowed,
            retry_after: if o.allowed { None } else { o.retry_after() },
            ..LimitStatus::default()
        }
    }
}

/// The limit whose numbers go into the single-limit formats (docs/http-headers.md, RL.MULTI):
/// when nothing refused, the one with the fewest `remaining` (ties: the longest reset); when
/// refused and it can pass later, the refusing limit with the longest retry; when refused for
/// good, the refusing limit with the fewest `remaining`. Limits with unknown numbers come last.
pub fn binding(limits: &[LimitStatus]) -> Option<&LimitStatus> {
    if !limits.iter().any(|s| s.refused) {
        return fewest(limits.iter());
    }
    if retry_after(limits).is_some() {
        return limits.iter().filter(|s| s.refused).max_by_key(|s| s.retry_after);
    }
    fewest(limits.iter().filter(|s| s.refused && s.retry_after.is_none()))
}

fn fewest<'a>(limits: impl Iterator<Item = &'a LimitStatus>) -> Option<&'a LimitStatus> {
    let key = |s: &LimitStatus| (s.remaining.is_none(), s.remaining.unwrap_or(0));
    limits.min_by(|a, b| key(a).cmp(&key(b)).then(b.reset.cmp(&a.reset)))
}

/// The request's `Retry-After`: `None` unless some limit refused; then the longest retry among
/// the refusing limits, `None` if one of them never admits (or does not know when).
pub fn retry_after(limits: &[LimitStatus]) -> Option<Duration> {
    let mut refusing = limits.iter().filter(|s| s.refused).peekable();
    refusing.peek()?;
    refusing.map(|s| s.retry_after).try_fold(Duration::ZERO, |m, r| r.map(|r| m.max(r)))
}

/// The headers of a request decided by `limits`, in `formats`, plus `retry-after` when refused
/// and it can pass later. Reads the system clock only for `XReset::UnixTime`.
pub fn render(limits: &[LimitStatus], formats: &[HeaderFormat]) -> HeaderMap {
    let mut map = HeaderMap::new();
    render_into(&mut map, limits, formats, None);
    map
}

/// [`render`] into `map` (each field replaces one of the same name), with the Unix time for
/// `XReset::UnixTime` given (`None`: the system clock).
pub fn render_into(map: &mut HeaderMap, limits: &[LimitStatus], formats: &[HeaderFormat], unix_now: Option<Duration>) {
    let b = binding(limits);
    for f in formats {
        match f {
            HeaderFormat::Draft => {
                let mut policy = String::new();
                let mut state = String::new();
                for s in limits {
                    if let Some(q) = s.limit {
                        item(&mut policy, &s.policy);
                        let _ = write!(policy, ";q={q}");
                        if let Some(w) = s.window {
                            // A non-zero integer (the draft); sub-second windows show as 1.
                            let _ = write!(policy, ";w={}", ceil_secs(w).max(1));
                        }
                    }
                    if let Some(r) = s.remaining {
                        item(&mut state, &s.policy);
                        let _ = write!(state, ";r={r}");
                        if let Some(t) = s.draft_reset() {
                            let _ = write!(state, ";t={}", ceil_secs(t));
                        }
                    }
                }
                put(map, RATELIMIT_POLICY, policy);
                put(map, RATELIMIT, state);
            }
            HeaderFormat::ThreeField => {
                if let Some(b) = b {
                    put_num(map, RATELIMIT_LIMIT, b.limit);
                    put_num(map, RATELIMIT_REMAINING, b.remaining);
                    put_num(map, RATELIMIT_RESET, b.reset.map(ceil_secs));
                }
            }
            HeaderFormat::XRateLimit(reset) => {
                if let Some(b) = b {
                    put_num(map, X_RATELIMIT_LIMIT, b.limit);
                    put_num(map, X_RATELIMIT_REMAINING, b.remaining);
                    let value = b.reset.map(|r| match reset {
                        XReset::Seconds => ceil_secs(r),
                        XReset::UnixTime => ceil_secs(unix_now.unwrap_or_else(system_unix_now).saturating_add(r)),
                    });
                    put_num(map, X_RATELIMIT_RESET, value);
                }
            }
        }
    }
    put_num(map, RETRY_AFTER, retry_after(limits).map(ceil_secs));
}

fn system_unix_now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

/// Appends a list item's bare item: the policy name as an sf-string.
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

fn put(map: &mut HeaderMap, name: HeaderName, value: String) {
    if value.is_empty() {
        return;
    }
    // Built from printable ASCII only, so this always converts; never panic on a header.
    if let Ok(v) = HeaderValue::try_from(value) {
        map.insert(name, v);
    }
}

fn put_num(map: &mut HeaderMap, name: HeaderName, value: Option<u64>) {
    if let Some(v) = value {
        map.insert(name, HeaderValue::from(v));
    }
}

impl Decision {
    /// This decision as one limit of the headers (policy `default`, no window: set them with
    /// [`LimitStatus::named`] / [`LimitStatus::with_limit`]).
    pub fn status(&self) -> LimitStatus {
        self.into()
    }

    /// The headers in [`DEFAULT_FORMATS`]: `ratelimit-policy`, `ratelimit`, `ratelimit-limit`,
    /// `ratelimit-remaining`, `ratelimit-reset`, and `retry-after` when limited and it can pass
    /// later. For a peek (`COST 0`), do not answer 429 on `allowed = 0`.
    pub fn headers(&self) -> HeaderMap {
        self.headers_in(DEFAULT_FORMATS)
    }

    /// The headers in the formats given.
    pub fn headers_in(&self, formats: &[HeaderFormat]) -> HeaderMap {
        self.status().headers(formats)
    }
}

impl MultiDecision {
    /// One [`LimitStatus`] per limit, named `limit1`, `limit2`, … in the call's order (rename
    /// them with [`LimitStatus::named`]). On a refusal RL.MULTI reports `retry_after_ms` -1
    /// both for a limit that would have admitted and for one that never can: with an overall
    /// retry, the limits with a retry refused; without one, those without (one of them can
    /// never admit) and those with.
    pub fn statuses(&self) -> Vec<LimitStatus> {
        let refused = |d: &Decision| !self.admitted() && (self.retry_after.is_none() || d.retry_after.is_some());
        self.limits
            .iter()
            .enumerate()
            .map(|(i, d)| LimitStatus {
                refused: refused(d),
                retry_after: if refused(d) { d.retry_after } else { None },
                ..d.status().named(format!("limit{}", i + 1))
            })
            .collect()
    }

    /// The headers in [`DEFAULT_FORMATS`]: every limit in the draft form, the binding limit in
    /// the three-field form, `retry-after` from the overall value.
    pub fn headers(&self) -> HeaderMap {
        self.headers_in(DEFAULT_FORMATS)
    }

    /// The headers in the formats given.
    pub fn headers_in(&self, formats: &[HeaderFormat]) -> HeaderMap {
        render(&self.statuses(), formats)
    }
}

impl ThrottleDecision {
    /// The headers in [`DEFAULT_FORMATS`] (redis-cell's whole seconds as they are).
    pub fn headers(&self) -> HeaderMap {
        self.headers_in(DEFAULT_FORMATS)
    }

    /// The headers in the formats given.
    pub fn headers_in(&self, formats: &[HeaderFormat]) -> HeaderMap {
        LimitStatus::from(self).headers(formats)
    }
}

impl Outcome {
    /// This outcome as one limit of the headers (policy `default`; see [`LimitStatus`]).
    pub fn status(&self) -> LimitStatus {
        self.into()
    }

    /// The headers in [`DEFAULT_FORMATS`], of what is known; `retry-after` when refused and
    /// it can pass later (never in shadow mode, where the request goes through).
    pub fn headers(&self) -> HeaderMap {
        self.headers_in(DEFAULT_FORMATS)
    }

    /// The headers in the formats given.
    pub fn headers_in(&self, formats: &[HeaderFormat]) -> HeaderMap {
        self.status().headers(formats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
        h.get(name).map(|v| v.to_str().unwrap())
    }

    fn status(limit: u64, remaining: u64, reset_ms: u64) -> LimitStatus {
        LimitStatus {
            limit: Some(limit),
            remaining: Some(remaining),
            reset: Some(Duration::from_millis(reset_ms)),
            ..LimitStatus::default()
        }
    }

    fn refusing(mut s: LimitStatus, retry_ms: Option<u64>) -> LimitStatus {
        s.refused = true;
        s.retry_after = retry_ms.map(Duration::from_millis);
        s
    }

    #[test]
    fn every_name_is_lower_case_and_from_static_accepts_it() {
        let s = refusing(status(3, 0, 5968), Some(1968))
            .named("burst")
            .with_limit(&Limit::gcra(1, Duration::from_secs(2)).unwrap());
        let formats = [HeaderFormat::Draft, HeaderFormat::ThreeField, HeaderFormat::XRateLimit(XReset::Seconds)];
        let h = s.headers(&formats);
        assert_eq!(h.len(), 9);
        for name in h.keys() {
            assert_eq!(name.as_str(), name.as_str().to_ascii_lowercase());
            // The call that panicked on the old mixed-case names.
            let _ = HeaderName::from_static(name.as_str().to_owned().leak());
        }
    }

    #[test]
    fn draft_form_names_each_policy() {
        // docs/http-headers.md: RL.GCRA k 10 1s BURST 20 → q=20;w=2.
        let limit = Limit::gcra(10, Duration::from_secs(1)).unwrap().with_burst(20).unwrap();
        let s = status(20, 7, 1300).named("burst").with_limit(&limit);
        let h = s.headers(&[HeaderFormat::Draft]);
        assert_eq!(get(&h, "ratelimit-policy"), Some(r#""burst";q=20;w=2"#));
        assert_eq!(get(&h, "ratelimit"), Some(r#""burst";r=7;t=2"#));
        assert_eq!(h.len(), 2);
        let day = status(1000, 990, 3_600_000)
            .named("daily")
            .with_limit(&Limit::fixed(1000, Duration::from_secs(86400)).unwrap());
        let h = render(&[s, day], &[HeaderFormat::Draft]);
        assert_eq!(get(&h, "ratelimit-policy"), Some(r#""burst";q=20;w=2, "daily";q=1000;w=86400"#));
        assert_eq!(get(&h, "ratelimit"), Some(r#""burst";r=7;t=2, "daily";r=990;t=3600"#));
    }

    #[test]
    fn draft_reset_is_never_after_retry_after() {
        let s = refusing(status(3, 0, 5968), Some(1968));
        let h = s.headers(&[HeaderFormat::Draft, HeaderFormat::ThreeField]);
        assert_eq!(get(&h, "ratelimit"), Some(r#""default";r=0;t=2"#));
        assert_eq!(get(&h, "retry-after"), Some("2"));
        // The three-field form keeps docs/http-headers.md's mapping (time until fresh).
        assert_eq!(get(&h, "ratelimit-reset"), Some("6"));
    }

    #[test]
    fn names_are_escaped_sf_strings() {
        let h = status(1, 1, 0).named("a\"b\\c\u{e9}\n").headers(&[HeaderFormat::Draft]);
        assert_eq!(get(&h, "ratelimit-policy"), Some(r#""a\"b\\c__";q=1"#));
    }

    #[test]
    fn unknown_fields_are_left_out() {
        // Fail closed with Redis down: refused, nothing known.
        let s = LimitStatus { refused: true, ..LimitStatus::default() };
        assert!(s.headers(DEFAULT_FORMATS).is_empty());
        let s = LimitStatus { remaining: Some(4), ..LimitStatus::default() };
        let h = s.headers(DEFAULT_FORMATS);
        assert_eq!(get(&h, "ratelimit"), Some(r#""default";r=4"#));
        assert_eq!(get(&h, "ratelimit-remaining"), Some("4"));
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn x_ratelimit_reset_as_unix_time_or_seconds() {
        let s = status(5, 2, 1500);
        let mut h = HeaderMap::new();
        render_into(
            &mut h,
            std::slice::from_ref(&s),
            &[HeaderFormat::XRateLimit(XReset::UnixTime)],
            Some(Duration::from_millis(1_700_000_000_600)),
        );
        assert_eq!(get(&h, "x-ratelimit-reset"), Some("1700000003"));
        assert_eq!(get(&h, "x-ratelimit-limit"), Some("5"));
        assert_eq!(get(&h, "x-ratelimit-remaining"), Some("2"));
        let h = s.headers(&[HeaderFormat::XRateLimit(XReset::Seconds)]);
        assert_eq!(get(&h, "x-ratelimit-reset"), Some("2"));
        let now = system_unix_now().as_secs();
        let h = s.headers(&[HeaderFormat::XRateLimit(XReset::UnixTime)]);
        let t: u64 = get(&h, "x-ratelimit-reset").unwrap().parse().unwrap();
        assert!((now + 2..=now + 3).contains(&t), "{t} {now}");
    }

    #[test]
    fn binding_and_retry_after_of_several_limits() {
        // docs/http-headers.md's RL.MULTI table, 3rd, 4th and 5th calls.
        let gcra = status(2, 0, 10_000).named("ip");
        let sliding = status(3, 1, 120_000).named("user");
        let third = [refusing(gcra.clone(), Some(5000)), sliding.clone()];
        assert_eq!(binding(&third).unwrap().policy, "ip");
        assert_eq!(retry_after(&third), Some(Duration::from_secs(5)));
        let fourth = [gcra.clone(), status(3, 0, 115_000).named("user")];
        assert_eq!(binding(&fourth).unwrap().policy, "user");
        assert_eq!(retry_after(&fourth), None);
        let fifth = [refusing(gcra.clone(), Some(5000)), refusing(status(3, 0, 115_000).named("user"), Some(75_000))];
        assert_eq!(binding(&fifth).unwrap().policy, "user");
        let h = render(&fifth, DEFAULT_FORMATS);
        assert_eq!(get(&h, "retry-after"), Some("75"));
        assert_eq!(get(&h, "ratelimit-reset"), Some("115"));
        assert_eq!(get(&h, "ratelimit"), Some(r#""ip";r=0;t=5, "user";r=0;t=75"#));
        // One refusing limit can never pass: no retry-after at all.
        let never = [refusing(gcra, Some(5000)), refusing(sliding, None)];
        assert_eq!(retry_after(&never), None);
        assert_eq!(binding(&never).unwrap().policy, "user");
        assert!(render(&never, DEFAULT_FORMATS).get("retry-after").is_none());
        assert_eq!(binding(&[]), None);
    }

    #[test]
    fn shadow_outcome_has_no_retry_after() {
        let o = Outcome {
            allowed: true,
            enforced: false,
            source: crate::Source::Cache,
            retry_after: Some(crate::Nanos::from_secs(2)),
            delay: None,
            limit: Some(5),
            remaining: Some(0),
            reset_after: Some(crate::Nanos::from_secs(3)),
            taken: None,
        };
        let h = o.headers();
        assert!(h.get("retry-after").is_none());
        assert_eq!(get(&h, "ratelimit"), Some(r#""default";r=0;t=3"#));
        let refused = Outcome { allowed: false, ..o };
        assert_eq!(get(&refused.headers(), "retry-after"), Some("2"));
    }

    #[test]
    fn docs_example() {
        // docs/http-headers.md, "The Rust client's headers".
        let per_ip = LimitStatus {
            limit: Some(20),
            remaining: Some(0),
            reset: Some(Duration::from_millis(5968)),
            window: Some(Duration::from_secs(2)),
            refused: true,
            retry_after: Some(Duration::from_millis(1968)),
            ..LimitStatus::default()
        }
        .named("ip");
        let h = render(&[per_ip], &[HeaderFormat::Draft]);
        assert_eq!(h["ratelimit-policy"], r#""ip";q=20;w=2"#);
        assert_eq!(h["ratelimit"], r#""ip";r=0;t=2"#);
        assert_eq!(h["retry-after"], "2");
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn policy_windows() {
        let gcra = |limit, burst| Limit::gcra(limit, Duration::from_secs(1)).unwrap().with_burst(burst).unwrap();
        assert_eq!(gcra(10, 20).policy_window(), Duration::from_secs(2));
        let tb = Limit::token_bucket(100, Duration::from_secs(60)).unwrap();
        assert_eq!(tb.policy_window(), Duration::from_secs(60));
        assert_eq!(Limit::sliding(5, Duration::from_secs(60)).unwrap().policy_window(), Duration::from_secs(60));
        assert_eq!(gcra(3, 1).policy_window(), Duration::from_nanos(333_333_333));
        let s = status(1, 1, 0).with_limit(&gcra(3, 1));
        assert_eq!(get(&s.headers(&[HeaderFormat::Draft]), "ratelimit-policy"), Some(r#""default";q=1;w=1"#));
    }
}
