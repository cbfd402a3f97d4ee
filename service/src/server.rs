//! The listeners: gRPC (`envoy.service.ratelimit.v3.RateLimitService` and `grpc.health.v1.Health`)
//! and HTTP (`/json`, `/healthcheck`, `/metrics`, `/rlconfig`), and the process around them:
//! at SIGTERM / SIGINT unhealthy at once, still serving for the drain period, then a graceful
//! stop and the leases given back.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tonic::{Request, Status};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::config::LoadOptions;
use crate::leases::Leases;
use crate::metrics::Metrics;
use crate::pb::{Code, RateLimitRequest, RateLimitResponse, RateLimitService, RateLimitServiceServer};
use crate::quota::buckets::KeySettings;
use crate::quota::QuotaService;
use crate::reload::Reloader;
use crate::service::{RequestError, Service};
use crate::settings::Settings;

/// Health as envoyproxy/ratelimit reports it: unhealthy after SIGTERM, and (when asked) until a
/// configuration with a domain is loaded.
pub struct Health {
    pub terminating: AtomicBool,
    pub need_config: bool,
}

impl Health {
    /// Why the service is unhealthy; none: healthy. /healthcheck and grpc.health.v1 both answer
    /// from this. Redis being down is not one: every instance shares the Redis. Redis up without
    /// the module is (a deployment error, not an outage: never healthy while enforcing nothing).
    pub fn problems(&self, service: &Service) -> Vec<&'static str> {
        let mut problems = Vec::new();
        if self.terminating.load(Ordering::Relaxed) {
            problems.push("terminating");
        }
        if self.need_config && service.config().as_ref().is_none_or(|c| c.is_empty()) {
            problems.push("no configuration with a domain loaded");
        }
        if service.backend().module_missing() {
            // Every request would be decided by the failure mode: in `open` every one OK.
            problems.push("Redis does not have the redis-ratelimit module loaded");
        }
        problems
    }
}

/// How often Redis is asked whether it has the module while that is not confirmed.
const MODULE_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The services grpc.health.v1 reports: envoyproxy/ratelimit's name, and "" (the server).
pub const GRPC_HEALTH_SERVICES: [&str; 2] = ["ratelimit", ""];

/// grpc.health.v1's statuses, kept to what /healthcheck answers.
pub struct GrpcHealth {
    // One lock over the check and the update: a check that saw "healthy" cannot overwrite the
    // NOT_SERVING of a later one.
    state: tokio::sync::Mutex<GrpcHealthState>,
}

struct GrpcHealthState {
    reporter: HealthReporter,
    last: Option<ServingStatus>,
    closed: bool,
}

impl GrpcHealth {
    pub fn new(reporter: HealthReporter) -> GrpcHealth {
        GrpcHealth { state: tokio::sync::Mutex::new(GrpcHealthState { reporter, last: None, closed: false }) }
    }

    /// Sets the statuses from [`Health::problems`] (when they changed).
    pub async fn sync(&self, health: &Health, service: &Service) {
        let mut st = self.state.lock().await;
        let status =
            if health.problems(service).is_empty() { ServingStatus::Serving } else { ServingStatus::NotServing };
        if st.closed || st.last == Some(status) {
            return;
        }
        for name in GRPC_HEALTH_SERVICES {
            st.reporter.set_service_status(name, status).await;
        }
        if st.last.is_some() {
            tracing::info!("grpc.health.v1: {status}");
        }
        st.last = Some(status);
    }

    /// Removes the statuses, which ends the Watch streams: the graceful stop waits for every
    /// stream, and a Watch would never end by itself.
    pub async fn close(&self) {
        let mut st = self.state.lock().await;
        st.closed = true;
        for name in GRPC_HEALTH_SERVICES {
            st.reporter.clear_service_status(name).await;
        }
    }
}

#[derive(Clone)]
pub struct App {
    pub service: Arc<Service>,
    pub health: Arc<Health>,
    /// The Rate Limit Quota Service (its metrics).
    pub quota: Arc<QuotaService>,
}

pub struct Grpc(pub Arc<Service>);

fn status_of(e: RequestError) -> Status {
    match e {
        RequestError::Invalid(m) => Status::invalid_argument(m),
        RequestError::Unavailable(m) => Status::unavailable(m),
        RequestError::Internal(m) => Status::internal(m),
    }
}

#[tonic::async_trait]
impl RateLimitService for Grpc {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, Status> {
        let deadline = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| grpc_timeout(v.to_str().ok()?))
            .map(|t| self.0.deadline(t));
        self.0.should_rate_limit(request.get_ref(), deadline).await.map(tonic::Response::new).map_err(status_of)
    }
}

