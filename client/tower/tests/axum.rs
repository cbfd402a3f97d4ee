//! The axum example (examples/axum.rs) served on a loopback port against a real redis-server
//! with the module, checked with real HTTP/1.1 requests: admitted then refused with
//! `retry-after` and both header forms, tiers by API key, the client IP behind a trusted
//! proxy, unlimited routes, gRPC refusals, shadow mode, and 503 once Redis is gone (fail
//! closed).
//!
//! No timing assertions: requests follow each other within milliseconds, far inside the
//! limits' refill intervals (a token per 20 s).

#[path = "../../../tests/common/mod.rs"]
mod common;

#[path = "../examples/axum.rs"]
#[allow(dead_code)]
mod example;

use std::collections::BTreeMap;
use std::time::Duration;

use common::Server;
use example::Settings;
use redis_ratelimit_tower::client::{ConnectionConfig, Limit};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A token per 20 s, bursts of 3 (`w` = 3 × 20 s = 60): nothing refills during a test.
fn slow() -> Limit {
    Limit::gcra(1, Duration::from_secs(20)).unwrap().with_burst(3).unwrap()
}

fn settings() -> Settings {
    Settings {
        per_key: slow(),
        per_ip: Limit::gcra(1, Duration::from_secs(20)).unwrap().with_burst(4).unwrap(),
        anonymous: slow(),
        ..Settings::default()
    }
}

struct Reply {
    status: u16,
    headers: BTreeMap<String, String>,
}

impl Reply {
    fn h(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// One request on its own connection; `headers` as `(name, value)`.
async fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-length: 0\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out)).await.expect("response in time").unwrap();
    let out = String::from_utf8_lossy(&out);
    let (head, _) = out.split_once("\r\n\r\n").expect("a response head");
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let mut headers = BTreeMap::new();
    for (k, v) in lines.filter_map(|l| l.split_once(':')) {
        // Repeated fields are one list (none expected here).
        let v = v.trim().to_string();
        headers.entry(k.trim().to_string()).and_modify(|o: &mut String| *o = format!("{o}, {v}")).or_insert(v);
    }
    Reply { status, headers }
}

async fn get(port: u16, headers: &[(&str, &str)]) -> Reply {
    request(port, "GET", "/", headers).await
}

