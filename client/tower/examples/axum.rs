//! An axum service rate-limited with redis-ratelimit-tower, as an operator of a multi-tenant
//! API would set it up:
//!
//! * requests with an `x-api-key` (tier `key`): a limit per key and a looser one per client IP;
//! * requests without (tier `anonymous`): a tighter limit per client IP;
//! * the client IP is read from `X-Forwarded-For` only when the peer is a trusted proxy;
//! * `/health` is not limited;
//! * Redis unavailable: 503 (fail closed), or as `RL_FAILURE=open` says.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ LISTEN=127.0.0.1:3000 \
//!     cargo run --release -p redis-ratelimit-tower --example axum
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/
//! ```
//!
//! `tests/axum.rs` serves [`app`] on a loopback port and checks it with real HTTP requests.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use redis_ratelimit_tower::client::redis::aio::ConnectionLike;
use redis_ratelimit_tower::client::{ConnectionConfig, FailurePolicy, Limit, LimitError, Limiter, LimiterConfig};
use redis_ratelimit_tower::{Forwarded, Key, RateLimitLayer, Rule};

/// The service's limits and settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub per_key: Limit,
    pub per_ip: Limit,
    pub anonymous: Limit,
    /// Proxies whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<String>,
    pub policy: FailurePolicy,
    pub shadow: bool,
}

impl Default for Settings {
    fn default() -> Self {
        let minute = Duration::from_secs(60);
        let bucket = |l: Result<Limit, LimitError>, burst| l.and_then(|l| l.with_burst(burst)).expect("a valid limit");
        Settings {
            per_key: bucket(Limit::token_bucket(1000, minute), 150),
            per_ip: bucket(Limit::gcra(300, minute), 50),
            anonymous: bucket(Limit::gcra(60, minute), 10),
            trusted_proxies: vec!["127.0.0.1".into(), "::1".into()],
            policy: FailurePolicy::FailClosed,
            shadow: false,
        }
    }
}

/// The router and its rate-limit layer (kept for its counters).
pub fn app<C>(conn: C, s: &Settings) -> (Router, RateLimitLayer)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let limiter = |limit: Limit| {
        // A short timeout: a request never waits long on a Redis that is gone.
        let config = LimiterConfig::new(limit).timeout(Duration::from_millis(100)).policy(s.policy);
        Limiter::new(conn.clone(), config).expect("valid limiter settings")
    };
    let ip = || Key::client_ip(Forwarded::XForwardedFor, &s.trusted_proxies);
    let layer = RateLimitLayer::builder()
        .tier(
            "key",
            [Rule::new("key", limiter(s.per_key), Key::header("x-api-key")), Rule::new("ip", limiter(s.per_ip), ip())],
        )
        .tier("anonymous", [Rule::new("ip", limiter(s.anonymous), ip())])
        .select(|req| match req.uri.path() {
            "/health" => None,
            _ if req.headers.contains_key("x-api-key") => Some("key"),
            _ => Some("anonymous"),
        })
        .shadow(s.shadow)
        .build()
        .expect("valid rate-limit layer");
    let router = Router::new()
        .route("/", get(|| async { "hello\n" }).post(|| async { "posted\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(layer.clone());
    (router, layer)
}

/// Serves `router` on `listener` with the peers' addresses (for the IP keys).
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>()).await
}

#[allow(dead_code)] // tests/axum.rs includes this file for `app` and `serve`.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let mut settings = Settings::default();
    if std::env::var("RL_FAILURE").as_deref() == Ok("open") {
        settings.policy = FailurePolicy::FailOpen;
    }
    let conn = ConnectionConfig::single(&url).connect()?;
    let (router, _) = app(conn, &settings);
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    eprintln!("listening on {listen}");
    serve(listener, router).await?;
    Ok(())
}