/// A unary gRPC service whose oversized requests are answered `RESOURCE_EXHAUSTED`, as gRPC
/// says a message over the receiver's limit is (issue 31.7): tonic's decoder answers
/// `OUT_OF_RANGE` for it, before the handler runs, in the response's headers (a trailers-only
/// response). `OUT_OF_RANGE` has no other source here (`status_of`), so it is that.
#[derive(Clone)]
struct OversizedIsExhausted<S>(S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for OversizedIsExhausted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tonic::codegen::Service<tonic::codegen::http::Request<B>> for OversizedIsExhausted<S>
where
    S: tonic::codegen::Service<
        tonic::codegen::http::Request<B>,
        Response = tonic::codegen::http::Response<tonic::body::Body>,
    >,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::MapOk<S::Future, fn(S::Response) -> S::Response>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        use futures::TryFutureExt;
        fn exhausted(
            mut r: tonic::codegen::http::Response<tonic::body::Body>,
        ) -> tonic::codegen::http::Response<tonic::body::Body> {
            // grpc-status 11 (OUT_OF_RANGE) becomes 8 (RESOURCE_EXHAUSTED).
            if r.headers().get("grpc-status").is_some_and(|v| v.as_bytes() == b"11") {
                r.headers_mut().insert("grpc-status", tonic::codegen::http::HeaderValue::from_static("8"));
            }
            r
        }
        self.0.call(req).map_ok(exhausted as fn(_) -> _)
    }
}

/// A `grpc-timeout` value (gRPC over HTTP/2: at most 8 digits and a unit, `H M S m u n`); None
/// when malformed (the call then has no deadline of its own, as gRPC servers treat it).
pub fn grpc_timeout(v: &str) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

async fn json(State(app): State<App>, body: Bytes) -> Response {
    app.service.metrics.json_requests.fetch_add(1, Ordering::Relaxed);
    let req = match crate::json::parse_request(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e).into_response(),
    };
    match app.service.should_rate_limit(&req, None).await {
        Ok(r) => {
            let status =
                if r.overall_code == Code::OverLimit as i32 { StatusCode::TOO_MANY_REQUESTS } else { StatusCode::OK };
            (status, [(header::CONTENT_TYPE, "application/json")], crate::json::render_response(&r)).into_response()
        }
        Err(RequestError::Invalid(m)) => (StatusCode::BAD_REQUEST, m).into_response(),
        Err(RequestError::Unavailable(m)) => (StatusCode::SERVICE_UNAVAILABLE, m).into_response(),
        Err(RequestError::Internal(m)) => (StatusCode::INTERNAL_SERVER_ERROR, m).into_response(),
    }
}

async fn healthcheck(State(app): State<App>) -> Response {
    let problems = app.health.problems(&app.service);
    if problems.is_empty() {
        // What the connection layer is doing (connected to X, connecting, unavailable: why,
        // Sentinel's latest failover), and the breaker.
        let status = app.service.backend().connection().status();
        let breaker = if app.service.backend().healthy() { "" } else { "; breaker open" };
        let redis = format!("redis {status}{breaker}");
        (StatusCode::OK, format!("OK\n{redis}\n")).into_response()
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, problems.join("; ")).into_response()
    }
}

async fn metrics(State(app): State<App>) -> Response {
    let m: &Metrics = &app.service.metrics;
    let loaded = app.service.config().map(|c| c.rules as u64).unwrap_or(0);
    let breaker = u64::from(!app.service.backend().healthy());
    let mut text = m.render(&[
        ("ratelimit_service_config_rules", "Rules in the configuration being served", loaded),
        ("ratelimit_service_redis_breaker_open", "1 while the Redis circuit breaker is open", breaker),
    ]);
    if let Some(l) = app.service.leases() {
        // The client engine's counters and gauges, summed over the rules' limiters.
        for (k, v) in l.totals() {
            text.push_str(&format!("# TYPE ratelimit_service_lease_{k} gauge\nratelimit_service_lease_{k} {v}\n"));
        }
    }
    text.push_str(&app.quota.render_metrics());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn rlconfig(State(app): State<App>) -> Response {
    match app.service.config() {
        Some(c) => (StatusCode::OK, c.dump() + "\n").into_response(),
        None => (StatusCode::OK, "no configuration loaded\n").into_response(),
    }
}

pub fn http_router(app: App) -> Router {
    Router::new()
        .route("/json", post(json))
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics))
        .route("/rlconfig", get(rlconfig))
        .with_state(app)
}

