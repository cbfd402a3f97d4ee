//! Buckets: a bucket id read as one descriptor of the stream's domain ([`resolve`]), and the
//! registry that bounds how many buckets a replica tracks ([`Slots`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use redis_ratelimit_client::spec::Limit;
use redis_ratelimit_core::{Algorithm, Refill};

use super::plan::Rate;
use crate::config::{Config, FailureMode};
use crate::metrics::{Metrics, RuleStats};
use crate::service::{redis_key, MAX_ENTRIES, MAX_ENTRY_BYTES};

/// A bucket id's entries, sorted by key: one map, whatever order it came in.
pub type BucketKey = Vec<(String, String)>;

/// The canonical form of a bucket id's map (sorted by key).
pub fn bucket_key<'a>(entries: impl IntoIterator<Item = (&'a String, &'a String)>) -> BucketKey {
    let mut k: BucketKey = entries.into_iter().map(|(a, b)| (a.clone(), b.clone())).collect();
    k.sort();
    k
}

/// What the service does for a bucket.
#[derive(Clone, Debug)]
pub enum Target {
    /// No rule (an unknown domain, or no descriptor matches): the unknown-bucket action.
    Unknown,
    /// Too many entries, or an entry too long (the limits of `ShouldRateLimit`'s descriptors).
    Invalid(String),
    /// `unlimited: true`: allowed, counted.
    Unlimited(Arc<RuleStats>),
    /// `requests_per_unit: 0`: refused, counted.
    Refused(Arc<RuleStats>),
    /// `shadow_mode: true`: allowed; admissions charged to Redis after each report.
    Shadow(Leased),
    /// Leases.
    Leased(Leased),
}

/// A limited bucket's limit, where it lives, and what to do when Redis cannot answer.
#[derive(Clone, Debug)]
pub struct Leased {
    /// The Redis key (the one `ShouldRateLimit` uses for the same entries in this order).
    pub key: String,
    pub limit: Limit,
    pub rate: Rate,
    pub mode: FailureMode,
    pub stats: Arc<RuleStats>,
}

/// How keys are written and which failure mode applies when a domain sets none.
#[derive(Clone, Debug)]
pub struct KeySettings {
    pub prefix: String,
    pub hash_tag_domain: bool,
    pub failure_mode: FailureMode,
}

/// The limit as leases see it: its rate, and its capacity by the one rule
/// ([`Limit::capacity`]).
fn rate_of(l: &Limit) -> Rate {
    Rate { units: l.limit(), period: l.period_nanos(), capacity: l.capacity() }
}

/// A bucket of `domain`, resolved against `config` with `ShouldRateLimit`'s rules: the entries
/// ordered by the descriptor tree ([`Config::order_entries`]), then matched by
/// [`Config::get_limit`]. Also says whether the order was ambiguous.
pub fn resolve(
    config: Option<&Config>,
    domain: &str,
    bucket: &BucketKey,
    keys: &KeySettings,
    metrics: &Metrics,
) -> (Target, bool) {
    if bucket.is_empty() {
        return (Target::Invalid("a bucket id with no entries".into()), false);
    }
    if bucket.len() > MAX_ENTRIES {
        return (Target::Invalid(format!("{} entries (at most {MAX_ENTRIES})", bucket.len())), false);
    }
    for (k, v) in bucket {
        if k.is_empty() {
            return (Target::Invalid("an entry with an empty key".into()), false);
        }
        if k.len() > MAX_ENTRY_BYTES || v.len() > MAX_ENTRY_BYTES {
            let name: String = k.chars().take(32).collect();
            return (Target::Invalid(format!("entry '{name}' longer than {MAX_ENTRY_BYTES} bytes")), false);
        }
    }
    let Some(config) = config else { return (Target::Unknown, false) };
    let entries: Vec<(&str, &str)> = bucket.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let Some(ordered) = config.order_entries(domain, &entries) else { return (Target::Unknown, false) };
    let entries: Vec<(&str, &str)> = ordered.order.iter().map(|i| entries[*i]).collect();
    let Some(m) = config.get_limit(domain, &entries, metrics) else { return (Target::Unknown, ordered.ambiguous) };
    let rule = &m.rule;
    let target = if rule.unlimited {
        Target::Unlimited(m.stats)
    } else if let Some(limit) = rule.limit {
        let leased = Leased {
            key: redis_key(&keys.prefix, keys.hash_tag_domain, rule.algorithm, domain, &entries, &m.share_patterns),
            limit,
            rate: rate_of(&limit),
            mode: config.domains.get(domain).and_then(|d| d.failure_mode).unwrap_or(keys.failure_mode),
            stats: m.stats,
        };
        if rule.shadow_mode {
            Target::Shadow(leased)
        } else {
            Target::Leased(leased)
        }
    } else {
        // No limit and not unlimited: `requests_per_unit: 0`, a blocklist entry.
        Target::Refused(m.stats)
    };
    (target, ordered.ambiguous)
}

/// The key of a bucket's holder counter (plan::fleet_holders): its Redis key and `|holders`,
/// so it stays under the key prefix (the ACL key pattern) and in the key's hash slot when a
/// domain hash tag is set; no descriptor's key ends so (each `|` of one starts an escaped
/// `entry=value`).
pub fn holders_key(key: &str) -> String {
    format!("{key}|holders")
}

/// Whether a lease's units end with a window (fixed, sliding: [`Refill`] at or by the window's
/// end): the next lease is then due at the window's end.
pub fn is_window(a: Algorithm) -> bool {
    match a.refill() {
        Refill::AtWindowEnd | Refill::WindowWeight => true,
        Refill::Continuous | Refill::PerUnit => false,
    }
}

