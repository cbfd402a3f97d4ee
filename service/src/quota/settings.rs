//! The quota service's settings (flags and environment variables, part of the service's
//! [`Settings`](crate::settings::Settings)).

use std::time::Duration;

use redis_ratelimit_client::spec::parse_duration;
use redis_ratelimit_client::Nanos;

use super::buckets::KeySettings;
use super::plan::Params;

/// What an unknown bucket (no rule) gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnknownBuckets {
    Allow,
    Deny,
}

fn unknown_buckets(s: &str) -> Result<UnknownBuckets, String> {
    match s.to_ascii_lowercase().as_str() {
        "allow" => Ok(UnknownBuckets::Allow),
        "deny" => Ok(UnknownBuckets::Deny),
        _ => Err(format!("invalid QUOTA_UNKNOWN_BUCKETS '{s}': expected allow or deny")),
    }
}

/// Flags and environment variables of the quota service (docs/quota-service.md).
#[derive(clap::Args, Clone, Debug)]
pub struct QuotaFlags {
    /// The life (assignment_time_to_live) of a lease on a limit of at least one unit per
    /// QUOTA_LEASE: whole seconds from 1s to 60s (Envoy 1.40 counts whole seconds).
    #[arg(long, env = "QUOTA_LEASE", default_value = "1s", value_parser = parse_duration)]
    pub quota_lease: Duration,
    /// How often such a lease is replaced by a new one (shorter than QUOTA_LEASE).
    #[arg(long, env = "QUOTA_REFRESH", default_value = "500ms", value_parser = parse_duration)]
    pub quota_refresh: Duration,
    /// Buckets tracked by this replica, all streams together; a bucket past it gets its
    /// failure mode's action.
    #[arg(long, env = "QUOTA_MAX_BUCKETS", default_value_t = 100_000)]
    pub quota_max_buckets: usize,
    /// `allow` or `deny`: buckets no rule matches.
    #[arg(long, env = "QUOTA_UNKNOWN_BUCKETS", default_value = "allow", value_parser = unknown_buckets)]
    pub quota_unknown_buckets: UnknownBuckets,
    /// The TTL of actions that need no lease (unknown, unlimited, shadow-mode buckets).
    #[arg(long, env = "QUOTA_STATIC_TTL", default_value = "60s", value_parser = parse_duration)]
    pub quota_static_ttl: Duration,
    /// The largest usage report accepted; a larger one ends the stream (RESOURCE_EXHAUSTED).
    #[arg(long, env = "QUOTA_MAX_REPORT_BYTES", default_value_t = 16 << 20)]
    pub quota_max_report_bytes: usize,
}

/// The quota service's settings, checked.
#[derive(Clone, Debug)]
pub struct QuotaSettings {
    pub params: Params,
    pub max_buckets: usize,
    pub unknown: UnknownBuckets,
    pub static_ttl: Nanos,
    pub max_report_bytes: usize,
    pub keys: KeySettings,
    /// `INSTANCES` (service replicas): the local failure share divides by it.
    pub instances: u64,
}

impl QuotaSettings {
    /// The deadline of each Redis call (`REDIS_TIMEOUT`: [`Params::timeout`]).
    pub fn timeout(&self) -> Duration {
        Duration::from(self.params.timeout)
    }
}

impl QuotaFlags {
    pub fn settings(&self, keys: KeySettings, instances: u64, timeout: Duration) -> Result<QuotaSettings, String> {
        let lease = Nanos::from(self.quota_lease);
        // A push must reach Envoy, and a report be built and arrive, within a lease.
        let params =
            Params { lease, refresh: Nanos::from(self.quota_refresh), margin: lease, timeout: Nanos::from(timeout) };
        params.validate()?;
        if self.quota_static_ttl < Duration::from_secs(1) {
            return Err("QUOTA_STATIC_TTL must be at least 1s".into());
        }
        Ok(QuotaSettings {
            params,
            max_buckets: self.quota_max_buckets,
            unknown: self.quota_unknown_buckets,
            static_ttl: Nanos::from(self.quota_static_ttl),
            max_report_bytes: self.quota_max_report_bytes.max(4096),
            keys,
            instances: instances.max(1),
        })
    }
}
