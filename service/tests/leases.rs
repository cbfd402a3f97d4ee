//! Leases (LEASES=true): hot descriptors served from local reservations by the client crate's
//! engine. Two service instances on one redis-server: Redis sees a claim per batch (≤ 0.1
//! commands per request on a hot descriptor), the bound `c + r·(W + L)` holds in every window
//! (admitted requests counted in every 1 s window), and a request refused by a per-request
//! descriptor gives its leased units back (nothing consumed).

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::time::{Duration, Instant};

use common::Server;
use support::*;

const CONFIG: &str = "domain: l
descriptors:
  - key: api
    rate_limit: {requests_per_unit: 1000000, unit: second, algorithm: gcra}
  - key: tight
    rate_limit: {requests_per_unit: 200, unit: second, algorithm: gcra, burst: 50}
  - key: quota
    rate_limit: {requests_per_unit: 5, unit: hour}
  - key: login
    rate_limit: {requests_per_unit: 1, unit: hour, algorithm: sliding_log}
";

fn instances(redis: &Server, dir: &TempDir, n: usize) -> Vec<ServiceProc> {
    let url = format!("127.0.0.1:{}", redis.port);
    (0..n)
        .map(|_| {
            let s = ServiceProc::start(
                dir.path(),
                &["--redis-url", &url, "--leases", "true", "--instances", &n.to_string()],
            );
            s.wait_log("loaded rate limit configuration", Duration::from_secs(10));
            s
        })
        .collect()
}

/// Drives `loops` concurrent clients per instance for `secs`; returns the instants (since
/// the start) of the admitted requests and the number sent.
async fn hammer(svcs: &[ServiceProc], key: &str, loops: usize, secs: f64) -> (Vec<f64>, u64) {
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for s in svcs {
        for _ in 0..loops {
            let mut c = s.client().await;
            let key = key.to_string();
            tasks.push(tokio::spawn(async move {
                let (mut admitted, mut sent) = (Vec::new(), 0u64);
                while Instant::now() < end {
                    let r = ask(&mut c, request("l", vec![desc(&[(&key, "hot")])])).await;
                    sent += 1;
                    if ok(&r) {
                        admitted.push(start.elapsed().as_secs_f64());
                    }
                }
                (admitted, sent)
            }));
        }
    }
    let (mut all, mut sent) = (Vec::new(), 0);
    for t in tasks {
        let (a, s) = t.await.unwrap();
        all.extend(a);
        sent += s;
    }
    all.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (all, sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_descriptors_cost_a_claim_per_batch() {
    let redis = Server::start();
    let dir = TempDir::new("leases-hot");
    dir.write("l.yaml", CONFIG);
    let svcs = instances(&redis, &dir, 2);
    // Warm up: the first claims of each instance.
    hammer(&svcs, "api", 1, 0.3).await;
    let mut con = redis.conn();
    reset_stats(&mut con);
    let (admitted, sent) = hammer(&svcs, "api", 3, 2.0).await;
    let calls = command_calls(&mut con);
    let per_request = calls as f64 / sent as f64;
    println!(
        "leases, hot descriptor, 2 instances: {sent} requests, {calls} Redis commands ({per_request:.4} per request)"
    );
    assert_eq!(admitted.len() as u64, sent, "a limit far above the load admits everything");
    assert!(sent > 200, "the load ran ({sent})");
    assert!(per_request <= 0.1, "{calls} commands for {sent} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_holds_in_every_window() {
    let redis = Server::start();
    let dir = TempDir::new("leases-bound");
    dir.write("l.yaml", CONFIG);
    let svcs = instances(&redis, &dir, 2);
    let secs = 3.0;
    let (admitted, sent) = hammer(&svcs, "tight", 3, secs).await;
    // c = 50, r = 200/s, L = 1 s: at most 50 + 200 × (W + 1) in any window of W seconds.
    let (c, r, l) = (50.0, 200.0, 1.0);
    let mut worst = 0usize;
    let w = 1.0;
    let mut j = 0;
    for i in 0..admitted.len() {
        while admitted[i] - admitted[j] >= w {
            j += 1;
        }
        worst = worst.max(i - j + 1);
    }
    let bound = c + r * (w + l);
    println!(
        "leases, bound: {} admitted of {sent} in {secs} s; worst 1 s window {worst} (bound {bound}); whole run bound {}",
        admitted.len(),
        c + r * (secs + l)
    );
    assert!(sent as usize > admitted.len(), "the limit was binding");
    assert!((worst as f64) <= bound, "worst window {worst} > {bound}");
    assert!(admitted.len() as f64 <= c + r * (secs + l));
    assert!(admitted.len() as f64 >= r * (secs - 1.0) * 0.5, "the limit is served, not starved: {}", admitted.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_by_a_per_request_descriptor_gives_the_leased_units_back() {
    let redis = Server::start();
    let dir = TempDir::new("leases-mixed");
    dir.write("l.yaml", CONFIG);
    let svcs = instances(&redis, &dir, 1);
    let mut c = svcs[0].client().await;
    let both = || request("l", vec![desc(&[("quota", "q")]), desc(&[("login", "u")])]);
    // The sliding log (1/hour, checked per request) admits once, then refuses.
    assert!(ok(&ask(&mut c, both()).await));
    for _ in 0..10 {
        assert!(!ok(&ask(&mut c, both()).await));
    }
    // The leased fixed window (5/hour) lost nothing to the ten refusals: 4 more, then refused.
    for i in 0..4 {
        assert!(ok(&ask(&mut c, request("l", vec![desc(&[("quota", "q")])])).await), "quota request {i}");
    }
    assert!(!ok(&ask(&mut c, request("l", vec![desc(&[("quota", "q")])])).await));
}
