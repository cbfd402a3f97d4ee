//! Settings: envoyproxy/ratelimit's environment variables (same names, same meaning where this
//! service has the feature), each also a command-line flag, plus this service's own.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use redis_ratelimit_client::breaker::BreakerConfig;
use redis_ratelimit_client::spec::parse_duration;
use redis_ratelimit_client::Nanos;

use crate::backend::{BackendConfig, Target};
use crate::config::FailureMode;
use crate::headers::HeaderMode;
use crate::service::ServiceSettings;

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s)
}

/// A duration that may be zero (`0`, `0s`): a period that can be switched off.
fn duration_or_zero(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    if !digits.is_empty() && digits.bytes().all(|b| b == b'0') {
        // Zero: only the unit is checked, by the parser that names the valid ones.
        return parse_duration(&format!("1{unit}"))
            .map(|_| Duration::ZERO)
            .map_err(|_| format!("invalid duration '{t}': unknown unit '{unit}'"));
    }
    parse_duration(s)
}

fn bool_flag(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" | "" => Ok(false),
        _ => Err(format!("invalid boolean '{s}'")),
    }
}

/// Every setting, from flags or the environment (flags win).
#[derive(Parser, Clone, Debug)]
#[command(
    name = "redis-ratelimit-service",
    version,
    args_override_self = true,
    about = "Envoy's rate limit service backed by the redis-ratelimit module",
    after_help = "At SIGTERM / SIGINT /healthcheck answers 500 and grpc.health.v1 (services \"ratelimit\" and \"\") \
                  NOT_SERVING at once; requests are served for DRAIN_PERIOD (a second signal ends it), then the \
                  servers stop gracefully (at most SHUTDOWN_TIMEOUT), held leases are given back and the process exits 0. docs/service.md is \
                  the manual."
)]
pub struct Settings {
    /// gRPC listen host.
    #[arg(long, env = "GRPC_HOST", default_value = "0.0.0.0")]
    pub grpc_host: String,
    /// gRPC listen port (0: any free port, logged).
    #[arg(long, env = "GRPC_PORT", default_value_t = 8081)]
    pub grpc_port: u16,
    /// HTTP listen host (/json, /healthcheck, /metrics, /rlconfig).
    #[arg(long = "http-host", env = "HOST", default_value = "0.0.0.0")]
    pub host: String,
    /// HTTP listen port.
    #[arg(long = "http-port", env = "PORT", default_value_t = 8080)]
    pub port: u16,

    /// A configuration file or directory (every *.yaml / *.yml in it). Default:
    /// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, as envoyproxy/ratelimit.
    #[arg(long, env = "CONFIG_PATH")]
    pub config: Option<PathBuf>,
    #[arg(long, env = "RUNTIME_ROOT", default_value = "/srv/runtime_data/current")]
    pub runtime_root: PathBuf,
    #[arg(long, env = "RUNTIME_SUBDIRECTORY", default_value = "")]
    pub runtime_subdirectory: String,
    #[arg(long, env = "RUNTIME_APPDIRECTORY", default_value = "config")]
    pub runtime_appdirectory: String,
    /// Skip files whose name starts with a dot.
    #[arg(long, env = "RUNTIME_IGNOREDOTFILES", default_value = "false", value_parser = bool_flag, action = clap::ArgAction::Set)]
    pub runtime_ignore_dotfiles: bool,
    /// How often the configuration is checked for changes (the files' contents are compared,
    /// so symlink swaps and in-place edits both reload).
    #[arg(long, env = "CONFIG_POLL_INTERVAL", default_value = "1s", value_parser = duration)]
    pub config_poll_interval: Duration,
    /// Several files may define one domain (their descriptors are merged).
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", default_value = "false", value_parser = bool_flag, action = clap::ArgAction::Set)]
    pub merge_domain_config: bool,
    /// A reload may remove every domain (an emptied configuration directory). Off: such a
    /// reload is refused (logged at WARN, counted in config_load_error) and the last
    /// configuration keeps serving.
    #[arg(long, env = "ALLOW_EMPTY_CONFIG", default_value = "false", value_parser = bool_flag, action = clap::ArgAction::Set)]
    pub allow_empty_config: bool,
    /// /healthcheck (and grpc.health.v1) fails until a configuration with at least one domain
    /// is loaded.
    #[arg(long, env = "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", default_value = "false", value_parser = bool_flag, action = clap::ArgAction::Set)]
    pub healthy_with_at_least_one_config_loaded: bool,
    /// After SIGTERM / SIGINT: how long requests are still served while /healthcheck answers
    /// 500 and grpc.health.v1 NOT_SERVING, so that load balancers stop sending before the
    /// servers stop (keep it below Kubernetes' terminationGracePeriodSeconds). A second signal
    /// cuts it short. 0s: stop at once.
    #[arg(long, env = "DRAIN_PERIOD", default_value = "0s", value_parser = duration_or_zero)]
    pub drain_period: Duration,
    /// After the drain period: the longest the graceful stop waits for requests in flight;
    /// then the connections still open are closed, held leases are given back and the process
    /// exits 0 (before Kubernetes' SIGKILL, which would lose the leases).
    #[arg(long, env = "SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = duration_or_zero)]
    pub shutdown_timeout: Duration,

