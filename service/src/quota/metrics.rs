//! The quota service's counters, rendered into `/metrics` (`ratelimit_service_quota_…`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters (and the open streams) of the quota service.
#[derive(Debug, Default)]
pub struct QuotaMetrics {
    pub streams: AtomicU64,
    pub streams_total: AtomicU64,
    pub reports: AtomicU64,
    pub usages: AtomicU64,
    pub buckets_refused: AtomicU64,
    pub unknown_buckets: AtomicU64,
    pub ambiguous_buckets: AtomicU64,
    pub invalid_buckets: AtomicU64,
    pub abandons: AtomicU64,
    pub lease_assignments: AtomicU64,
    pub deny_assignments: AtomicU64,
    pub allow_assignments: AtomicU64,
    pub local_assignments: AtomicU64,
    pub static_assignments: AtomicU64,
    pub units_claimed: AtomicU64,
    pub units_granted: AtomicU64,
    pub units_returned: AtomicU64,
    pub claims_failed: AtomicU64,
    pub holder_counts_failed: AtomicU64,
    pub admitted: AtomicU64,
    pub denied: AtomicU64,
}

pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

impl QuotaMetrics {
    /// Prometheus text; `buckets` is the tracked buckets now.
    pub fn render(&self, buckets: u64) -> String {
        let g = |c: &AtomicU64| c.load(Relaxed);
        let rows: [(&str, &str, &str, &str, u64); 22] = [
            ("streams", "gauge", "", "Quota streams open (one per Envoy and domain)", g(&self.streams)),
            ("streams_total", "counter", "", "Quota streams opened", g(&self.streams_total)),
            ("reports", "counter", "", "Usage reports received", g(&self.reports)),
            ("usages", "counter", "", "Bucket usages received in reports", g(&self.usages)),
            ("buckets", "gauge", "", "Buckets tracked (all streams)", buckets),
            (
                "buckets_refused",
                "counter",
                "",
                "Buckets not tracked: QUOTA_MAX_BUCKETS reached",
                g(&self.buckets_refused),
            ),
            ("unknown_buckets", "counter", "", "Buckets no rule matches", g(&self.unknown_buckets)),
            (
                "ambiguous_buckets",
                "counter",
                "",
                "Buckets whose entries match rules in two orders",
                g(&self.ambiguous_buckets),
            ),
            ("invalid_buckets", "counter", "", "Bucket ids too large or with an empty key", g(&self.invalid_buckets)),
            ("abandons", "counter", "", "Idle buckets abandoned", g(&self.abandons)),
            ("assignments", "counter", "kind=\"lease\"", "Assignments pushed", g(&self.lease_assignments)),
            ("assignments", "counter", "kind=\"deny\"", "Assignments pushed", g(&self.deny_assignments)),
            ("assignments", "counter", "kind=\"allow\"", "Assignments pushed", g(&self.allow_assignments)),
            ("assignments", "counter", "kind=\"local\"", "Assignments pushed", g(&self.local_assignments)),
            ("assignments", "counter", "kind=\"static\"", "Assignments pushed", g(&self.static_assignments)),
            ("units_claimed", "counter", "", "Units asked of Redis for leases", g(&self.units_claimed)),
            ("units_granted", "counter", "", "Units Redis granted to leases", g(&self.units_granted)),
            ("units_returned", "counter", "", "Units given back (RL.RETURN)", g(&self.units_returned)),
            (
                "claims_failed",
                "counter",
                "",
                "Claims Redis did not answer (the failure mode decided)",
                g(&self.claims_failed),
            ),
            (
                "holder_counts_failed",
                "counter",
                "",
                "Holder counts Redis did not answer (leases split by this replica's streams)",
                g(&self.holder_counts_failed),
            ),
            ("admitted", "counter", "", "Requests Envoy reported admitted", g(&self.admitted)),
            ("denied", "counter", "", "Requests Envoy reported denied", g(&self.denied)),
        ];
        let mut out = String::new();
        let mut last = "";
        for (name, kind, labels, help, v) in rows {
            let full = format!("ratelimit_service_quota_{name}");
            if name != last {
                let _ = writeln!(out, "# HELP {full} {help}.\n# TYPE {full} {kind}");
                last = name;
            }
            if labels.is_empty() {
                let _ = writeln!(out, "{full} {v}");
            } else {
                let _ = writeln!(out, "{full}{{{labels}}} {v}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_counter_once_with_its_type() {
        let m = QuotaMetrics::default();
        add(&m.lease_assignments, 3);
        add(&m.denied, 2);
        let text = m.render(7);
        assert!(text.contains("ratelimit_service_quota_buckets 7\n"), "{text}");
        assert!(text.contains("ratelimit_service_quota_assignments{kind=\"lease\"} 3\n"), "{text}");
        assert!(text.contains("ratelimit_service_quota_denied 2\n"), "{text}");
        assert_eq!(text.matches("# TYPE ratelimit_service_quota_assignments counter").count(), 1);
        assert_eq!(text.matches("# TYPE").count(), 18);
    }
}
