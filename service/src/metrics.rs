//! Counters and the Prometheus text exposition (`/metrics`).
//!
//! Per rule, envoyproxy/ratelimit's stats (`total_hits`, `over_limit`, `near_limit`,
//! `within_limit`, `shadow_mode`) under the names its default Prometheus mapping gives them
//! (`ratelimit_service_rate_limit_<stat>{domain, key1, key2, …}`), so dashboards keep working;
//! then the service's own (requests, errors, config loads) and this service's additions (Redis
//! calls by command, their latency, the breaker, failure-policy decisions, leases).
//!
//! The exposition is written here rather than with a metrics crate because the names must be
//! exactly envoyproxy/ratelimit's (`prometheus-client` appends `_total` to every counter).

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// A stats key: the domain, then one component per descriptor level (`key` or `key_value`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StatKey {
    pub domain: String,
    pub components: Vec<String>,
}

impl StatKey {
    pub fn new(domain: String, components: Vec<String>) -> StatKey {
        StatKey { domain, components }
    }
    /// envoyproxy/ratelimit's dotted form: `domain.key_value.key`.
    pub fn full(&self) -> String {
        let mut s = self.domain.clone();
        for c in &self.components {
            s.push('.');
            s.push_str(c);
        }
        s
    }
}

/// envoyproxy/ratelimit's `SanitizeStatName`: `:` and `|` become `_`, and so do the dots of
/// anything shaped like an IPv4 address.
pub fn sanitize(s: &str) -> String {
    let s = s.replace([':', '|'], "_");
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if let Some(len) = ipv4_at(&b[i..]) {
            out.push_str(&s[i..i + len].replace('.', "_"));
            i += len;
        } else {
            let ch = s[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Length of a `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` match at the start of `b` (greedy, as the
/// regexp finds it), if any.
fn ipv4_at(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    for part in 0..4 {
        let start = i;
        while i < b.len() && i - start < 3 && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
        if part < 3 {
            if i >= b.len() || b[i] != b'.' {
                return None;
            }
            i += 1;
        }
    }
    Some(i)
}

/// One rule's counters (hits, not requests: a request with hits_addend 5 adds 5).
#[derive(Debug)]
pub struct RuleStats {
    pub key: StatKey,
    pub total_hits: AtomicU64,
    pub over_limit: AtomicU64,
    pub near_limit: AtomicU64,
    pub within_limit: AtomicU64,
    pub shadow_mode: AtomicU64,
}

impl RuleStats {
    fn new(key: StatKey) -> RuleStats {
        RuleStats {
            key,
            total_hits: AtomicU64::new(0),
            over_limit: AtomicU64::new(0),
            near_limit: AtomicU64::new(0),
            within_limit: AtomicU64::new(0),
            shadow_mode: AtomicU64::new(0),
        }
    }
}

/// Redis commands the service sends, by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisOp {
    /// One limiter command (`RL.FIXED`, `RL.GCRA`, …) for a single descriptor.
    Check,
    /// `RL.MULTI` for several descriptors.
    Multi,
    /// The atomic script for descriptors that cannot share one RL.MULTI (shadow mode, mixed
    /// hits_addend).
    Script,
    /// `RL.RETURN` (compensation on Redis Cluster, leases).
    Return,
    /// A lease claim (`COST b PARTIAL`).
    Claim,
    /// A quota bucket's holder counter (`RL.SLIDING <key>|holders`), sent with each claim.
    Holders,
}

const OPS: [(RedisOp, &str); 6] = [
    (RedisOp::Check, "check"),
    (RedisOp::Multi, "multi"),
    (RedisOp::Script, "script"),
    (RedisOp::Return, "return"),
    (RedisOp::Claim, "claim"),
    (RedisOp::Holders, "holders"),
];

/// Latency histogram with fixed buckets (seconds).
#[derive(Debug)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

const BUCKETS: [f64; 14] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| s <= *b) {
            self.counts[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in BUCKETS.iter().enumerate() {
            cum += self.counts[i].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cum}");
        }
        let count = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum_ns.load(Relaxed) as f64 / 1e9);
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// Every counter of the service.
#[derive(Debug)]
pub struct Metrics {
    rules: RwLock<HashMap<StatKey, Arc<RuleStats>>>,
    /// Stats keys made at request time (detailed_metric, value_to_metric, overrides).
    dynamic: AtomicU64,
    dynamic_cap: u64,
    pub dynamic_dropped: AtomicU64,
    pub total_requests: AtomicU64,
    pub json_requests: AtomicU64,
    pub redis_error: AtomicU64,
    pub service_error: AtomicU64,
    pub invalid_argument: AtomicU64,
    pub config_load_success: AtomicU64,
    pub config_load_error: AtomicU64,
    pub global_shadow_mode: AtomicU64,
    pub response_time: Histogram,
    redis_calls: [AtomicU64; OPS.len()],
    pub redis_latency: Histogram,
    pub redis_failures: AtomicU64,
    pub breaker_opens: AtomicU64,
    pub breaker_rejects: AtomicU64,
    /// Redis calls cut short by the request's deadline (`grpc-timeout` less the margin).
    pub deadline_exceeded: AtomicU64,
    /// Requests Redis refused as invalid (`ERR`) while it has the module: the service's bugs.
    pub redis_invalid_requests: AtomicU64,
    pub cluster_compensations: AtomicU64,
    pub failure_open: AtomicU64,
    pub failure_closed: AtomicU64,
    pub failure_error: AtomicU64,
    pub failure_local_admits: AtomicU64,
    pub failure_local_denials: AtomicU64,
}

impl Metrics {
    /// `dynamic_cap`: the most stats keys made at request time; past it a request counts into
    /// its rule's own key (and `stats_keys_dropped` counts it), so per-IP detailed metrics
    /// cannot grow memory without bound.
    pub fn new(dynamic_cap: u64) -> Metrics {
        Metrics {
            rules: RwLock::new(HashMap::new()),
            dynamic: AtomicU64::new(0),
            dynamic_cap,
            dynamic_dropped: AtomicU64::new(0),
            total_requests: AtomicU64::new(0),
            json_requests: AtomicU64::new(0),
            redis_error: AtomicU64::new(0),
            service_error: AtomicU64::new(0),
            invalid_argument: AtomicU64::new(0),
            config_load_success: AtomicU64::new(0),
            config_load_error: AtomicU64::new(0),
            global_shadow_mode: AtomicU64::new(0),
            response_time: Histogram::default(),
            redis_calls: std::array::from_fn(|_| AtomicU64::new(0)),
            redis_latency: Histogram::default(),
            redis_failures: AtomicU64::new(0),
            breaker_opens: AtomicU64::new(0),
            breaker_rejects: AtomicU64::new(0),
            deadline_exceeded: AtomicU64::new(0),
            redis_invalid_requests: AtomicU64::new(0),
            cluster_compensations: AtomicU64::new(0),
            failure_open: AtomicU64::new(0),
            failure_closed: AtomicU64::new(0),
            failure_error: AtomicU64::new(0),
            failure_local_admits: AtomicU64::new(0),
            failure_local_denials: AtomicU64::new(0),
        }
    }

    /// The counters of `key`, made on first use. `dynamic`: a key made at request time (bounded
    /// by the cap: `None` past it).
    pub fn try_rule_stats(&self, key: &StatKey, dynamic: bool) -> Option<Arc<RuleStats>> {
        if let Some(s) = self.rules.read().unwrap_or_else(|e| e.into_inner()).get(key) {
            return Some(s.clone());
        }
        let mut map = self.rules.write().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(key) {
            return Some(s.clone());
        }
        if dynamic {
            if self.dynamic.load(Relaxed) >= self.dynamic_cap {
                self.dynamic_dropped.fetch_add(1, Relaxed);
                return None;
            }
            self.dynamic.fetch_add(1, Relaxed);
        }
        let s = Arc::new(RuleStats::new(key.clone()));
        map.insert(key.clone(), s.clone());
        Some(s)
    }

    /// The counters of a configured rule's own key (never refused).
    pub fn rule_stats(&self, key: &StatKey) -> Arc<RuleStats> {
        self.try_rule_stats(key, false).expect("only request-time keys are capped")
    }

    pub fn redis_call(&self, op: RedisOp, n: u64) {
        let i = OPS.iter().position(|(o, _)| *o == op).expect("every op is listed");
        self.redis_calls[i].fetch_add(n, Relaxed);
    }

    /// Redis commands sent so far (all kinds).
    pub fn redis_calls_total(&self) -> u64 {
        self.redis_calls.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self, extra: &[(&str, &str, u64)]) -> String {
        let mut out = String::new();
        let rules: Vec<Arc<RuleStats>> = {
            let map = self.rules.read().unwrap_or_else(|e| e.into_inner());
            let mut v: Vec<_> = map.values().cloned().collect();
            v.sort_by(|a, b| (&a.key.domain, &a.key.components).cmp(&(&b.key.domain, &b.key.components)));
            v
        };
        type Pick = fn(&RuleStats) -> u64;
        let stats: [(&str, &str, Pick); 5] = [
            ("total_hits", "Hits of the rule (hits_addend counted)", |s| s.total_hits.load(Relaxed)),
            ("over_limit", "Hits over the limit", |s| s.over_limit.load(Relaxed)),
            ("near_limit", "Hits within the limit but over NEAR_LIMIT_RATIO of it", |s| s.near_limit.load(Relaxed)),
            ("within_limit", "Hits within the limit", |s| s.within_limit.load(Relaxed)),
            ("shadow_mode", "Hits over the limit let through by shadow mode", |s| s.shadow_mode.load(Relaxed)),
        ];
        for (stat, help, pick) in stats {
            let name = format!("ratelimit_service_rate_limit_{stat}");
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter");
            for r in &rules {
                let _ = writeln!(out, "{name}{{{}}} {}", rule_labels(&r.key), pick(r));
            }
        }
        let counters: [(&str, &str, &str, u64); 6] = [
            (
                "ratelimit_service_config_load_success",
                "Configurations loaded",
                "",
                self.config_load_success.load(Relaxed),
            ),
            (
                "ratelimit_service_config_load_error",
                "Configurations refused (the last good one keeps serving)",
                "",
                self.config_load_error.load(Relaxed),
            ),
            (
                "ratelimit_service_total_requests",
                "ShouldRateLimit calls (gRPC and /json)",
                "grpc_method=\"ShouldRateLimit\"",
                self.total_requests.load(Relaxed),
            ),
            (
                "ratelimit_service_global_shadow_mode",
                "Refusals overridden by SHADOW_MODE",
                "",
                self.global_shadow_mode.load(Relaxed),
            ),
            (
                "ratelimit_service_stats_keys_dropped",
                "Request-time stats keys refused past the cap",
                "",
                self.dynamic_dropped.load(Relaxed),
            ),
            (
                "ratelimit_service_cluster_compensations",
                "Redis Cluster commits undone with RL.RETURN after another slot refused",
                "",
                self.cluster_compensations.load(Relaxed),
            ),
        ];
        for (name, help, labels, v) in counters {
            let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter\n{name}{braces} {v}");
        }
        let name = "ratelimit_service_should_rate_limit_error";
        let _ = writeln!(out, "# HELP {name} ShouldRateLimit calls answered with an error.\n# TYPE {name} counter");
        for (t, v) in [
            ("redis_error", self.redis_error.load(Relaxed)),
            ("service_error", self.service_error.load(Relaxed)),
            ("invalid_argument", self.invalid_argument.load(Relaxed)),
        ] {
            let _ = writeln!(out, "{name}{{err_type=\"{t}\"}} {v}");
        }
        let name = "ratelimit_service_response_time_seconds";
        let _ = writeln!(out, "# HELP {name} ShouldRateLimit latency in the service.\n# TYPE {name} histogram");
        self.response_time.write(&mut out, name, "grpc_method=\"ShouldRateLimit\"");

        let name = "ratelimit_service_redis_calls";
        let _ = writeln!(out, "# HELP {name} Redis commands sent, by kind.\n# TYPE {name} counter");
        for (i, (_, op)) in OPS.iter().enumerate() {
            let _ = writeln!(out, "{name}{{command=\"{op}\"}} {}", self.redis_calls[i].load(Relaxed));
        }
        let name = "ratelimit_service_redis_latency_seconds";
        let _ = writeln!(out, "# HELP {name} Redis round trips as the service sees them.\n# TYPE {name} histogram");
        self.redis_latency.write(&mut out, name, "");
        let name = "ratelimit_service_failure_policy";
        let _ = writeln!(
            out,
            "# HELP {name} Requests decided by a failure policy because Redis could not answer.\n# TYPE {name} counter"
        );
        for (p, v) in [
            ("error", self.failure_error.load(Relaxed)),
            ("open", self.failure_open.load(Relaxed)),
            ("closed", self.failure_closed.load(Relaxed)),
            ("local_admit", self.failure_local_admits.load(Relaxed)),
            ("local_deny", self.failure_local_denials.load(Relaxed)),
        ] {
            let _ = writeln!(out, "{name}{{decision=\"{p}\"}} {v}");
        }
        for (name, help, v) in [
            (
                "ratelimit_service_redis_failures",
                "Redis calls that failed or timed out",
                self.redis_failures.load(Relaxed),
            ),
            (
                "ratelimit_service_breaker_opens",
                "Times the Redis circuit breaker opened",
                self.breaker_opens.load(Relaxed),
            ),
            (
                "ratelimit_service_breaker_rejects",
                "Requests not sent to Redis because the breaker was open",
                self.breaker_rejects.load(Relaxed),
            ),
            (
                "ratelimit_service_redis_deadline_exceeded",
                "Redis calls cut short by the caller's deadline (grpc-timeout less DEADLINE_MARGIN)",
                self.deadline_exceeded.load(Relaxed),
            ),
            (
                "ratelimit_service_redis_invalid_requests",
                "Requests Redis refused as invalid while it has the module (a bug of the service: the log says more)",
                self.redis_invalid_requests.load(Relaxed),
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter\n{name} {v}");
        }
        for (name, help, v) in extra {
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} gauge\n{name} {v}");
        }
        out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn rule_labels(k: &StatKey) -> String {
    let mut s = format!("domain=\"{}\"", escape(&k.domain));
    for (i, c) in k.components.iter().enumerate() {
        let _ = write!(s, ",key{}=\"{}\"", i + 1, escape(&sanitize(c)));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitizes_like_envoyproxy() {
        assert_eq!(sanitize("remote_address_50.0.0.5"), "remote_address_50_0_0_5");
        assert_eq!(sanitize("a:b|c.d"), "a_b_c.d");
        assert_eq!(sanitize("v1.2.3"), "v1.2.3");
        assert_eq!(sanitize("1234.1.1.1"), "1234_1_1_1");
    }

    #[test]
    fn dynamic_keys_are_capped() {
        let m = Metrics::new(1);
        let a = StatKey::new("d".into(), vec!["k_1".into()]);
        let b = StatKey::new("d".into(), vec!["k_2".into()]);
        assert!(m.try_rule_stats(&a, true).is_some());
        assert!(m.try_rule_stats(&a, true).is_some());
        assert!(m.try_rule_stats(&b, true).is_none());
        assert_eq!(m.dynamic_dropped.load(Relaxed), 1);
        let text = m.render(&[]);
        assert!(text.contains("ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"k_1\"} 0"), "{text}");
    }
}