    /// `single` (one server) or `cluster`.
    #[arg(long, env = "REDIS_TYPE", default_value = "single")]
    pub redis_type: String,
    /// `host:port`, a unix socket path, or redis:// / unix:// URLs; for a cluster a comma
    /// separated list of nodes.
    #[arg(long, env = "REDIS_URL", default_value = "127.0.0.1:6379")]
    pub redis_url: String,
    /// `tcp` or `unix` (for a bare path in REDIS_URL).
    #[arg(long, env = "REDIS_SOCKET_TYPE", default_value = "tcp")]
    pub redis_socket_type: String,
    /// `password` or `username:password`.
    #[arg(long, env = "REDIS_AUTH", default_value = "", hide_env_values = true)]
    pub redis_auth: String,
    /// Multiplexed connections to a single server.
    #[arg(long, env = "REDIS_POOL_SIZE", default_value_t = 4)]
    pub redis_pool_size: usize,
    /// Per Redis call. (envoyproxy/ratelimit defaults to 10s; Envoy itself gives up after 20 ms.)
    #[arg(long, env = "REDIS_TIMEOUT", default_value = "100ms", value_parser = duration)]
    pub redis_timeout: Duration,
    /// Consecutive failures that open the circuit breaker.
    #[arg(long, env = "REDIS_BREAKER_FAILURES", default_value_t = 5)]
    pub redis_breaker_failures: u32,
    /// How long the breaker stays open before one call probes Redis.
    #[arg(long, env = "REDIS_BREAKER_COOL_DOWN", default_value = "1s", value_parser = duration)]
    pub redis_breaker_cool_down: Duration,
    /// Redis Cluster: `none` (keys spread over slots; the check-then-commit protocol across
    /// slots) or `domain` (every key of a domain in one slot: one RL.MULTI always).
    #[arg(long, env = "REDIS_CLUSTER_HASH_TAG", default_value = "none")]
    pub redis_cluster_hash_tag: String,
    /// Benchmarks only: send envoyproxy/ratelimit's Redis commands (INCRBY + EXPIRE per
    /// descriptor) instead of the module's, as the baseline of `make bench-service`.
    #[arg(long, env = "BENCH_BASELINE_ENVOYPROXY", default_value = "false", value_parser = bool_flag, action = clap::ArgAction::Set, hide = true)]
    pub bench_baseline_envoyproxy: bool,
    /// Serve descriptors from local reservations (leases) unless their rule says `lease: false`
    /// (fixed, sliding, gcra and token_bucket rules; docs/service.md, "Leases").
    #[arg(long, env = "LEASES", default_value = "false", value_parser = bool_flag, action = clap::ArgAction::Set)]
    pub leases: bool,
    /// The lease L: units claimed are served for at most this long (the bound grows by r·L).
    #[arg(long, env = "LEASE_LENGTH", default_value = "1s", value_parser = duration)]
    pub lease_length: Duration,
    /// A value of a leased rule leases once this instance has seen it this many times within
    /// LEASE_HOT_WINDOW (and until a window sees fewer than half); before, it is checked per
    /// request with the request's other descriptors in one command. 1: every value leases from
    /// its first request.
    #[arg(long, env = "LEASE_HOT_REQUESTS", default_value_t = 20)]
    pub lease_hot_requests: u32,
    #[arg(long, env = "LEASE_HOT_WINDOW", default_value = "1s", value_parser = duration)]
    pub lease_hot_window: Duration,
    /// Prefix of every Redis key.
    #[arg(long, env = "CACHE_KEY_PREFIX", default_value = "rls:")]
    pub cache_key_prefix: String,

