//! Settings: envoyproxy/ratelimit's environment variables (same names, same meaning where this
//! service has the feature), each also a command-line flag, plus this service's own.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use redis_ratelimit_client::breaker::BreakerConfig;
use redis_ratelimit_client::spec::parse_duration;
use redis_ratelimit_client::{Nanos, TlsConfig};

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
    /// The longest an HTTP client may take to send a request's headers (an idle keep-alive
    /// connection's next request included); then the connection is closed.
    #[arg(long, env = "HTTP_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub http_header_read_timeout: Duration,
    /// HTTP connections open at once; more are closed at once (gRPC has its own listener and
    /// is not counted).
    #[arg(long, env = "HTTP_MAX_CONNECTIONS", default_value_t = 1024)]
    pub http_max_connections: usize,
    /// Concurrent gRPC calls (HTTP/2 streams) per connection.
    #[arg(long, env = "GRPC_MAX_CONCURRENT_STREAMS", default_value_t = 1024)]
    pub grpc_max_concurrent_streams: u32,
    /// The largest `ShouldRateLimit` request (its protobuf message, bytes); a larger one is
    /// answered RESOURCE_EXHAUSTED without being read (4 MiB: gRPC's usual receive limit).
    #[arg(long, env = "GRPC_MAX_MESSAGE_BYTES", default_value_t = 4 << 20)]
    pub grpc_max_message_bytes: usize,

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

    /// `single` (one server), `cluster`, or `sentinel` (REDIS_URL: `<master name>,<sentinel
    /// host:port>,...`).
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
    /// The sentinels' own `password` or `user:password` (REDIS_AUTH is the primary's).
    #[arg(long, env = "REDIS_SENTINEL_AUTH", default_value = "", hide_env_values = true)]
    pub redis_sentinel_auth: String,
    /// Multiplexed connections to a single server.
    #[arg(long, env = "REDIS_POOL_SIZE", default_value_t = 4)]
    pub redis_pool_size: usize,
    /// TLS to Redis (a `rediss://` REDIS_URL asks for it too), verified against the system's
    /// roots plus REDIS_TLS_CACERT.
    #[arg(long, env = "REDIS_TLS", default_value = "false", value_parser = bool_flag, action = clap::ArgAction::Set)]
    pub redis_tls: bool,
    /// A PEM file of CA certificates trusted besides the system's (a private CA).
    #[arg(long, env = "REDIS_TLS_CACERT", default_value = "")]
    pub redis_tls_cacert: String,
    /// A client certificate (PEM) for mTLS, with REDIS_TLS_CLIENT_KEY.
    #[arg(long, env = "REDIS_TLS_CLIENT_CERT", default_value = "")]
    pub redis_tls_client_cert: String,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "REDIS_TLS_CLIENT_KEY", default_value = "", hide_env_values = true)]
    pub redis_tls_client_key: String,
    /// Verify Redis's certificate chain but not that it names the host dialed.
    #[arg(long, env = "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", default_value = "false", value_parser = bool_flag, action = clap::ArgAction::Set)]
    pub redis_tls_skip_hostname_verification: bool,
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

    /// The Rate Limit Quota Service's settings (QUOTA_*, docs/quota-service.md).
    #[command(flatten)]
    pub quota: crate::quota::QuotaFlags,
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

    /// The TLS settings, when TLS is asked for (REDIS_TLS, or a `rediss://` REDIS_URL); as in
    /// envoyproxy/ratelimit the files are read only then. The certificate and key come as a
    /// pair (envoyproxy/ratelimit ignores one without the other: here it is an error).
    fn tls(&self) -> Result<Option<TlsConfig>, String> {
        if !self.redis_tls && !self.redis_url.contains("rediss://") {
            return Ok(None);
        }
        let mut tls = TlsConfig::new().skip_hostname_verification(self.redis_tls_skip_hostname_verification);
        if !self.redis_tls_cacert.is_empty() {
            tls = tls.ca_file(&self.redis_tls_cacert);
        }
        match (self.redis_tls_client_cert.is_empty(), self.redis_tls_client_key.is_empty()) {
            (false, false) => tls = tls.client_cert(&self.redis_tls_client_cert, &self.redis_tls_client_key),
            (true, true) => {}
            (false, true) => return Err("REDIS_TLS_CLIENT_CERT is set without REDIS_TLS_CLIENT_KEY".into()),
            (true, false) => return Err("REDIS_TLS_CLIENT_KEY is set without REDIS_TLS_CLIENT_CERT".into()),
        }
        Ok(Some(tls))
    }

    pub fn backend(&self) -> Result<BackendConfig, String> {
        let target = match self.redis_type.to_ascii_lowercase().as_str() {
            "single" => Target::single(&self.url(&self.redis_url)?),
            "cluster" => {
                let nodes = self
                    .redis_url
                    .split(',')
                    .filter(|s| !s.trim().is_empty())
                    .map(|n| self.url(n))
                    .collect::<Result<Vec<_>, _>>()?;
                if nodes.is_empty() {
                    return Err("REDIS_URL: no cluster nodes".into());
                }
                Target::cluster(&nodes)
            }
            "sentinel" => {
                let mut t = Target::from_type_and_url("sentinel", &self.redis_url).map_err(|e| e.to_string())?;
                if let Some((user, pass)) = auth_pair(&self.redis_auth) {
                    t = t.auth(user, pass);
                }
                if let Some((user, pass)) = auth_pair(&self.redis_sentinel_auth) {
                    t = t.sentinel_auth(user, pass);
                }
                t
            }
            other => return Err(format!("invalid REDIS_TYPE '{other}': expected single, cluster or sentinel")),
        };
        let target = match self.tls()? {
            Some(tls) => target.tls(tls),
            None => target,
        };
        // A connection attempt runs in the background and bounds no request (each request is
        // bounded by REDIS_TIMEOUT): at least 250 ms, so that a TLS handshake on a busy host
        // is not cut short.
        let target = target.connect_timeout(self.redis_timeout.max(Duration::from_millis(250)));
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

/// What an envoyproxy/ratelimit variable this service does not implement does when set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A WARN at start naming it and what this service does instead; the service starts.
    Warn,
    /// The service refuses to start, naming it: starting would enforce other limits than the
    /// operator's, or fail every request while looking healthy.
    Refuse,
}