/// The HTTP listener's bounds (issue 31.7): a client that never finishes its headers, or a
/// flood of connections, must not use up the process's file descriptors (gRPC and the
/// configuration's reloads need them).
pub struct HttpLimits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
}

/// Serves `router` on `listener` (HTTP/1.1) until `stop`, then waits for the requests in
/// flight: each connection's headers must arrive within the timeout, and at most
/// `max_connections` are open (one more is closed at once, counted in the log).
async fn serve_http(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: HttpLimits,
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let open = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut refused: u64 = 0;
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors (EMFILE) or the like: wait rather than spin.
                    tracing::warn!("HTTP accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    "HTTP: {} connections open (HTTP_MAX_CONNECTIONS): closed a new one ({refused} so far)",
                    limits.max_connections
                );
            }
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Runs the service until SIGTERM / SIGINT.
pub async fn run(settings: Settings) -> Result<(), String> {
    let metrics = Arc::new(Metrics::new(settings.stats_max_keys));
    let backend = Arc::new(crate::backend::Backend::new(&settings.backend()?, metrics.clone())?);
    // The leases' limiters share the backend's connection layer.
    let lease_conn = Some(backend.connection().clone());
    let service_settings = settings.service()?;
    let quota_settings = settings.quota.settings(
        KeySettings {
            prefix: service_settings.key_prefix.clone(),
            hash_tag_domain: service_settings.hash_tag_domain,
            failure_mode: service_settings.failure_mode,
        },
        service_settings.instances,
        settings.redis_timeout,
    )?;
    let mut service = Service::new(backend, metrics.clone(), service_settings);
    if let Some(conn) = lease_conn {
        service = service.with_leases(Arc::new(Leases::new(settings.lease_settings(), conn)?));
    }
    let service = Arc::new(service);
    let reloader = Reloader {
        path: settings.config_path(),
        ignore_dotfiles: settings.runtime_ignore_dotfiles,
        opts: LoadOptions { merge_domains: settings.merge_domain_config },
        interval: settings.config_poll_interval,
        allow_empty: settings.allow_empty_config,
    };
    tracing::info!("reading the rate limit configuration from {}", reloader.path.display());
    let first = reloader.first(&service)?;
    tokio::spawn(reloader.run(service.clone(), first));

    let health = Arc::new(Health {
        terminating: AtomicBool::new(false),
        need_config: settings.healthy_with_at_least_one_config_loaded,
    });
    let (reporter, health_server) = tonic_health::server::health_reporter();
    let grpc_health = Arc::new(GrpcHealth::new(reporter));
    // Whether Redis has the module: asked at start (so the log says it), then every second
    // until Redis confirms it, and again whenever a request finds it missing.
    service.backend().probe_module().await;
    {
        let (g, h, s) = (grpc_health.clone(), health.clone(), service.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(MODULE_PROBE_INTERVAL).await;
                if s.backend().module_unconfirmed() {
                    s.backend().probe_module().await;
                }
                g.sync(&h, &s).await;
            }
        });
    }
    grpc_health.sync(&health, &service).await;
    if health.need_config {
        // Follows the reloader: NOT_SERVING until a configuration with a domain is loaded.
        let (g, h, s, every) = (grpc_health.clone(), health.clone(), service.clone(), settings.config_poll_interval);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                g.sync(&h, &s).await;
            }
        });
    }
    // Before the first "listening" line: from then on a signal is ours, never the default
    // (fatal) disposition.
    let mut signals = Signals::new()?;
    let grpc_addr: SocketAddr = format!("{}:{}", settings.grpc_host, settings.grpc_port)
        .parse()
        .map_err(|e| format!("invalid gRPC address: {e}"))?;
    let http_addr: SocketAddr =
        format!("{}:{}", settings.host, settings.port).parse().map_err(|e| format!("invalid HTTP address: {e}"))?;
    let grpc_listener =
        tokio::net::TcpListener::bind(grpc_addr).await.map_err(|e| format!("gRPC bind {grpc_addr}: {e}"))?;
    let http_listener =
        tokio::net::TcpListener::bind(http_addr).await.map_err(|e| format!("HTTP bind {http_addr}: {e}"))?;
    tracing::info!("listening for gRPC on {}", grpc_listener.local_addr().map_err(|e| e.to_string())?);
    tracing::info!("listening for HTTP on {}", http_listener.local_addr().map_err(|e| e.to_string())?);
    tracing::info!("redis: {}", settings.backend()?.target);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // The quota streams end at the stop, so that the graceful stop does not wait for them.
    let quota = QuotaService::new(service.clone(), service.backend().clone(), quota_settings, stop_rx.clone());
    let (force_tx, mut force_rx) = tokio::sync::watch::channel(false);
    let (h, s, g, drain) = (health.clone(), service.clone(), grpc_health.clone(), settings.drain_period);
    tokio::spawn(async move {
        let sig = signals.next().await;
        h.terminating.store(true, Ordering::Relaxed);
        g.sync(&h, &s).await;
        if drain.is_zero() {
            tracing::info!("{sig}: shutting down: stopping the servers (requests in flight finish)");
        } else {
            tracing::info!(
                "{sig}: shutting down after a drain period of {drain:?}: /healthcheck answers 500 and \
                 grpc.health.v1 NOT_SERVING, requests are still served"
            );
            tokio::select! {
                _ = tokio::time::sleep(drain) => {
                    tracing::info!("drain period over: stopping the servers (requests in flight finish)");
                }
                sig = signals.next() => {
                    tracing::info!("{sig} during the drain: cut short: stopping the servers (requests in flight finish)");
                }
            }
        }
        g.close().await;
        let _ = stop_tx.send(true);
        // A signal during the graceful stop ends its wait at once: the connections still open
        // are closed, leases are given back, exit 0 (an operator's second Ctrl-C, or a
        // supervisor's repeated SIGTERM, is obeyed rather than ignored until SHUTDOWN_TIMEOUT).
        let sig = signals.next().await;
        tracing::info!("{sig} during the graceful stop: closing the connections still open");
        let _ = force_tx.send(true);
    });
    let mut rx1 = stop_rx.clone();
    let mut rx3 = stop_rx.clone();
    let mut rx2 = stop_rx;
    let stop_limit = settings.shutdown_timeout;
    let service_for_shutdown = service.clone();
    let app = App { service: service.clone(), health, quota: quota.clone() };
    let http_limits = HttpLimits {
        header_read_timeout: settings.http_header_read_timeout,
        max_connections: settings.http_max_connections.max(1),
    };
    let http = serve_http(http_listener, http_router(app), http_limits, async move {
        let _ = rx1.wait_for(|v| *v).await;
    });
    let incoming = tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true));
    let grpc = tonic::transport::Server::builder()
        .max_concurrent_streams(settings.grpc_max_concurrent_streams.max(1))
        .add_service(health_server)
        .add_service(OversizedIsExhausted(
            RateLimitServiceServer::new(Grpc(service)).max_decoding_message_size(settings.grpc_max_message_bytes),
        ))
        .add_service(quota.server())
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = rx2.wait_for(|v| *v).await;
        });
    // The graceful stop waits for every request in flight, at most SHUTDOWN_TIMEOUT: a request
    // that never ends must not keep the process (and its leases) until a SIGKILL.
    // A further signal ends it sooner.
    let limit = async move {
        let _ = rx3.wait_for(|v| *v).await;
        tokio::select! {
            _ = tokio::time::sleep(stop_limit) => true,
            _ = force_rx.wait_for(|v| *v) => false,
        }
    };
    let (a, b) = tokio::select! {
        done = async { tokio::join!(http, grpc) } => done,
        timed_out = limit => {
            if timed_out {
                tracing::warn!(
                    "graceful stop not done after SHUTDOWN_TIMEOUT ({stop_limit:?}): closing the connections still open"
                );
            }
            (Ok(()), Ok(()))
        }
    };
    tracing::info!("servers stopped");
    if let Some(l) = service_for_shutdown.leases() {
        tracing::info!("giving held leases back");
        l.shutdown().await;
    }
    a.map_err(|e| format!("HTTP server: {e}"))?;
    b.map_err(|e| format!("gRPC server: {e}"))?;
    tracing::info!("shut down");
    Ok(())
}

/// SIGTERM and SIGINT, each as often as it comes.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals, String> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let term = signal(SignalKind::terminate()).map_err(|e| format!("cannot listen for SIGTERM: {e}"))?;
            let int = signal(SignalKind::interrupt()).map_err(|e| format!("cannot listen for SIGINT: {e}"))?;
            Ok(Signals { term, int })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The next signal's name.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_spec_says() {
        assert_eq!(grpc_timeout("20m"), Some(Duration::from_millis(20)));
        assert_eq!(grpc_timeout("250000u"), Some(Duration::from_millis(250)));
        assert_eq!(grpc_timeout("1S"), Some(Duration::from_secs(1)));
        assert_eq!(grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in ["", "m", "20", "20x", "123456789m", "-1m", "1.5S", "+1m"] {
            assert_eq!(grpc_timeout(bad), None, "{bad}");
        }
    }
}