    /// Near-limit threshold (0-1) for the near_limit stat.
    #[arg(long, env = "NEAR_LIMIT_RATIO", default_value_t = 0.8)]
    pub near_limit_ratio: f64,
    /// Answer OK whatever the limits say (counted in ratelimit_service_global_shadow_mode).
    #[arg(long, env = "SHADOW_MODE", default_value = "false", value_parser = bool_flag, action = clap::ArgAction::Set)]
    pub shadow_mode: bool,
    /// What Redis being unavailable means, for domains that set no failure_mode: `error` (the
    /// call fails; Envoy's failure_mode_deny decides, as with envoyproxy/ratelimit), `open`,
    /// `closed`, `local`.
    #[arg(long, env = "FAILURE_MODE", default_value = "error")]
    pub failure_mode: String,
    /// Service instances sharing the limits: the `local` failure mode admits limit ÷ this.
    #[arg(long, env = "INSTANCES", default_value_t = 1)]
    pub instances: u64,
    /// A gRPC call is answered this long before the deadline its caller sent (`grpc-timeout`;
    /// Envoy sends its filter's `timeout`), by the domain's failure mode if Redis has not
    /// answered by then: the time the answer needs to get back through Envoy.
    #[arg(long, env = "DEADLINE_MARGIN", default_value = "10ms", value_parser = duration_or_zero)]
    pub deadline_margin: Duration,

    /// Response headers: `draft` (RateLimit-Policy and RateLimit, IETF draft -08 onwards),
    /// `legacy` (RateLimit-Limit, -Remaining, -Reset) or `off`. Retry-After when over the limit.
    #[arg(long, env = "RESPONSE_HEADERS", default_value = "draft")]
    pub response_headers: String,
    /// envoyproxy/ratelimit's switch for the legacy headers (implies RESPONSE_HEADERS=legacy).
    #[arg(long, env = "LIMIT_RESPONSE_HEADERS_ENABLED", default_value = "false", value_parser = bool_flag, action = clap::ArgAction::Set)]
    pub limit_response_headers_enabled: bool,
    #[arg(long, env = "LIMIT_LIMIT_HEADER", default_value = "RateLimit-Limit")]
    pub limit_limit_header: String,
    #[arg(long, env = "LIMIT_REMAINING_HEADER", default_value = "RateLimit-Remaining")]
    pub limit_remaining_header: String,
    #[arg(long, env = "LIMIT_RESET_HEADER", default_value = "RateLimit-Reset")]
    pub limit_reset_header: String,

    /// Most request-time stats keys (detailed_metric, value_to_metric, overrides).
    #[arg(long, env = "STATS_MAX_KEYS", default_value_t = 10_000)]
    pub stats_max_keys: u64,
    /// `debug`, `info`, `warn`, `error` (or a tracing filter).
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// `text` or `json`.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    pub log_format: String,
    /// Threads serving requests (tokio workers). 0: one per CPU. Several instances on one host
    /// share its CPUs: give each fewer (docs/service.md, "Threads"), as GOMAXPROCS does for
    /// envoyproxy/ratelimit.
    #[arg(long, env = "WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,
}

impl Settings {
    /// Where the configuration is read from.
    pub fn config_path(&self) -> PathBuf {
        match &self.config {
            Some(p) => p.clone(),
            None => {
                let mut p = self.runtime_root.clone();
                if !self.runtime_subdirectory.is_empty() {
                    p.push(&self.runtime_subdirectory);
                }
                p.push(&self.runtime_appdirectory);
                p
            }
        }
    }

    fn url(&self, node: &str) -> Result<String, String> {
        let node = node.trim();
        let base = if node.contains("://") {
            node.to_string()
        } else if self.redis_socket_type.eq_ignore_ascii_case("unix") || node.starts_with('/') {
            format!("unix://{node}")
        } else {
            format!("redis://{node}")
        };
        if self.redis_auth.is_empty() || base.starts_with("unix") || base.contains('@') {
            return Ok(base);
        }
        let (user, pass) = match self.redis_auth.split_once(':') {
            Some((u, p)) => (u.to_string(), p.to_string()),
            None => (String::new(), self.redis_auth.clone()),
        };
        let rest = base.split_once("://").map(|x| x.1).unwrap_or(&base);
        let scheme = base.split_once("://").map(|x| x.0).unwrap_or("redis");
        Ok(format!("{scheme}://{}:{}@{rest}", enc(&user), enc(&pass)))
    }

    pub fn backend(&self) -> Result<BackendConfig, String> {
        let target = match self.redis_type.to_ascii_lowercase().as_str() {
            "single" => Target::Single(self.url(&self.redis_url)?),
            "cluster" => Target::Cluster(
                self.redis_url
                    .split(',')
                    .filter(|s| !s.trim().is_empty())
                    .map(|n| self.url(n))
                    .collect::<Result<_, _>>()?,
            ),
            "sentinel" => return Err("REDIS_TYPE=sentinel is not supported: use single or cluster".into()),
            other => return Err(format!("invalid REDIS_TYPE '{other}': expected single or cluster")),
        };
        Ok(BackendConfig {
            target,
            pool_size: self.redis_pool_size.max(1),
            timeout: self.redis_timeout,
            breaker: BreakerConfig {
                failures: self.redis_breaker_failures.max(1),
                cool_down: Nanos::from(self.redis_breaker_cool_down),
            },
            baseline: self.bench_baseline_envoyproxy,
        })
    }

