//! Leases (LEASES=true): hot descriptors served from local reservations by the client crate's
//! engine. Two service instances on one redis-server: Redis sees a claim per batch (≤ 0.1
//! commands per request on a hot descriptor), the bound `c + r·(W + L)` holds in every window
//! (admitted requests counted in every 1 s window), and a request refused by a per-request
//! descriptor gives its leased units back (nothing consumed). Only hot values lease: cold ones
//! cost one command per request whatever the number of descriptors, a value switches to leases
//! at LEASE_HOT_REQUESTS and back when it cools, and hot and cold descriptors in one request
//! stay all or nothing.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::time::{Duration, Instant};

use common::Server;
use redis_ratelimit_service::pb::Code;
use support::*;

const CONFIG: &str = "domain: l
descriptors:
  - key: api
    rate_limit: {requests_per_unit: 1000000, unit: second, algorithm: gcra}
  - key: tight
    rate_limit: {requests_per_unit: 200, unit: second, algorithm: gcra, burst: 50}
  - key: window
    rate_limit: {requests_per_unit: 300, unit: second}
  - key: quota
    rate_limit: {requests_per_unit: 5, unit: hour}
  - key: login
    rate_limit: {requests_per_unit: 1, unit: hour, algorithm: sliding_log}
  - key: queue
    rate_limit: {requests_per_unit: 10, unit: second, algorithm: leaky, burst: 20}
  - key: log
    rate_limit: {requests_per_unit: 100, unit: hour, algorithm: sliding_log}
  - key: ip
    rate_limit: {requests_per_unit: 1000000, unit: second, algorithm: gcra}
  - key: user
    rate_limit: {requests_per_unit: 1000000, unit: second}
  - key: org
    rate_limit: {requests_per_unit: 1000000, unit: second, algorithm: token_bucket}
  - key: cap
    rate_limit: {requests_per_unit: 100, unit: hour}
  - key: busy
    rate_limit: {requests_per_unit: 1000000000, unit: hour}
  - key: block
    rate_limit: {requests_per_unit: 0, unit: hour}
";

fn instances(redis: &Server, dir: &TempDir, n: usize) -> Vec<ServiceProc> {
    instances_with(redis, dir, n, &[])
}