/// The values of a variable that ask for nothing this service does not do (then the variable is
/// accepted without a word): always the empty value, and
#[derive(Clone, Copy, Debug)]
pub enum Inert {
    /// a false boolean (`false`, `0`, `f`, `no`, `off`; envoyproxy/ratelimit's ParseBool and ours),
    False,
    /// a true boolean (`true`, `1`, `t`, `yes`, `on`),
    True,
    /// one of these (ASCII case ignored).
    OneOf(&'static [&'static str]),
}

impl Inert {
    /// The value to name in a refusal, beside unsetting it.
    fn example(self) -> &'static str {
        match self {
            Inert::False => "false",
            Inert::True => "true",
            Inert::OneOf(set) => set.first().copied().unwrap_or(""),
        }
    }

    fn holds(self, value: &str) -> bool {
        let v = value.trim();
        let one_of = |set: &[&str]| set.iter().any(|s| s.eq_ignore_ascii_case(v));
        v.is_empty()
            || match self {
                Inert::False => one_of(&["false", "0", "f", "no", "off"]),
                Inert::True => one_of(&["true", "1", "t", "yes", "on"]),
                Inert::OneOf(set) => one_of(set),
            }
    }
}

/// One reason why some of envoyproxy/ratelimit's variables are not implemented here.
#[derive(Debug)]
pub struct Unimplemented {
    /// The variables; a trailing `*` stands for any suffix (DogStatsD's per-mogrifier variables).
    pub names: &'static [&'static str],
    pub inert: Inert,
    pub verdict: Verdict,
    /// What this service does instead, or why it cannot start; said in the log line.
    pub why: &'static str,
}

