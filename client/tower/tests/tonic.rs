//! The layer in front of a real tonic server (`grpc.health.v1`, from tonic-health) on a
//! loopback port, called with tonic's own client over HTTP/2: admitted within the burst, then
//! `RESOURCE_EXHAUSTED` with `retry-after` and the rate-limit headers in the status's
//! metadata; `UNAVAILABLE` once Redis is gone under fail closed, and admitted again once it is
//! back.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::Server;
use redis_ratelimit_tower::client::{ConnectionConfig, Limit, Limiter, LimiterConfig};
use redis_ratelimit_tower::{Key, RateLimitLayer};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// A token per 20 s, bursts of 3, by the `x-api-key` metadata; fail closed (the default).
async fn serve(server: &Server) -> (u16, RateLimitLayer) {
    let conn = ConnectionConfig::single(&server.url()).connect().unwrap();
    conn.ready(tokio::time::Instant::now() + Duration::from_secs(5)).await.unwrap();
    let limit = Limit::gcra(1, Duration::from_secs(20)).unwrap().with_burst(3).unwrap();
    let config = LimiterConfig::new(limit).timeout(Duration::from_millis(200)).breaker(1, Duration::from_secs(1));
    let layer = RateLimitLayer::new(Limiter::new(conn, config).unwrap(), Key::header("x-api-key"));
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = tonic::transport::Server::builder().layer(layer.clone()).add_service(health);
    tokio::spawn(router.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)));
    (port, layer)
}

async fn check(port: u16, key: &str) -> Result<tonic::Response<tonic_health::pb::HealthCheckResponse>, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}")).unwrap();
    let mut c = HealthClient::new(channel.connect().await.unwrap());
    let mut req = tonic::Request::new(HealthCheckRequest { service: String::new() });
    req.metadata_mut().insert("x-api-key", key.parse().unwrap());
    c.check(req).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tonic_service_answers_resource_exhausted_past_the_burst() {
    let server = Server::start();
    let (port, layer) = serve(&server).await;
    for i in 0..3 {
        let r = check(port, "alice").await.unwrap_or_else(|e| panic!("request {i}: {e:?}"));
        // Admitted: the service's own answer, with the rate-limit headers added.
        assert_eq!(r.get_ref().status, 1, "SERVING");
        assert!(r.metadata().get("ratelimit").is_some(), "{:?}", r.metadata());
    }
    let e = check(port, "alice").await.expect_err("the fourth request is over the burst");
    assert_eq!((e.code(), e.message()), (Code::ResourceExhausted, "rate limit exceeded"), "{e:?}");
    let retry = e.metadata().get("retry-after").and_then(|v| v.to_str().ok());
    assert!(matches!(retry, Some("19" | "20")), "{:?}", e.metadata());
    assert!(e.metadata().get("ratelimit-policy").is_some(), "{:?}", e.metadata());
    // Another key has its own limit.
    assert!(check(port, "bob").await.is_ok());
    let s = layer.stats();
    assert_eq!((s.requests, s.refused), (5, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tonic_service_answers_unavailable_with_redis_gone_under_fail_closed() {
    let mut server = Server::start();
    let (port, layer) = serve(&server).await;
    assert!(check(port, "carol").await.is_ok());
    server.kill9();
    // Keys with no units held: nothing can decide them.
    for i in 0..3 {
        let e = check(port, &format!("dave{i}")).await.expect_err("fail closed");
        assert_eq!((e.code(), e.message()), (Code::Unavailable, "rate limiter unavailable"), "{e:?}");
        assert!(e.metadata().get("retry-after").is_none(), "{:?}", e.metadata());
    }
    assert_eq!(layer.stats().unavailable, 3);
    // Redis back: decisions resume within the breaker's cool-down (1 s) plus a reconnect.
    server.start_again();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match check(port, "erin").await {
            Ok(r) => {
                assert!(r.metadata().get("ratelimit").is_some(), "{:?}", r.metadata());
                break;
            }
            Err(e) => assert_eq!(e.code(), Code::Unavailable, "{e:?}"),
        }
        assert!(std::time::Instant::now() < deadline, "still unavailable 30 s after Redis came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