    pub fn lease_settings(&self) -> crate::leases::LeaseSettings {
        crate::leases::LeaseSettings {
            default_on: self.leases,
            lease: self.lease_length,
            instances: self.instances.max(1),
            timeout: self.redis_timeout,
            breaker_failures: self.redis_breaker_failures.max(1),
            breaker_cool_down: self.redis_breaker_cool_down,
            hot_requests: self.lease_hot_requests.max(1),
            hot_window: self.lease_hot_window,
        }
    }

    pub fn service(&self) -> Result<ServiceSettings, String> {
        let headers = if self.limit_response_headers_enabled {
            "legacy".to_string()
        } else {
            self.response_headers.to_ascii_lowercase()
        };
        let headers = match headers.as_str() {
            "draft" => HeaderMode::Draft,
            "off" | "none" => HeaderMode::Off,
            "legacy" => HeaderMode::Legacy {
                limit: self.limit_limit_header.clone(),
                remaining: self.limit_remaining_header.clone(),
                reset: self.limit_reset_header.clone(),
            },
            other => return Err(format!("invalid RESPONSE_HEADERS '{other}': expected draft, legacy or off")),
        };
        let hash_tag_domain = match self.redis_cluster_hash_tag.to_ascii_lowercase().as_str() {
            "none" | "" => false,
            "domain" => true,
            other => return Err(format!("invalid REDIS_CLUSTER_HASH_TAG '{other}': expected none or domain")),
        };
        if !(0.0..=1.0).contains(&self.near_limit_ratio) {
            return Err(format!("invalid NEAR_LIMIT_RATIO {}: expected 0 to 1", self.near_limit_ratio));
        }
        Ok(ServiceSettings {
            near_limit_ratio: self.near_limit_ratio,
            global_shadow_mode: self.shadow_mode,
            headers,
            key_prefix: self.cache_key_prefix.clone(),
            hash_tag_domain,
            failure_mode: FailureMode::parse(&self.failure_mode)?,
            instances: self.instances.max(1),
            deadline_margin: self.deadline_margin,
        })
    }
}

/// Percent-encodes a URL userinfo part.
fn enc(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_as_envoyproxy_takes_them() {
        let s = Settings::parse_from(["x", "--redis-url", "10.0.0.1:6379", "--redis-auth", "u:p@ss"]);
        assert_eq!(s.url(&s.redis_url).unwrap(), "redis://u:p%40ss@10.0.0.1:6379");
        let s = Settings::parse_from(["x", "--redis-url", "/tmp/r.sock", "--redis-socket-type", "unix"]);
        assert_eq!(s.url(&s.redis_url).unwrap(), "unix:///tmp/r.sock");
        let s = Settings::parse_from(["x", "--redis-type", "cluster", "--redis-url", "h1:7001,h2:7002"]);
        match s.backend().unwrap().target {
            Target::Cluster(n) => assert_eq!(n, ["redis://h1:7001", "redis://h2:7002"]),
            t => panic!("{t:?}"),
        }
        assert!(Settings::parse_from(["x", "--redis-type", "sentinel"]).backend().is_err());
    }

    #[test]
    fn the_drain_period_is_zero_by_default_and_takes_zero_or_a_duration() {
        assert_eq!(Settings::parse_from(["x"]).drain_period, Duration::ZERO);
        assert_eq!(Settings::parse_from(["x", "--drain-period", "5s"]).drain_period, Duration::from_secs(5));
        assert_eq!(Settings::parse_from(["x", "--drain-period", "0"]).drain_period, Duration::ZERO);
        assert_eq!(Settings::parse_from(["x", "--drain-period", "0ms"]).drain_period, Duration::ZERO);
        assert_eq!(Settings::parse_from(["x"]).shutdown_timeout, Duration::from_secs(10));
        assert_eq!(Settings::parse_from(["x", "--shutdown-timeout", "1s"]).shutdown_timeout, Duration::from_secs(1));
        for bad in ["", "-1s", "0x", "5 parsecs", "1.5s"] {
            let e =
                Settings::try_parse_from(["x".to_string(), format!("--drain-period={bad}")]).unwrap_err().to_string();
            assert!(e.contains("--drain-period"), "{bad:?}: {e}");
        }
    }
}