/// The buckets a replica tracks, counted against a cap: a [`Slot`] per tracked bucket, given
/// back when dropped.
#[derive(Debug)]
pub struct Slots {
    cap: usize,
    used: AtomicUsize,
}

/// One tracked bucket's place in [`Slots`].
#[derive(Debug)]
pub struct Slot(Arc<Slots>);

impl Slots {
    pub fn new(cap: usize) -> Arc<Slots> {
        Arc::new(Slots { cap, used: AtomicUsize::new(0) })
    }

    /// A place for one more bucket, if the cap allows.
    pub fn take(self: &Arc<Slots>) -> Option<Slot> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.cap).then_some(n + 1))
            .ok()
            .map(|_| Slot(self.clone()))
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{build, parse_file, LoadOptions};

    fn config(yaml: &str, m: &Metrics) -> Config {
        build(&[parse_file("q.yaml", yaml).unwrap()], LoadOptions { merge_domains: false }, m).unwrap()
    }

    fn key(entries: &[(&str, &str)]) -> BucketKey {
        let owned: Vec<(String, String)> = entries.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        bucket_key(owned.iter().map(|(a, b)| (a, b)))
    }

    fn keys() -> KeySettings {
        KeySettings { prefix: "rls:".into(), hash_tag_domain: false, failure_mode: FailureMode::Closed }
    }

    #[test]
    fn a_bucket_is_the_descriptor_its_entries_make() {
        let m = Metrics::new(100);
        let c = config(
            "domain: edge\nfailure_mode: local\ndescriptors:\n  - key: api\n    value: public\n    descriptors:\n      - key: user\n        rate_limit: {requests_per_unit: 100, unit: second, algorithm: gcra, burst: 20}\n  - key: vip\n    rate_limit: {unlimited: true}\n  - key: blocked\n    rate_limit: {requests_per_unit: 0, unit: second}\n  - key: trial\n    shadow_mode: true\n    rate_limit: {requests_per_unit: 5, unit: minute}\n",
            &m,
        );
        // The map's order does not matter: api → user, as configured.
        let (t, ambiguous) = resolve(Some(&c), "edge", &key(&[("user", "a{b}"), ("api", "public")]), &keys(), &m);
        assert!(!ambiguous);
        let Target::Leased(l) = t else { panic!("{t:?}") };
        assert_eq!(l.key, "rls:gcra:edge|api=public|user=a%7Bb%7D");
        assert_eq!(holders_key(&l.key), "rls:gcra:edge|api=public|user=a%7Bb%7D|holders");
        assert_eq!(l.limit, Limit::gcra(100, std::time::Duration::from_secs(1)).unwrap().with_burst(20).unwrap());
        assert_eq!(l.rate, Rate { units: 100, period: super::super::plan::SECOND, capacity: 20 });
        assert_eq!(l.mode, FailureMode::Local);
        assert!(matches!(resolve(Some(&c), "edge", &key(&[("vip", "x")]), &keys(), &m).0, Target::Unlimited(_)));
        assert!(matches!(resolve(Some(&c), "edge", &key(&[("blocked", "x")]), &keys(), &m).0, Target::Refused(_)));
        let (t, _) = resolve(Some(&c), "edge", &key(&[("trial", "x")]), &keys(), &m);
        let Target::Shadow(s) = t else { panic!("{t:?}") };
        assert_eq!((s.key.as_str(), s.mode), ("rls:fixed:edge|trial=x", FailureMode::Local));
        // Unknown: no rule, an unknown domain, no configuration.
        for (d, k) in
            [("edge", key(&[("api", "public")])), ("edge", key(&[("nope", "1")])), ("other", key(&[("vip", "1")]))]
        {
            assert!(matches!(resolve(Some(&c), d, &k, &keys(), &m).0, Target::Unknown), "{d} {k:?}");
        }
        assert!(matches!(resolve(None, "edge", &key(&[("vip", "1")]), &keys(), &m).0, Target::Unknown));
    }

    #[test]
    fn invalid_buckets_say_why() {
        let m = Metrics::new(100);
        let c = config("domain: d\ndescriptors: []\n", &m);
        let many: Vec<(String, String)> = (0..33).map(|i| (format!("k{i}"), "v".to_string())).collect();
        let t = resolve(Some(&c), "d", &bucket_key(many.iter().map(|(a, b)| (a, b))), &keys(), &m).0;
        assert!(matches!(&t, Target::Invalid(w) if w.contains("33 entries")), "{t:?}");
        let long = "x".repeat(MAX_ENTRY_BYTES + 1);
        let t = resolve(Some(&c), "d", &key(&[("k", long.as_str())]), &keys(), &m).0;
        assert!(matches!(&t, Target::Invalid(w) if w.contains("longer than 4096")), "{t:?}");
        assert!(matches!(resolve(Some(&c), "d", &key(&[("", "v")]), &keys(), &m).0, Target::Invalid(_)));
        assert!(matches!(resolve(Some(&c), "d", &Vec::new(), &keys(), &m).0, Target::Invalid(_)));
    }

    #[test]
    fn slots_are_capped_and_given_back() {
        let s = Slots::new(2);
        let a = s.take().unwrap();
        let b = s.take().unwrap();
        assert!(s.take().is_none());
        assert_eq!(s.used(), 2);
        drop(a);
        let c = s.take();
        assert!(c.is_some());
        drop((b, c));
        assert_eq!(s.used(), 0);
    }
}
