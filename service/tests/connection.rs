//! The service over the connection layer, against real redis-server processes (issue 31.4–6,
//! 35.6):
//!
//! * with Redis stalled (SIGSTOP), each of 100 concurrent requests is answered (with the
//!   domain's failure mode) within REDIS_TIMEOUT plus scheduling slack, on live connections
//!   and on a service that starts while Redis is stalled (connecting);
//! * with Redis refusing connections, requests are answered at once, not after
//!   REDIS_POOL_SIZE × REDIS_TIMEOUT;
//! * a service started while Redis is away serves with the failure mode under load, never
//!   exits, and answers from Redis within 0.5 s of Redis being up, its breaker open or not;
//! * a service idle across a Redis restart answers its next request from Redis.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::time::{Duration, Instant};

use common::Server;
use redis_ratelimit_service::pb::Code;
use support::*;

/// Scheduling slack over the Redis timeout, for a request through gRPC on a busy 2-CPU host.
const SLACK: Duration = Duration::from_millis(100);

fn signal(s: &Server, sig: &str) {
    let st = std::process::Command::new("kill").args([sig, &s.pid().unwrap().to_string()]).status().unwrap();
    assert!(st.success());
}

/// `n` concurrent requests for distinct keys of `domain`: how long each took, and whether it
/// was admitted (Err: the gRPC status code).
async fn concurrent(svc: &ServiceProc, domain: &str, n: usize) -> Vec<(Duration, Result<Code, tonic::Code>)> {
    let c = svc.client().await;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let mut c = c.clone();
            let r = request(domain, vec![desc(&[("k", &format!("c{i}"))])]);
            tokio::spawn(async move {
                let t = Instant::now();
                let r = c.should_rate_limit(r).await;
                (t.elapsed(), r.map(|r| r.into_inner().overall_code()).map_err(|e| e.code()))
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Requests a fresh key of `domain` every 10 ms until Redis decides it (remaining 3 of 4:
/// the failure modes report 0); how long that took.
async fn until_redis_decides(svc: &ServiceProc, domain: &str, limit: Duration) -> Duration {
    let mut c = svc.client().await;
    let t = Instant::now();
    for n in 0.. {
        let r = c.should_rate_limit(request(domain, vec![desc(&[("k", &format!("back{n}"))])])).await;
        if matches!(&r, Ok(r) if remaining(r.get_ref()) == [3]) {
            return t.elapsed();
        }
        assert!(t.elapsed() < limit, "{domain} not decided by Redis within {limit:?}:\n{}", svc.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_end_by_the_redis_timeout_while_redis_is_stalled() {
    let redis = Server::start();
    let dir = failure_mode_configs("stalled-conn", "p", "hour");
    let url = format!("127.0.0.1:{}", redis.port);
    // The breaker never opens here: every request goes to the stalled Redis.
    let args = ["--redis-url", &url, "--redis-timeout", "100ms", "--redis-breaker-failures", "1000000"];
    let svc = ServiceProc::start(dir.path(), &args);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    until_redis_decides(&svc, "p_open", Duration::from_secs(5)).await;
    signal(&redis, "-STOP");
    let on_live = concurrent(&svc, "p_open", 100).await;
    // A service started while Redis is stalled: its connections are being made (the kernel
    // accepts, Redis never answers the handshake).
    let fresh = ServiceProc::start(dir.path(), &args);
    fresh.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let on_fresh = concurrent(&fresh, "p_open", 100).await;
    signal(&redis, "-CONT");
    for (what, results) in [("live", &on_live), ("connecting", &on_fresh)] {
        let worst = results.iter().map(|r| r.0).max().unwrap();
        assert!(worst <= Duration::from_millis(100) + SLACK, "{what}: a request took {worst:?}");
        assert!(results.iter().all(|r| r.1 == Ok(Code::Ok)), "{what}: open admits: {results:?}");
    }
    until_redis_decides(&svc, "p_closed", Duration::from_secs(3)).await;
    until_redis_decides(&fresh, "p_closed", Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_answered_at_once_while_redis_refuses_connections() {
    let mut redis = Server::start();
    let dir = failure_mode_configs("refused-conn", "p", "hour");
    let url = format!("127.0.0.1:{}", redis.port);
    let svc = ServiceProc::start(
        dir.path(),
        &[
            "--redis-url",
            &url,
            "--redis-timeout",
            "1s",
            "--redis-pool-size",
            "4",
            "--redis-breaker-failures",
            "1000000",
        ],
    );
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    until_redis_decides(&svc, "p_closed", Duration::from_secs(5)).await;
    redis.kill9();
    let results = concurrent(&svc, "p_closed", 100).await;
    let worst = results.iter().map(|r| r.0).max().unwrap();
    assert!(worst <= SLACK, "a request took {worst:?} while Redis refused connections (REDIS_TIMEOUT 1s)");
    assert!(results.iter().all(|r| r.1 == Ok(Code::OverLimit)), "closed refuses: {results:?}");
    let (status, body) = svc.http("GET", "/healthcheck", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("redis unavailable:"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_started_without_redis_serves_and_answers_from_redis_once_it_is_up() {
    let mut redis = Server::start();
    redis.kill9();
    let dir = failure_mode_configs("lazy-conn", "p", "hour");
    let url = format!("127.0.0.1:{}", redis.port);
    // The README's timeouts (REDIS_TIMEOUT 50 ms) and the default breaker (5 failures, 1 s).
    let mut svc = ServiceProc::start(dir.path(), &["--redis-url", &url, "--redis-timeout", "50ms"]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    // Under load for 1.5 s: answered by the failure mode, and the process stays.
    let t = Instant::now();
    let mut answered = 0;
    while t.elapsed() < Duration::from_millis(1500) {
        let results = concurrent(&svc, "p_closed", 20).await;
        assert!(results.iter().all(|r| r.1 == Ok(Code::OverLimit)), "closed refuses: {results:?}");
        answered += results.len();
    }
    assert!(svc.running(), "the service exited:\n{}", svc.log());
    assert!(svc.metric("ratelimit_service_breaker_opens") >= 1, "the breaker opened");
    let (status, body) = svc.http("GET", "/healthcheck", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("redis unavailable:"), "{body}");
    // Redis up: decided by Redis within 0.5 s, though the breaker was open.
    redis.start_again();
    let took = until_redis_decides(&svc, "p_closed", Duration::from_secs(3)).await;
    assert!(
        took <= Duration::from_millis(500),
        "decided by Redis {took:?} after it was up ({answered} answered before)"
    );
    let (_, body) = svc.http("GET", "/healthcheck", "");
    assert!(body.contains(&format!("redis connected to 127.0.0.1:{}", redis.port)), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_idle_across_a_restart_answers_its_next_request_from_redis() {
    let mut redis = Server::start();
    let dir = failure_mode_configs("idle-conn", "p", "hour");
    let url = format!("127.0.0.1:{}", redis.port);
    let svc = ServiceProc::start(dir.path(), &["--redis-url", &url, "--redis-timeout", "100ms"]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    until_redis_decides(&svc, "p_closed", Duration::from_secs(5)).await;
    redis.kill9();
    std::thread::sleep(Duration::from_secs(3));
    redis.start_again();
    std::thread::sleep(Duration::from_millis(500));
    // No request since the restart: the first one is decided by Redis (fail-closed would
    // refuse it with remaining 0).
    let mut c = svc.client().await;
    let r = ask(&mut c, request("p_closed", vec![desc(&[("k", "first")])])).await;
    assert_eq!((codes(&r), remaining(&r)), (vec![Code::Ok], vec![3]), "{r:?}\n{}", svc.log());
}
