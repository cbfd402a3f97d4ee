//! The service on a 3-primary Redis Cluster: descriptors whose keys hash to different slots
//! are still decided together (check every slot, then commit; a commit refused by a race is
//! given back with RL.RETURN … AGE), a refused request consumes nothing, concurrent requests
//! never admit more than the limit and leave exactly the admitted units on every other limit,
//! and with REDIS_CLUSTER_HASH_TAG=domain a request is one RL.MULTI.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::time::Duration;

use common::Cluster;
use redis::cluster_routing::get_slot;
use redis_ratelimit_client::spec::Algorithm;
use redis_ratelimit_service::pb::Code;
use redis_ratelimit_service::service::redis_key;
use support::*;

const CONFIG: &str = "domain: c
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: gcra}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_log}
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 20}
";

fn nodes(c: &Cluster) -> String {
    c.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect::<Vec<_>>().join(",")
}

fn total_calls(c: &Cluster) -> u64 {
    c.nodes.iter().map(|n| command_calls(&mut n.conn())).sum()
}

fn reset_all(c: &Cluster) {
    for n in &c.nodes {
        reset_stats(&mut n.conn());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_slot_requests_are_all_or_nothing() {
    let cluster = Cluster::start(3, 0);
    let dir = TempDir::new("cluster");
    dir.write("c.yaml", CONFIG);
    let svc = ServiceProc::start(dir.path(), &["--redis-type", "cluster", "--redis-url", &nodes(&cluster)]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;

    let four = |ip: &str| {
        request("c", vec![desc(&[("ip", ip)]), desc(&[("user", "u")]), desc(&[("tenant", "t")]), desc(&[("log", "l")])])
    };
    // The keys really are in different slots.
    let slots: std::collections::BTreeSet<u16> = [
        (Algorithm::Fixed, "ip", "a"),
        (Algorithm::Sliding, "user", "u"),
        (Algorithm::Gcra, "tenant", "t"),
        (Algorithm::SlidingLog, "log", "l"),
    ]
    .iter()
    .map(|(a, k, v)| get_slot(redis_key("rls:", false, *a, "c", &[(k, v)], &[]).as_bytes()))
    .collect();
    assert!(slots.len() >= 3, "the test needs several slots: {slots:?}");

    reset_all(&cluster);
    let r1 = ask(&mut c, four("a")).await;
    assert!(ok(&r1), "{r1:?}");
    assert_eq!(remaining(&r1), [1, 999, 999, 999]);
    let groups = slots.len() as u64;
    assert_eq!(total_calls(&cluster), 2 * groups, "admitted: a dry run and a commit per slot");
    ask(&mut c, four("a")).await;
    reset_all(&cluster);
    for _ in 0..3 {
        let r = ask(&mut c, four("a")).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert_eq!(codes(&r), [Code::OverLimit, Code::Ok, Code::Ok, Code::Ok]);
        assert_eq!(remaining(&r), [0, 998, 998, 998], "a refusal reports and keeps what remains");
    }
    assert_eq!(total_calls(&cluster), 3 * groups, "refused: the dry runs only, nothing written");
    let r = ask(&mut c, four("b")).await;
    assert!(ok(&r));
    assert_eq!(remaining(&r), [1, 997, 997, 997], "the refusals took nothing anywhere");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cross_slot_requests_never_exceed_and_refusals_are_given_back() {
    let cluster = Cluster::start(3, 0);
    let dir = TempDir::new("cluster-race");
    dir.write("c.yaml", CONFIG);
    let svc = ServiceProc::start(dir.path(), &["--redis-type", "cluster", "--redis-url", &nodes(&cluster)]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    // 8 clients × 12 requests, each [hot (20/hour, shared), user_i (1000/hour)]: exactly 20
    // admitted; each user limit holds exactly its client's admitted requests (refused ones,
    // even those refused in the commit phase by a race, were given back).
    let mut tasks = Vec::new();
    for i in 0..8 {
        let mut c = svc.client().await;
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u32;
            for _ in 0..12 {
                let r = ask(&mut c, request("c", vec![desc(&[("hot", "x")]), desc(&[("user", &format!("racer{i}"))])]))
                    .await;
                if ok(&r) {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut per_user = Vec::new();
    for t in tasks {
        per_user.push(t.await.unwrap());
    }
    assert_eq!(per_user.iter().sum::<u32>(), 20, "the shared limit admitted exactly its 20: {per_user:?}");
    let mut c = svc.client().await;
    for (i, n) in per_user.iter().enumerate() {
        let mut peek = request("c", vec![desc(&[("user", &format!("racer{i}"))])]);
        peek.descriptors[0].hits_addend = Some(0);
        let r = ask(&mut c, peek).await;
        assert_eq!(remaining(&r), [1000 - n], "racer{i}: only its admitted requests were counted");
    }
    println!(
        "cluster race: admitted per client {per_user:?}, compensations {}",
        svc.metric("ratelimit_service_cluster_compensations")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domain_hash_tags_make_a_request_one_command() {
    let cluster = Cluster::start(3, 0);
    let dir = TempDir::new("cluster-tag");
    dir.write("c.yaml", CONFIG);
    let svc = ServiceProc::start(
        dir.path(),
        &["--redis-type", "cluster", "--redis-url", &nodes(&cluster), "--redis-cluster-hash-tag", "domain"],
    );
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    let three = |ip: &str| request("c", vec![desc(&[("ip", ip)]), desc(&[("user", "u")]), desc(&[("tenant", "t")])]);
    ask(&mut c, three("warm")).await;
    reset_all(&cluster);
    for _ in 0..2 {
        assert!(ok(&ask(&mut c, three("x")).await));
    }
    let r = ask(&mut c, three("x")).await;
    assert_eq!(codes(&r), [Code::OverLimit, Code::Ok, Code::Ok]);
    assert_eq!(remaining(&r), [0, 997, 997]);
    assert_eq!(total_calls(&cluster), 3, "one RL.MULTI per request, routed to the domain's slot");
}
