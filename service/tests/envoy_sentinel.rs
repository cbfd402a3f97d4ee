//! Envoy → the service → Sentinel-managed Redis, end to end (issue 35.5): the real Envoy (its
//! rate limit filter with docs/service.md's `timeout: 0.25s`, `failure_mode_deny: false`) in
//! front of the service with `REDIS_TYPE=sentinel`, a primary with the module, two replicas,
//! three sentinels (down after 500 ms). A limit is exhausted, then the primary fails (SIGKILL,
//! or SIGSTOP) under a request for a fresh user every 10 ms:
//!
//! * every request is answered by the service within Envoy's deadline (Envoy counts no error
//!   and no request let through by `failure_mode_deny: false`), in the gap with the domain's
//!   failure mode (`closed`: 429);
//! * afterwards the new primary decides (fresh users pass, a limit is counted to its end), and
//!   the exhausted limit is still exhausted: the failover reset nothing.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/sentinel.rs"]
mod sentinel;
mod support;

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sentinel::{replicated, Sentinels, MASTER};
use serde_json::json;
use support::envoy::*;
use support::*;

const LIMIT: usize = 5;

fn config() -> String {
    format!(
        "domain: envoy\nfailure_mode: closed\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: {LIMIT} }}\n"
    )
}

/// Statuses of `n` requests for `user`, one after another.
async fn statuses_for(envoy: &Envoy, user: &str, n: usize) -> Vec<u16> {
    statuses(&envoy.get_n(n, &[("x-user", user)]).await)
}

/// Every call Envoy made to the service so far was answered in time: Envoy counted no error and
/// let no request through by `failure_mode_deny: false`.
fn answered_in_time(envoy: &Envoy, svc: &ServiceProc) {
    for s in ["error", "failure_mode_allowed"] {
        let n = envoy.stat(&format!("cluster.upstream.ratelimit.{s}"));
        assert_eq!(n, 0, "cluster.upstream.ratelimit.{s}\n{}", svc.log());
    }
}

async fn failover_through_envoy(stop_it: bool) {
    let (mut primary, _replicas) = replicated(2);
    let sentinels = Sentinels::start(&primary, 3);
    let dir = TempDir::new("envoy-sentinel");
    dir.write("envoy.yaml", &config());
    let url = format!("{MASTER},{}", sentinels.addrs().join(","));
    let svc = ServiceProc::start_in_env(
        dir.path(),
        &[],
        &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", &url), ("REDIS_TIMEOUT", "100ms")],
    );
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let upstream = Upstream::start();
    let rate_limits = json!([{ "actions": [header_action("x-user", "user")] }]);
    let envoy = Envoy::start(
        &EnvoyConfig::new(&svc.grpc, upstream.port)
            .ratelimit("envoy", json!({ "timeout": "0.25s" }), rate_limits)
            .render(),
    );
    wait_until(Duration::from_secs(5), "decided by the primary", || {
        let rt = tokio::runtime::Handle::current();
        tokio::task::block_in_place(|| rt.block_on(envoy.get(&[("x-user", "first")]))).status == 200
    });
    // An exhausted limit, carried to the replicas before the failure.
    let spent = statuses_for(&envoy, "spent", LIMIT + 1).await;
    assert_eq!(spent, [vec![200; LIMIT], vec![429]].concat(), "{}", svc.log());
    let synced: i64 = redis::cmd("WAIT").arg(2).arg(2000).query(&mut primary.conn()).unwrap();
    assert_eq!(synced, 2);

    let watch = sentinels.watch_switch();
    // A fresh user every 10 ms: (sent, took, status).
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<(Instant, Duration, u16)>>> = Arc::default();
    let load = {
        let (stop, seen, port) = (stop.clone(), seen.clone(), envoy.port);
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let seen = seen.clone();
                tokio::spawn(async move {
                    let t = Instant::now();
                    let user = format!("u{n}");
                    let r = support::envoy::request(Ipv4Addr::LOCALHOST, port, "GET", "/", &[("x-user", &user)]).await;
                    seen.lock().unwrap().push((t, t.elapsed(), r.status));
                });
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let failed = Instant::now();
    if stop_it {
        assert!(std::process::Command::new("kill")
            .args(["-STOP", &primary.pid().unwrap().to_string()])
            .status()
            .unwrap()
            .success());
    } else {
        primary.kill9();
    }
    let (switched, new_port) = tokio::task::block_in_place(|| watch.wait(Duration::from_secs(20)));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    answered_in_time(&envoy, &svc);
    let seen = seen.lock().unwrap().clone();
    let slowest = seen.iter().map(|s| s.1).max().unwrap();
    // Envoy's deadline is 250 ms; the HTTP exchange through Envoy on a busy machine adds some.
    assert!(slowest < Duration::from_millis(750), "a request took {slowest:?}");
    let odd: Vec<_> = seen.iter().filter(|s| s.2 != 200 && s.2 != 429).collect();
    assert!(odd.is_empty(), "{odd:?}");
    // The gap: fresh users refused (closed) between the failure and the switch (its last
    // 150 ms aside: the test hears of the switch when the service may have).
    let gap: Vec<u16> = seen
        .iter()
        .filter(|s| s.0 > failed + Duration::from_millis(200) && s.0 + Duration::from_millis(150) < switched)
        .map(|s| s.2)
        .collect();
    assert!(!gap.is_empty() && gap.iter().all(|&s| s == 429), "the gap: {gap:?}");
    // Decided again after the switch (fresh users pass), and within a second of it.
    let first = seen
        .iter()
        .filter(|s| s.0 >= switched && s.2 == 200)
        .map(|s| s.0 + s.1)
        .min()
        .expect("passed after the switch");
    assert!(first - switched < Duration::from_secs(1), "first pass {:?} after the switch", first - switched);
    let (_, body) = svc.http("GET", "/healthcheck", "");
    assert!(body.contains(&format!("redis connected to 127.0.0.1:{new_port}")), "{body}");

    // The new primary decides: the exhausted limit is still exhausted, a new one is counted to
    // its end (a 429 for a fresh user would be the failure mode: there is none).
    let spent = statuses_for(&envoy, "spent", 2).await;
    let after = statuses_for(&envoy, "after", LIMIT + 1).await;
    // (A 200 that Envoy let through, the service not answering in time, is not a decision.)
    answered_in_time(&envoy, &svc);
    assert_eq!(spent, [429, 429], "the failover reset the exhausted limit\n{}", svc.log());
    assert_eq!(after, [vec![200; LIMIT], vec![429]].concat(), "{}", svc.log());
    primary.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_through_envoy() {
    failover_through_envoy(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_primary_through_envoy() {
    failover_through_envoy(true).await;
}