/// Serves the example with `settings` on a fresh loopback port.
async fn start(server: &Server, s: &Settings) -> (u16, redis_ratelimit_tower::RateLimitLayer) {
    let conn = ConnectionConfig::single(&server.url()).connect().unwrap();
    conn.ready(tokio::time::Instant::now() + Duration::from_secs(5)).await.unwrap();
    let (router, layer) = example::app(conn, s);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(example::serve(listener, router));
    (port, layer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_tier_admits_the_burst_then_answers_429_with_headers() {
    let server = Server::start();
    let (port, layer) = start(&server, &settings()).await;
    let key = [("x-api-key", "alice")];
    let mut replies = Vec::new();
    for _ in 0..4 {
        replies.push(get(port, &key).await);
    }
    assert_eq!(replies.iter().map(|r| r.status).collect::<Vec<_>>(), [200, 200, 200, 429]);
    for r in &replies[..3] {
        // Both rules in the draft form, named after them; the three-field form beside it.
        assert_eq!(r.h("ratelimit-policy"), Some(r#""key";q=3;w=60, "ip";q=4;w=80"#), "{:?}", r.headers);
        assert!(r.h("ratelimit").unwrap().starts_with(r#""key";r="#), "{:?}", r.headers);
        assert_eq!(r.h("ratelimit-limit"), Some("3"));
        assert!(r.h("retry-after").is_none());
    }
    let refused = &replies[3];
    // 20 s less the milliseconds since the burst was spent, rounded up.
    let retry = refused.h("retry-after").expect("retry-after on a 429");
    assert!(retry == "20" || retry == "19", "{:?}", refused.headers);
    assert_eq!(refused.h("ratelimit-remaining"), Some("0"));
    assert_eq!(refused.h("ratelimit-limit"), Some("3"));
    // t is no later than retry-after; both rules were decided (the IP admitted, and got its
    // unit back).
    let t = format!(r#""key";r=0;t={retry}, "ip";r="#);
    assert!(refused.h("ratelimit").unwrap().starts_with(&t), "{:?}", refused.headers);
    assert_eq!(refused.h("ratelimit-policy"), Some(r#""key";q=3;w=60, "ip";q=4;w=80"#));
    // The next request of that key is refused from the over-limit cache: the IP is not asked.
    let cached = get(port, &key).await;
    assert_eq!(cached.status, 429);
    assert!(cached.h("ratelimit").unwrap().starts_with(r#""key";r=0;t="#), "{:?}", cached.headers);
    assert!(!cached.h("ratelimit").unwrap().contains(r#""ip""#), "{:?}", cached.headers);
    // Another key has its own limit; the IP limit (4) is shared by both keys, and the refused
    // requests took none of it: bob gets the one unit left.
    let bob = [("x-api-key", "bob")];
    assert_eq!(get(port, &bob).await.status, 200);
    let r = get(port, &bob).await;
    assert_eq!(r.status, 429, "the IP's burst of 4 is spent: {:?}", r.headers);
    assert!(r.h("ratelimit").unwrap().contains(r#""ip";r=0;t="#), "{:?}", r.headers);
    // Refused per IP, bob's key kept its unit: from other addresses (behind the trusted
    // proxy) two more requests pass, then the key's burst of 3 is spent.
    let from = |ip: &'static str| [("x-api-key", "bob"), ("x-forwarded-for", ip)];
    assert_eq!(get(port, &from("203.0.113.50")).await.status, 200);
    assert_eq!(get(port, &from("203.0.113.51")).await.status, 200);
    let r = get(port, &from("203.0.113.52")).await;
    assert_eq!(r.status, 429);
    assert!(r.h("ratelimit").unwrap().starts_with(r#""key";r=0;"#), "{:?}", r.headers);
    let stats = layer.stats();
    assert_eq!((stats.requests, stats.admitted, stats.refused, stats.unavailable), (10, 6, 4, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ip_behind_a_trusted_proxy_and_unlimited_routes() {
    let server = Server::start();
    // The test connects from 127.0.0.1, a trusted proxy in the example's settings.
    let (port, _) = start(&server, &settings()).await;
    fn from(ip: &str) -> [(&str, &str); 1] {
        [("x-forwarded-for", ip)]
    }
    for _ in 0..3 {
        assert_eq!(get(port, &from("203.0.113.7")).await.status, 200);
    }
    assert_eq!(get(port, &from("203.0.113.7")).await.status, 429);
    // A spoofed address prepended by the client does not give it a new limit.
    assert_eq!(get(port, &from("198.51.100.1, 203.0.113.7")).await.status, 429);
    // Another client behind the same proxy has its own limit; IPv6 clients by /64.
    assert_eq!(get(port, &from("203.0.113.8")).await.status, 200);
    for i in 1..=3 {
        let ip = format!("2001:db8:1:2::{i}");
        assert_eq!(get(port, &from(&ip)).await.status, 200);
    }
    assert_eq!(get(port, &from("2001:db8:1:2::ffff")).await.status, 429);
    // Untrusted proxies: with none trusted, the forwarded address is ignored (the peer,
    // 127.0.0.1, is the client).
    let (port2, _) = start(&server, &Settings { trusted_proxies: vec![], ..settings() }).await;
    for ip in ["192.0.2.1", "192.0.2.2", "192.0.2.3"] {
        assert_eq!(get(port2, &from(ip)).await.status, 200);
    }
    assert_eq!(get(port2, &from("192.0.2.4")).await.status, 429);
    // /health is not limited and carries no headers.
    for _ in 0..5 {
        let r = request(port, "GET", "/health", &[]).await;
        assert_eq!(r.status, 200);
        assert!(r.h("ratelimit").is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_refusals_are_resource_exhausted() {
    let server = Server::start();
    let (port, _) = start(&server, &settings()).await;
    let grpc = [("content-type", "application/grpc"), ("x-api-key", "grpc")];
    for _ in 0..3 {
        assert_eq!(request(port, "POST", "/", &grpc).await.status, 200);
    }
    let r = request(port, "POST", "/", &grpc).await;
    assert_eq!((r.status, r.h("grpc-status")), (200, Some("8")), "{:?}", r.headers);
    assert_eq!(r.h("content-type"), Some("application/grpc"));
    assert!(matches!(r.h("retry-after"), Some("19" | "20")), "{:?}", r.headers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_passes_everything_and_counts() {
    let server = Server::start();
    let (port, layer) = start(&server, &Settings { shadow: true, ..settings() }).await;
    let key = [("x-api-key", "carol")];
    for _ in 0..6 {
        let r = get(port, &key).await;
        assert_eq!(r.status, 200);
        assert!(r.h("retry-after").is_none());
        assert!(r.h("ratelimit").is_some());
    }
    let s = layer.stats();
    assert_eq!((s.admitted, s.shadow_passed, s.refused), (3, 3, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_is_503_under_fail_closed() {
    let mut server = Server::start();
    let (port, layer) = start(&server, &settings()).await;
    assert_eq!(get(port, &[("x-api-key", "dave")]).await.status, 200);
    server.kill9();
    // A key with no units held: nothing can decide it.
    for i in 0..3 {
        let r = get(port, &[("x-api-key", &format!("erin{i}"))]).await;
        assert_eq!(r.status, 503, "{:?}", r.headers);
        assert!(r.h("ratelimit").is_none() && r.h("retry-after").is_none(), "{:?}", r.headers);
    }
    assert_eq!(layer.stats().unavailable, 3);
    // Missing key header on the anonymous tier is limited by IP, also unavailable.
    assert_eq!(get(port, &[]).await.status, 503);
    // gRPC: UNAVAILABLE.
    let r = request(port, "POST", "/", &[("content-type", "application/grpc+proto"), ("x-api-key", "frank")]).await;
    assert_eq!((r.status, r.h("grpc-status")), (200, Some("14")));
    // Redis back: decisions resume within the breaker's cool-down (1 s) plus a reconnect.
    server.start_again();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = get(port, &[("x-api-key", "grace")]).await;
        if r.status == 200 {
            assert!(r.h("ratelimit").is_some(), "{:?}", r.headers);
            break;
        }
        assert_eq!(r.status, 503);
        assert!(std::time::Instant::now() < deadline, "still 503 30 s after Redis came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn client_readme_shows_the_doc_tested_three_lines() {
    let ours = include_str!("../README.md");
    let client = include_str!("../../README.md");
    let block = |text: &'static str, fence: &str| text.split(fence).nth(1).unwrap().split("```").next().unwrap();
    let three: Vec<&str> = block(client, "```rust,ignore\n").lines().collect();
    assert_eq!(three.len(), 3);
    let sample = block(ours, "```rust,no_run\n");
    for line in three {
        assert!(
            sample.lines().any(|l| l.trim() == line.trim()),
            "client/README.md's line is not in the doc-tested sample: {line}"
        );
    }
}