/// Every environment variable of envoyproxy/ratelimit (src/settings/settings.go) that this
/// service does not read, one row per reason; docs/service.md ("Migrating from
/// envoyproxy/ratelimit") has the same rows (a test holds them equal). A feature that lands
/// takes its names out of here.
pub const UNIMPLEMENTED: &[Unimplemented] = &[
    Unimplemented {
        names: &["BACKEND_TYPE"],
        inert: Inert::OneOf(&["redis"]),
        verdict: Verdict::Refuse,
        why: "limits live in Redis with the module only (memcached is not supported)",
    },
    Unimplemented {
        names: &["REDIS_PERSECOND"],
        inert: Inert::False,
        verdict: Verdict::Refuse,
        why: "there is no second Redis for per-second limits: they would be kept in REDIS_URL's Redis, not in \
              REDIS_PERSECOND_URL's",
    },
    Unimplemented {
        names: &["QUOTA_MODE"],
        inert: Inert::False,
        verdict: Verdict::Refuse,
        why: "quota mode is not supported: every limit would refuse requests that quota mode lets through",
    },
    Unimplemented {
        names: &["CONFIG_TYPE"],
        inert: Inert::OneOf(&["FILE"]),
        verdict: Verdict::Refuse,
        why: "the configuration is read from files only (no xDS): the service would serve no limits",
    },
    Unimplemented {
        names: &["GRPC_UDS"],
        inert: Inert::False,
        verdict: Verdict::Refuse,
        why: "gRPC is served on GRPC_HOST:GRPC_PORT only, not on a unix socket: Envoy would reach no service",
    },
    Unimplemented {
        names: &[
            "GRPC_SERVER_USE_TLS",
            "GRPC_SERVER_TLS_CERT",
            "GRPC_SERVER_TLS_KEY",
            "GRPC_CLIENT_TLS_CACERT",
            "GRPC_CLIENT_TLS_SAN",
        ],
        inert: Inert::False,
        verdict: Verdict::Refuse,
        why: "gRPC is served in plaintext only, without client certificates: TLS clients would fail every call and \
              any client could call",
    },
    Unimplemented {
        names: &[
            "REDIS_PERSECOND_SOCKET_TYPE",
            "REDIS_PERSECOND_TYPE",
            "REDIS_PERSECOND_URL",
            "REDIS_PERSECOND_POOL_SIZE",
            "REDIS_PERSECOND_AUTH",
            "REDIS_PERSECOND_TLS",
            "REDIS_PERSECOND_SENTINEL_AUTH",
            "REDIS_PERSECOND_PIPELINE_WINDOW",
            "REDIS_PERSECOND_PIPELINE_LIMIT",
            "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
            "REDIS_PERSECOND_TIMEOUT",
            "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        ],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "used only with REDIS_PERSECOND=true, which is not supported: per-second limits are kept in \
              REDIS_URL's Redis with the others",
    },
    Unimplemented {
        names: &[
            "MEMCACHE_HOST_PORT",
            "MEMCACHE_MAX_IDLE_CONNS",
            "MEMCACHE_SRV",
            "MEMCACHE_SRV_REFRESH",
            "MEMCACHE_TLS",
            "MEMCACHE_TLS_CLIENT_CERT",
            "MEMCACHE_TLS_CLIENT_KEY",
            "MEMCACHE_TLS_CACERT",
            "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
        ],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "used only with BACKEND_TYPE=memcache, which is not supported: limits are kept in Redis",
    },
    Unimplemented {
        names: &[
            "FORCE_START_WITHOUT_INITIAL_CONFIG",
            "CONFIG_GRPC_XDS_NODE_ID",
            "CONFIG_GRPC_XDS_NODE_METADATA",
            "CONFIG_GRPC_XDS_SERVER_URL",
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "CONFIG_GRPC_XDS_SERVER_USE_TLS",
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
            "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
            "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
            "XDS_CLIENT_BACKOFF_JITTER",
            "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        ],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "used only with CONFIG_TYPE=GRPC_XDS_SOTW, which is not supported: the configuration is read from \
              CONFIG_PATH (or RUNTIME_ROOT/...)",
    },
    Unimplemented {
        names: &[
            "USE_STATSD",
            "STATSD_HOST",
            "STATSD_PORT",
            "EXTRA_TAGS",
            "STATS_FLUSH_INTERVAL",
            "USE_DOG_STATSD",
            "USE_DOG_STATSD_MOGRIFIERS",
            "DOG_STATSD_MOGRIFIER_*",
        ],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "StatsD and DogStatsD are not supported: the stats are served to Prometheus at /metrics on the HTTP \
              port",
    },
    Unimplemented {
        names: &[
            "USE_PROMETHEUS",
            "PROMETHEUS_ADDR",
            "PROMETHEUS_PATH",
            "PROMETHEUS_MAPPER_YAML",
            "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
            "DISABLE_STATS",
        ],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "the stats are always kept and served at /metrics on the HTTP port (HOST:PORT), under fixed names",
    },
    Unimplemented {
        names: &["DEBUG_HOST", "DEBUG_PORT"],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "there is no debug listener: /rlconfig and /metrics are served on the HTTP port",
    },
    Unimplemented {
        names: &["GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE"],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "gRPC connections are not aged out: they last until the client or a shutdown closes them",
    },
    Unimplemented {
        names: &[
            "REDIS_PIPELINE_WINDOW",
            "REDIS_PIPELINE_LIMIT",
            "REDIS_CLUSTER_PIPELINE_PARALLELISM",
            "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        ],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "nothing to tune: concurrent calls share REDIS_POOL_SIZE multiplexed connections (none waits for a \
              free one), each bounded by REDIS_TIMEOUT",
    },
    Unimplemented {
        names: &["REDIS_HEALTH_CHECK_ACTIVE_CONNECTION"],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "not supported: /healthcheck does not follow the Redis connection; while Redis is unreachable \
              requests are answered with their domain's failure mode (FAILURE_MODE)",
    },
    Unimplemented {
        names: &["REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME"],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "the service does not wait for Redis at start: it connects when requests need it",
    },
    Unimplemented {
        names: &["EXPIRATION_JITTER_MAX_SECONDS"],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "keys expire when the module's state for them does; no jitter is added",
    },
    Unimplemented {
        names: &["LOCAL_CACHE_SIZE_IN_BYTES"],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "there is no local over-limit cache: a refused request costs one Redis command and writes nothing \
              (LEASES=true serves hot keys locally)",
    },
    Unimplemented {
        names: &["STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"],
        inert: Inert::True,
        verdict: Verdict::Warn,
        why: "refused requests are never counted here (as with true)",
    },
    Unimplemented {
        names: &["RUNTIME_WATCH_ROOT"],
        inert: Inert::True,
        verdict: Verdict::Warn,
        why: "not needed: the configuration files' contents are polled every CONFIG_POLL_INTERVAL, so symlink \
              swaps and in-place edits are both seen",
    },
    Unimplemented {
        names: &["RESPONSE_DYNAMIC_METADATA"],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "responses carry no dynamic metadata",
    },
    Unimplemented {
        names: &[
            "TRACING_ENABLED",
            "TRACING_SERVICE_NAME",
            "TRACING_SERVICE_NAMESPACE",
            "TRACING_SERVICE_INSTANCE_ID",
            "TRACING_EXPORTER_PROTOCOL",
            "TRACING_SAMPLING_RATE",
        ],
        inert: Inert::False,
        verdict: Verdict::Warn,
        why: "tracing (OpenTelemetry) is not supported",
    },
];

/// What the environment asks of [`UNIMPLEMENTED`]: one line per variable set to a value that is
/// not inert, sorted by name (values are never repeated: some are passwords).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct UnimplementedSet {
    pub warnings: Vec<String>,
    pub refusals: Vec<String>,
}

/// Reads `env` (the process's: `std::env::vars_os()`) for [`UNIMPLEMENTED`] variables.
pub fn unimplemented_settings<K: AsRef<OsStr>, V: AsRef<OsStr>>(
    env: impl IntoIterator<Item = (K, V)>,
) -> UnimplementedSet {
    let mut set: Vec<(String, &Unimplemented)> = Vec::new();
    for (k, v) in env {
        // A name that is not UTF-8 is none of these; a value that is not UTF-8 is not inert.
        let (Some(name), value) = (k.as_ref().to_str(), v.as_ref().to_string_lossy()) else { continue };
        let row = UNIMPLEMENTED.iter().find(|row| {
            row.names.iter().any(|n| match n.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => *n == name,
            })
        });
        if let Some(row) = row {
            if !row.inert.holds(&value) {
                set.push((name.to_string(), row));
            }
        }
    }
    set.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = UnimplementedSet::default();
    for (name, row) in set {
        match row.verdict {
            Verdict::Warn => out.warnings.push(format!(
                "{name} is set but not implemented (an envoyproxy/ratelimit setting), ignored: {}",
                row.why
            )),
            Verdict::Refuse => out.refusals.push(format!(
                "{name} is set but not implemented (an envoyproxy/ratelimit setting): {}; not starting (unset it, or \
                 set it to {}, to start)",
                row.why,
                row.inert.example()
            )),
        }
    }
    out
}

/// `password` or `user:password` (REDIS_AUTH, REDIS_SENTINEL_AUTH); `None` when empty.
fn auth_pair(auth: &str) -> Option<(Option<&str>, &str)> {
    match auth.split_once(':') {
        _ if auth.is_empty() => None,
        Some((user, pass)) => Some((Some(user), pass)),
        None => Some((None, auth)),
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
        let t = s.backend().unwrap().target.to_string();
        assert!(t.starts_with("cluster, seeds redis://h1:7001,redis://h2:7002"), "{t}");
        let s =
            Settings::parse_from(["x", "--redis-type", "sentinel", "--redis-url", "mymaster, 10.0.0.1:26379,h2:26379"]);
        let t = s.backend().unwrap().target.to_string();
        assert!(t.starts_with("sentinel master 'mymaster', sentinels 10.0.0.1:26379,h2:26379"), "{t}");
        let e = Settings::parse_from(["x", "--redis-type", "sentinel", "--redis-url", "10.0.0.1:26379"]).backend();
        assert!(e.unwrap_err().contains("<master name>,<host:port>"));
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

    /// envoyproxy/ratelimit's variables, from src/settings/settings.go at f2fb157 (July 2026):
    /// each is read here (a flag's `env`) or in UNIMPLEMENTED, never both.
    const ENVOYPROXY_VARIABLES: &str = "HOST PORT DEBUG_HOST DEBUG_PORT GRPC_UDS GRPC_HOST GRPC_PORT \
        GRPC_MAX_CONNECTION_AGE GRPC_MAX_CONNECTION_AGE_GRACE GRPC_SERVER_USE_TLS GRPC_SERVER_TLS_CERT \
        GRPC_SERVER_TLS_KEY GRPC_CLIENT_TLS_CACERT GRPC_CLIENT_TLS_SAN LOG_LEVEL LOG_FORMAT CONFIG_TYPE \
        FORCE_START_WITHOUT_INITIAL_CONFIG CONFIG_GRPC_XDS_NODE_ID CONFIG_GRPC_XDS_NODE_METADATA \
        CONFIG_GRPC_XDS_SERVER_URL CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL \
        CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS CONFIG_GRPC_XDS_SERVER_USE_TLS CONFIG_GRPC_XDS_CLIENT_TLS_CERT \
        CONFIG_GRPC_XDS_CLIENT_TLS_KEY CONFIG_GRPC_XDS_SERVER_TLS_CACERT CONFIG_GRPC_XDS_SERVER_TLS_SAN \
        XDS_CLIENT_BACKOFF_INITIAL_INTERVAL XDS_CLIENT_BACKOFF_MAX_INTERVAL XDS_CLIENT_BACKOFF_RANDOM_FACTOR \
        XDS_CLIENT_BACKOFF_JITTER XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES USE_DOG_STATSD USE_DOG_STATSD_MOGRIFIERS \
        USE_STATSD STATSD_HOST STATSD_PORT EXTRA_TAGS STATS_FLUSH_INTERVAL DISABLE_STATS USE_PROMETHEUS \
        PROMETHEUS_ADDR PROMETHEUS_PATH PROMETHEUS_MAPPER_YAML PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS \
        RUNTIME_ROOT RUNTIME_SUBDIRECTORY RUNTIME_APPDIRECTORY RUNTIME_IGNOREDOTFILES RUNTIME_WATCH_ROOT \
        EXPIRATION_JITTER_MAX_SECONDS LOCAL_CACHE_SIZE_IN_BYTES NEAR_LIMIT_RATIO CACHE_KEY_PREFIX BACKEND_TYPE \
        STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT LIMIT_RESPONSE_HEADERS_ENABLED LIMIT_LIMIT_HEADER \
        LIMIT_REMAINING_HEADER LIMIT_RESET_HEADER HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED REDIS_SOCKET_TYPE \
        REDIS_TYPE REDIS_URL REDIS_POOL_SIZE REDIS_AUTH REDIS_TLS REDIS_TLS_CLIENT_CERT REDIS_TLS_CLIENT_KEY \
        REDIS_TLS_CACERT REDIS_TLS_SKIP_HOSTNAME_VERIFICATION REDIS_PIPELINE_WINDOW REDIS_PIPELINE_LIMIT \
        REDIS_CLUSTER_PIPELINE_PARALLELISM REDIS_PERSECOND REDIS_PERSECOND_SOCKET_TYPE REDIS_PERSECOND_TYPE \
        REDIS_PERSECOND_URL REDIS_PERSECOND_POOL_SIZE REDIS_PERSECOND_AUTH REDIS_PERSECOND_TLS REDIS_SENTINEL_AUTH \
        REDIS_PERSECOND_SENTINEL_AUTH REDIS_PERSECOND_PIPELINE_WINDOW REDIS_PERSECOND_PIPELINE_LIMIT \
        REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM REDIS_HEALTH_CHECK_ACTIVE_CONNECTION REDIS_TIMEOUT \
        REDIS_PERSECOND_TIMEOUT REDIS_POOL_ON_EMPTY_BEHAVIOR REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR \
        REDIS_STARTUP_INITIAL_INTERVAL REDIS_STARTUP_MAX_INTERVAL REDIS_STARTUP_MAX_ELAPSED_TIME MEMCACHE_HOST_PORT \
        MEMCACHE_MAX_IDLE_CONNS MEMCACHE_SRV MEMCACHE_SRV_REFRESH MEMCACHE_TLS MEMCACHE_TLS_CLIENT_CERT \
        MEMCACHE_TLS_CLIENT_KEY MEMCACHE_TLS_CACERT MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION SHADOW_MODE QUOTA_MODE \
        RESPONSE_DYNAMIC_METADATA MERGE_DOMAIN_CONFIG TRACING_ENABLED TRACING_SERVICE_NAME \
        TRACING_SERVICE_NAMESPACE TRACING_SERVICE_INSTANCE_ID TRACING_EXPORTER_PROTOCOL TRACING_SAMPLING_RATE";

    fn read_here() -> Vec<String> {
        use clap::CommandFactory;
        Settings::command()
            .get_arguments()
            .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
            .collect()
    }

    #[test]
    fn every_envoyproxy_variable_is_read_or_listed_as_unimplemented() {
        let here = read_here();
        let listed: Vec<&str> = UNIMPLEMENTED.iter().flat_map(|r| r.names.iter().copied()).collect();
        for name in ENVOYPROXY_VARIABLES.split_whitespace() {
            let (read, unimplemented) = (here.iter().any(|h| h == name), listed.contains(&name));
            assert!(read != unimplemented, "{name}: read here {read}, listed as unimplemented {unimplemented}");
        }
        let mut seen = std::collections::HashSet::new();
        for name in &listed {
            assert!(seen.insert(name), "{name} is listed twice");
            assert!(!here.iter().any(|h| h == name), "{name} is read here and listed as unimplemented");
        }
    }

    fn env(vars: &[(&str, &str)]) -> UnimplementedSet {
        unimplemented_settings(vars.iter().map(|&(k, v)| (k, v)))
    }

    #[test]
    fn a_set_unimplemented_variable_warns_or_refuses_and_inert_values_say_nothing() {
        assert_eq!(env(&[]), UnimplementedSet::default());
        // Read here, or nobody's: nothing.
        assert_eq!(env(&[("REDIS_URL", "x:1"), ("PATH", "/bin"), ("REDIS_TLSX", "true")]), UnimplementedSet::default());
        let s = env(&[
            ("USE_STATSD", "true"),
            ("REDIS_PERSECOND", "true"),
            ("STATSD_HOST", "statsd"),
            ("BACKEND_TYPE", "memcache"),
        ]);
        assert_eq!(s.warnings.len(), 2, "{s:?}");
        assert!(
            s.warnings[0].starts_with("STATSD_HOST is set but not implemented") && s.warnings[0].contains("/metrics")
        );
        assert!(s.warnings[1].starts_with("USE_STATSD is set but not implemented"), "{s:?}");
        assert_eq!(s.refusals.len(), 2, "{s:?}");
        assert!(
            s.refusals[0].starts_with("BACKEND_TYPE is set but not implemented") && s.refusals[0].contains("memcached")
        );
        assert!(s.refusals[1].starts_with("REDIS_PERSECOND is set") && s.refusals[1].contains("not starting"), "{s:?}");
        // Values asking for what the service does anyway.
        let inert = [
            ("REDIS_PERSECOND", "False"),
            ("QUOTA_MODE", "0"),
            ("USE_STATSD", " off "),
            ("BACKEND_TYPE", "REDIS"),
            ("CONFIG_TYPE", "FILE"),
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
            ("RUNTIME_WATCH_ROOT", "T"),
        ];
        assert_eq!(env(&inert), UnimplementedSet::default());
        // Anything else asks for something: a refused variable is refused whatever it says.
        for v in ["true", "1", "yes", "maybe", "/etc/ca.pem"] {
            assert_eq!(env(&[("REDIS_PERSECOND", v)]).refusals.len(), 1, "{v}");
        }
        assert_eq!(env(&[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false")]).warnings.len(), 1);
        assert_eq!(env(&[("CONFIG_TYPE", "GRPC_XDS_SOTW")]).refusals.len(), 1);
        assert_eq!(env(&[("DOG_STATSD_MOGRIFIER_TAGS_PATTERN", "x")]).warnings.len(), 1);
        // Values never appear (passwords).
        let s = env(&[("REDIS_PERSECOND", "s3cret"), ("REDIS_PERSECOND_AUTH", "s3cret")]);
        assert_eq!((s.refusals.len(), s.warnings.len()), (1, 1));
        assert!(!format!("{s:?}").contains("s3cret"));
    }

    #[test]
    fn non_utf8_variables_do_not_crash() {
        use std::os::unix::ffi::OsStrExt;
        let bad = OsStr::from_bytes(b"\xff\xfe");
        let s = unimplemented_settings([(OsStr::new("REDIS_PERSECOND"), bad), (bad, OsStr::new("x"))]);
        assert_eq!(s.refusals.len(), 1);
        assert!(s.warnings.is_empty());
    }

    /// docs/service.md's table is this table: the same rows, names and verdicts, in order.
    #[test]
    fn the_docs_table_lists_the_same_variables_and_verdicts() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/service.md")).unwrap();
        let section = doc
            .split("### envoyproxy/ratelimit's settings this service does not implement")
            .nth(1)
            .expect("docs/service.md has the section");
        let rows: Vec<(Vec<String>, String)> = section
            .lines()
            .skip_while(|l| !l.starts_with("| variables |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let names = cells[1].split(", ").map(|n| n.trim_matches('`').to_string()).collect();
                (names, cells[2].to_string())
            })
            .collect();
        let want: Vec<(Vec<String>, String)> = UNIMPLEMENTED
            .iter()
            .map(|r| {
                let verdict = match r.verdict {
                    Verdict::Warn => "warn",
                    Verdict::Refuse => "refuse",
                };
                (r.names.iter().map(|n| n.to_string()).collect(), verdict.to_string())
            })
            .collect();
        assert_eq!(rows, want);
    }
}