/// `n` instances with leases on and `extra` flags.
fn instances_with(redis: &Server, dir: &TempDir, n: usize, extra: &[&str]) -> Vec<ServiceProc> {
    let url = format!("127.0.0.1:{}", redis.port);
    (0..n)
        .map(|_| {
            let mut args = vec!["--redis-url", &url, "--leases", "true", "--instances"];
            let count = n.to_string();
            args.push(&count);
            args.extend_from_slice(extra);
            let s = ServiceProc::start(dir.path(), &args);
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

/// The most admitted requests in any window of `w` seconds (`admitted` sorted): the
/// simulator's sweep (client/sim/src/metrics.rs, `max_in_window`).
fn max_in_window(admitted: &[f64], w: f64) -> usize {
    let (mut best, mut lo) = (0, 0);
    for hi in 0..admitted.len() {
        while admitted[hi] - admitted[lo] > w {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

/// Two instances on binding limits, counted as the simulator counts: every admitted request,
/// in every window of length W = the period and W = the period ÷ 10. A bucket (GCRA, c = 50,
/// r = 200/s) admits at most `c + r·(W + L)`; a fixed window (300/s) at most its limit per
/// window a span of W touches (a lease never outlives the window its units were counted in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_holds_in_every_window() {
    let redis = Server::start();
    let dir = TempDir::new("leases-bound");
    dir.write("l.yaml", CONFIG);
    let svcs = instances(&redis, &dir, 2);
    let l = 1.0;
    let secs = 3.0;
    let (admitted, sent) = hammer(&svcs, "tight", 3, secs).await;
    let (c, r) = (50.0, 200.0);
    assert!(sent as usize > admitted.len(), "the limit was binding");
    for w in [1.0, 0.1] {
        let worst = max_in_window(&admitted, w);
        let bound = c + r * (w + l);
        println!("leases, gcra: {} admitted of {sent}; worst {w} s window {worst} (bound {bound})", admitted.len());
        assert!((worst as f64) <= bound, "gcra: worst {w} s window {worst} > {bound}");
    }
    assert!(admitted.len() as f64 <= c + r * (secs + l));
    assert!(admitted.len() as f64 >= r * (secs - 1.0) * 0.5, "the limit is served, not starved: {}", admitted.len());

    let secs = 2.5;
    let (admitted, sent) = hammer(&svcs, "window", 3, secs).await;
    let limit = 300.0;
    assert!(sent as usize > admitted.len(), "the window was binding");
    for w in [1.0f64, 0.1] {
        let worst = max_in_window(&admitted, w);
        let bound = limit * ((w / 1.0).ceil() + 1.0);
        println!("leases, fixed: {} admitted of {sent}; worst {w} s window {worst} (bound {bound})", admitted.len());
        assert!((worst as f64) <= bound, "fixed: worst {w} s window {worst} > {bound}");
    }
    assert!(admitted.len() as f64 <= limit * (secs.ceil() + 1.0));
    assert!(admitted.len() as f64 >= limit * (secs - 1.0) * 0.5, "the window is served: {}", admitted.len());
    // The hot values were leased on each instance (after their first LEASE_HOT_REQUESTS).
    for s in &svcs {
        let (hot, cold) =
            (s.metric("ratelimit_service_lease_hot_checks"), s.metric("ratelimit_service_lease_cold_checks"));
        println!("leases: {hot} checks from leases, {cold} per request");
        assert!(s.metric("ratelimit_service_lease_claims") > 0 && hot > 10 * cold, "{hot} leased, {cold} not");
    }
}

/// Cold values of leased rules are decided per request (LEASES=true, the default
/// LEASE_HOT_REQUESTS): a stream of requests over ever new values costs exactly one Redis
/// command per request, one RL.MULTI for several descriptors, and nothing is claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_values_cost_one_command_per_request_whatever_the_descriptors() {
    let redis = Server::start();
    let dir = TempDir::new("leases-cold");
    dir.write("l.yaml", CONFIG);
    let svcs = instances(&redis, &dir, 1);
    let mut con = redis.conn();
    let mut total = 0;
    for n in [1usize, 3] {
        reset_stats(&mut con);
        let mut tasks = Vec::new();
        for w in 0..4 {
            let mut c = svcs[0].client().await;
            tasks.push(tokio::spawn(async move {
                for i in 0..100 {
                    let v = format!("{n}-{w}-{i}");
                    let d = ["ip", "user", "org"][..n].iter().map(|k| desc(&[(k, v.as_str())])).collect();
                    assert!(ok(&ask(&mut c, request("l", d)).await));
                }
                100u64
            }));
        }
        let mut sent = 0;
        for t in tasks {
            sent += t.await.unwrap();
        }
        total += sent * n as u64;
        let calls = command_calls(&mut con);
        println!("leases, {n} cold descriptor(s): {sent} requests, {calls} Redis commands");
        assert_eq!(calls, sent, "{n} descriptor(s): one command per request");
        let one = if n == 1 { "rl.gcra" } else { "rl.multi" };
        assert_eq!(command_calls_of(&mut con, one), sent, "{n} descriptor(s): {one}");
    }
    let m = |k: &str| svcs[0].metric(&format!("ratelimit_service_lease_{k}"));
    assert_eq!((m("claims"), m("hot_checks"), m("cold_checks")), (0, 0, total), "nothing leased");
}

/// A value of a leased rule is checked per request until this instance has seen it
/// LEASE_HOT_REQUESTS (20) times within LEASE_HOT_WINDOW, then leases (≤ 0.1 Redis commands per
/// request once its batches have grown); when it cools (a window with fewer than half) it is
/// checked per request again, and what its limiter held has gone back (RL.RETURN: a fixed
/// window of an hour, whose returned units are credited; a fast bucket's would be worth nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_value_switches_to_leases_and_back() {
    let redis = Server::start();
    let dir = TempDir::new("leases-switch");
    dir.write("l.yaml", CONFIG);
    let svcs = instances_with(&redis, &dir, 1, &["--lease-hot-window", "500ms"]);
    let m = |k: &str| svcs[0].metric(&format!("ratelimit_service_lease_{k}"));
    let mut c = svcs[0].client().await;
    let mut con = redis.conn();
    reset_stats(&mut con);
    let hot = || request("l", vec![desc(&[("busy", "hot")])]);
    for _ in 0..19 {
        assert!(ok(&ask(&mut c, hot()).await));
    }
    assert_eq!(command_calls(&mut con), 19, "per request while not hot");
    assert_eq!(command_calls_of(&mut con, "rl.fixed"), 19);
    assert_eq!((m("claims"), m("cold_checks")), (0, 19));
    // The 20th request within the window: the value leases from now on.
    assert!(ok(&ask(&mut c, hot()).await));
    assert_eq!((m("claims"), m("hot_checks"), m("hot_values")), (1, 1, 1));

    // Its batches grow with the demand the engine sees (τ = 1 s): warm up, then measure.
    hammer(&svcs, "busy", 3, 1.5).await;
    reset_stats(&mut con);
    let (admitted, sent) = hammer(&svcs, "busy", 3, 1.5).await;
    let calls = command_calls(&mut con);
    println!("leases, a value turned hot: {sent} requests, {calls} Redis commands");
    assert_eq!(admitted.len() as u64, sent);
    assert!(sent > 200 && calls as f64 <= 0.1 * sent as f64, "{calls} commands for {sent} requests");

    // Idle for more than two windows (and L/2): cooled, and its units went back.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!((m("hot_values"), m("units_held")), (0, 0));
    assert!(m("units_returned") > 0, "held units given back with RL.RETURN");
    let (claims, cold) = (m("claims"), m("cold_checks"));
    reset_stats(&mut con);
    assert!(ok(&ask(&mut c, hot()).await));
    assert_eq!(command_calls_of(&mut con, "rl.fixed"), 1, "checked per request again");
    assert_eq!((m("claims"), m("cold_checks")), (claims, cold + 1));
}

/// All or nothing with a hot (leased) descriptor and cold (per-request) ones in one request: a
/// refusal by the cold descriptor gives the leased unit back locally, a refusal by the leased
/// one makes the cold check a dry run; in both cases nothing is taken from any limit. A lease
/// of 60 s (nothing held expires during the test) and a 10 s window (the value stays hot) make
/// the counts exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_and_cold_descriptors_together_are_all_or_nothing() {
    let redis = Server::start();
    let dir = TempDir::new("leases-hot-cold");
    dir.write("l.yaml", CONFIG);
    let svcs = instances_with(&redis, &dir, 1, &["--lease-length", "60s", "--lease-hot-window", "10s"]);
    let m = |k: &str| svcs[0].metric(&format!("ratelimit_service_lease_{k}"));
    let mut c = svcs[0].client().await;
    let cap = || desc(&[("cap", "hot")]);
    // cap (fixed, 100/hour) turns hot: 19 per request, then leased.
    for i in 0..20 {
        assert!(ok(&ask(&mut c, request("l", vec![cap()])).await), "cap request {i}");
    }
    assert_eq!((m("hot_values"), m("claims") > 0), (1, true));
    // With a cold quota (5/hour): 5 admitted, then refused by the quota alone.
    let with_quota = |q: &str| request("l", vec![cap(), desc(&[("quota", q)])]);
    for i in 0..5 {
        assert!(ok(&ask(&mut c, with_quota("a")).await), "mixed request {i}");
    }
    for _ in 0..10 {
        assert_eq!(codes(&ask(&mut c, with_quota("a")).await), [Code::Ok, Code::OverLimit]);
    }
    // Hot + two cold descriptors, served locally + one RL.MULTI: one command per request (and
    // whatever the leased limiter sends on its own, counted by its metrics).
    let mut con = redis.conn();
    reset_stats(&mut con);
    let calls0 = m("redis_calls");
    for i in 0..5 {
        let r = request("l", vec![cap(), desc(&[("quota", "b")]), desc(&[("ip", &format!("ip{i}"))])]);
        assert!(ok(&ask(&mut c, r).await), "three descriptors {i}");
    }
    assert_eq!(command_calls_of(&mut con, "rl.multi"), 5);
    assert_eq!(command_calls(&mut con), 5 + (m("redis_calls") - calls0));
    // cap has admitted 20 + 5 + 5: the ten refused requests took nothing from it.
    let mut admitted = 0;
    while ok(&ask(&mut c, request("l", vec![cap()])).await) {
        admitted += 1;
        assert!(admitted <= 70, "cap admits more than its limit");
    }
    assert_eq!(admitted, 70, "cap lost nothing to the refused requests");
    assert!(m("hot_checks") >= 70, "cap was leased throughout");
    // cap refuses now (from its leases): the cold quota is only peeked at, never taken.
    for _ in 0..5 {
        assert_eq!(codes(&ask(&mut c, with_quota("c")).await), [Code::OverLimit, Code::Ok]);
    }
    let quota = |q: &str| request("l", vec![desc(&[("quota", q)])]);
    for i in 0..5 {
        assert!(ok(&ask(&mut c, quota("c")).await), "quota c lost nothing: request {i}");
    }
    assert!(!ok(&ask(&mut c, quota("c")).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_by_a_per_request_descriptor_gives_the_leased_units_back() {
    let redis = Server::start();
    let dir = TempDir::new("leases-mixed");
    dir.write("l.yaml", CONFIG);
    // Every value leases from its first request (LEASE_HOT_REQUESTS=1): the quota is leased.
    let svcs = instances_with(&redis, &dir, 1, &["--lease-hot-requests", "1"]);
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

    // With LEASES=true the sliding log and the leaky bucket are still checked per request:
    // one module command each, no claim.
    let mut con = redis.conn();
    reset_stats(&mut con);
    for i in 0..5 {
        assert!(ok(&ask(&mut c, request("l", vec![desc(&[("queue", "q")])])).await), "leaky request {i}");
        assert!(ok(&ask(&mut c, request("l", vec![desc(&[("log", "q")])])).await), "log request {i}");
    }
    assert_eq!(command_calls_of(&mut con, "rl.leaky"), 5);
    assert_eq!(command_calls_of(&mut con, "rl.slidinglog"), 5);
    assert_eq!(command_calls(&mut con), 10, "nothing else: no claim, no return");
}

/// Issue 31.1: a request refused without asking Redis (a blocklist entry, or more hits than
/// another descriptor's capacity) takes nothing from a leased descriptor: its 5 per hour are
/// all left after 20 such refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_refusal_takes_nothing_from_a_leased_descriptor() {
    let redis = Server::start();
    let dir = TempDir::new("leases-local-refusal");
    dir.write("l.yaml", CONFIG);
    let svcs = instances_with(&redis, &dir, 1, &["--lease-hot-requests", "1"]);
    let mut c = svcs[0].client().await;
    let quota = || desc(&[("quota", "q")]);
    for _ in 0..10 {
        let r = ask(&mut c, request("l", vec![quota(), desc(&[("block", "b")])])).await;
        assert_eq!(codes(&r), [Code::Ok, Code::OverLimit]);
        let mut over = desc(&[("cap", "c")]);
        over.hits_addend = Some(101);
        let r = ask(&mut c, request("l", vec![quota(), over])).await;
        assert_eq!(codes(&r), [Code::Ok, Code::OverLimit]);
    }
    for i in 0..5 {
        assert!(ok(&ask(&mut c, request("l", vec![quota()])).await), "quota request {i}");
    }
    assert!(!ok(&ask(&mut c, request("l", vec![quota()])).await));
}

/// Redis killed and restarted under each failure mode, with every descriptor served from
/// leases: the modes map to the engine's policies (error: UNAVAILABLE; open; closed; local:
/// the limit ÷ INSTANCES), and once Redis is back every domain is decided by Redis again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_under_each_failure_mode_with_leases() {
    let mut redis = Server::start();
    let dir = failure_mode_configs("leases-failures", "lp", "hour");
    let url = format!("127.0.0.1:{}", redis.port);
    let svc = ServiceProc::start(
        dir.path(),
        &[
            "--redis-url",
            &url,
            "--leases",
            "true",
            "--instances",
            "2",
            "--redis-timeout",
            "200ms",
            "--redis-breaker-cool-down",
            "300ms",
            // Every value leases from its first request: the failure modes are the engine's.
            "--lease-hot-requests",
            "1",
        ],
    );
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    let req = |m: &str, v: &str| request(&format!("lp_{m}"), vec![desc(&[("k", v)])]);
    for m in ["error", "open", "closed", "local"] {
        assert!(ok(&ask(&mut c, req(m, "up")).await), "{m} with Redis up");
    }
    assert!(svc.metric("ratelimit_service_lease_claims") >= 4, "the descriptors were leased");

    redis.kill9();
    // Fresh keys: nothing is held locally for them, so only the failure mode can answer.
    for i in 0..6 {
        let e = c.should_rate_limit(req("error", &format!("down{i}"))).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    }
    for i in 0..4 {
        assert!(ok(&ask(&mut c, req("open", &format!("down{i}"))).await), "open admits while Redis is down");
        let r = ask(&mut c, req("closed", &format!("down{i}"))).await;
        assert_eq!(codes(&r), [Code::OverLimit], "closed refuses while Redis is down");
    }
    // local: this instance's share, 4 / 2 instances = 2 per hour for one key.
    let mut local = Vec::new();
    for _ in 0..4 {
        local.push(ok(&ask(&mut c, req("local", "down")).await));
    }
    assert_eq!(local, [true, true, false, false], "local fallback at limit ÷ instances");

    redis.start_again();
    // Redis decides again: a fresh key is admitted with what Redis says remains (the claim's
    // answer), in every mode.
    for m in ["error", "open", "closed", "local"] {
        let mut n = 0;
        wait_until(Duration::from_secs(15), &format!("{m} decided by Redis again"), || {
            n += 1;
            let rt = tokio::runtime::Handle::current();
            let r = tokio::task::block_in_place(|| rt.block_on(c.should_rate_limit(req(m, &format!("back{n}")))));
            matches!(r, Ok(r) if ok(r.get_ref()) && r.get_ref().statuses[0].limit_remaining > 0)
        });
    }
    // And the keys Redis saw are in Redis: a key admitted after the restart is counted there.
    let mut con = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("rls:fixed:lp_*").query(&mut con).unwrap();
    assert!(!keys.is_empty(), "claims reached the restarted server");
}

/// `lease` per rule: `lease: true` leases a rule of a service started without LEASES, and
/// `lease: false` keeps a rule per request in one started with LEASES=true.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_chosen_per_rule() {
    let redis = Server::start();
    let dir = TempDir::new("leases-per-rule");
    dir.write(
        "r.yaml",
        "domain: r
descriptors:
  - key: leased
    rate_limit: {requests_per_unit: 100000, unit: second, lease: true}
  - key: exact
    rate_limit: {requests_per_unit: 100000, unit: second, lease: false}
  - key: default
    rate_limit: {requests_per_unit: 100000, unit: second}
",
    );
    let url = format!("127.0.0.1:{}", redis.port);
    let mut con = redis.conn();
    let n = 400u64;
    for (leases, leased) in [("false", ["leased"].as_slice()), ("true", ["leased", "default"].as_slice())] {
        let svc = ServiceProc::start(dir.path(), &["--redis-url", &url, "--leases", leases]);
        svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
        let mut c = svc.client().await;
        for key in ["leased", "exact", "default"] {
            // A warm-up, then n more requests: the leased rule claims in batches sized to the
            // demand it has seen, the others send one RL.FIXED per request.
            for _ in 0..100 {
                ask(&mut c, request("r", vec![desc(&[(key, leases)])])).await;
            }
            reset_stats(&mut con);
            for _ in 0..n {
                assert!(ok(&ask(&mut c, request("r", vec![desc(&[(key, leases)])])).await));
            }
            let calls = command_calls(&mut con);
            if leased.contains(&key) {
                println!("LEASES={leases}, rule {key}: {calls} commands for {n} requests");
                // (About 0.05 per request here; a quarter leaves room for a loaded machine.)
                assert!(calls * 4 <= n, "LEASES={leases}, rule {key}: {calls} commands for {n} requests");
            } else {
                // (What the leased rule holds may go back meanwhile: RL.RETURN, not counted.)
                let returns = command_calls_of(&mut con, "rl.return");
                assert_eq!(calls - returns, n, "LEASES={leases}, rule {key}: one command per request");
                assert_eq!(command_calls_of(&mut con, "rl.fixed"), n, "LEASES={leases}, rule {key}");
            }
        }
    }
}

/// At SIGTERM a service gives back what it holds: after it exits, Redis counts exactly the
/// requests it admitted, not the batches it claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_gives_the_held_units_back() {
    let redis = Server::start();
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let dir = TempDir::new("leases-sigterm");
    dir.write("t.yaml", "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1000, unit: hour}\n");
    let url = format!("127.0.0.1:{}", redis.port);
    // A long lease: nothing held expires during the test, so only the shutdown gives it back.
    let mut svc = ServiceProc::start(dir.path(), &["--redis-url", &url, "--leases", "true", "--lease-length", "60s"]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    let n = 200u32;
    for i in 0..n {
        assert!(ok(&ask(&mut c, request("t", vec![desc(&[("k", "v")])])).await), "request {i}");
    }
    let mut con = redis.conn();
    // What Redis counts: a peek (COST 0) at the key the service uses.
    let mut counted = || {
        let r: Vec<i64> = redis::cmd("RL.FIXED")
            .arg("rls:fixed:t|k=v")
            .arg(1000)
            .arg("3600s")
            .arg("COST")
            .arg(0)
            .query(&mut con)
            .unwrap();
        1000 - r[2]
    };
    let held = counted();
    assert!(held > n as i64, "the service holds claimed units it has not used ({held} counted for {n} admitted)");
    assert!(svc.terminate(), "a clean exit at SIGTERM");
    assert_eq!(counted(), n as i64, "after the shutdown Redis counts the admitted requests only");
}

/// Issue 31.3 on the leased path: with every value leased from its first request and Redis
/// stalled (SIGSTOP), a new value's claim cannot be answered; each call (grpc-timeout 100 ms)
/// is answered before its timeout by its domain's failure mode, and the stalled claims were
/// cut by the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_descriptor_behind_a_stalled_redis_answers_before_the_grpc_timeout() {
    let redis = Server::start();
    let dir = failure_mode_configs("leases-deadline", "p", "minute");
    let svcs = instances_with(&redis, &dir, 2, &["--lease-hot-requests", "1"]);
    let mut c = svcs[0].client().await;
    for m in FAILURE_MODES {
        assert!(ok(&ask(&mut c, request(&format!("p_{m}"), vec![desc(&[("k", "up")])])).await), "{m}, Redis up");
    }
    let hot = svcs[0].metric("ratelimit_service_lease_hot_checks");
    assert!(hot >= 4, "the values were leased: {hot} leased checks");
    let pid = redis.pid().unwrap();
    signal(pid, "-STOP");
    for i in 0..5 {
        assert_failure_modes_answer_in_time(&mut c, "p", &[format!("stalled{i}")], Duration::from_millis(100)).await;
    }
    signal(pid, "-CONT");
    assert!(svcs[0].metric("ratelimit_service_lease_hot_checks") >= hot + 20, "the stalled values were leased too");
}
