//! The service on a 3-primary Redis Cluster: descriptors whose keys hash to different slots
//! are still decided together (check every slot, then commit; a commit refused by a race is
//! given back with RL.RETURN … AGE), a refused request consumes nothing, concurrent requests
//! never admit more than the limit and leave exactly the admitted units on every other limit,
//! and with REDIS_CLUSTER_HASH_TAG=domain a request is one RL.MULTI. And a cluster whose nodes
//! listen only on TLS, with docs/operations.md's settings as written (issue 35.2). And
//! docs/service.md's Redis user, with the cluster's grants, as the service's only user.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;
#[path = "../../tests/common/tls.rs"]
mod tls;

use std::time::Duration;

use common::Cluster;
use redis::cluster_routing::Slot;
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
    let slots: std::collections::HashSet<Slot> = [
        (Algorithm::Fixed, "ip", "a"),
        (Algorithm::Sliding, "user", "u"),
        (Algorithm::Gcra, "tenant", "t"),
        (Algorithm::SlidingLog, "log", "l"),
    ]
    .iter()
    .map(|(a, k, v)| Slot::for_key(redis_key("rls:", false, *a, "c", &[(k, v)], &[])))
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

const LEASED: &str = "domain: lc
descriptors:
  - key: api
    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: gcra}
  - key: quota
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_log}
";

/// Leases on a cluster: the limiters' claims and returns are routed to each key's primary; a
/// hot descriptor costs a claim per batch, a shared limit is never exceeded by concurrent
/// clients, and a request mixing a leased descriptor with a per-request one in another slot
/// stays all or nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_a_cluster() {
    let cluster = Cluster::start(3, 0);
    let dir = TempDir::new("cluster-leases");
    dir.write("lc.yaml", LEASED);
    let svc = ServiceProc::start(
        dir.path(),
        // Every value leases from its first request: the race and the mix are the leased path.
        &["--redis-type", "cluster", "--redis-url", &nodes(&cluster), "--leases", "true", "--lease-hot-requests", "1"],
    );
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let hot = || request("lc", vec![desc(&[("api", "hot")])]);
    let mut c = svc.client().await;
    for _ in 0..20 {
        assert!(ok(&ask(&mut c, hot()).await));
    }
    reset_all(&cluster);
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let mut c = svc.client().await;
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            let end = std::time::Instant::now() + Duration::from_millis(1500);
            while std::time::Instant::now() < end {
                assert!(ok(&ask(&mut c, hot()).await));
                n += 1;
            }
            n
        }));
    }
    let mut sent = 0;
    for t in tasks {
        sent += t.await.unwrap();
    }
    let calls = total_calls(&cluster);
    println!("cluster leases, hot descriptor: {sent} requests, {calls} Redis commands");
    assert!(sent > 100, "the load ran ({sent})");
    assert!(calls as f64 / sent as f64 <= 0.1, "{calls} commands for {sent} requests");

    // 8 clients race for the leased 20/hour: never more than 20 admitted.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut c = svc.client().await;
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u32;
            for _ in 0..6 {
                if ok(&ask(&mut c, request("lc", vec![desc(&[("quota", "shared")])])).await) {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    assert_eq!(admitted, 20, "the leased limit admits exactly its 20 among 48 requests");

    // Leased fixed window + per-request sliding log, in different slots: the leased window
    // refuses once its 20 are gone, and the refused requests take nothing from the log.
    let both = |q: &str| request("lc", vec![desc(&[("quota", q)]), desc(&[("log", "l")])]);
    let k = |a, key, v| Slot::for_key(redis_key("rls:", false, a, "lc", &[(key, v)], &[]));
    assert_ne!(k(Algorithm::Fixed, "quota", "mixed"), k(Algorithm::SlidingLog, "log", "l"), "two slots");
    for _ in 0..20 {
        assert!(ok(&ask(&mut c, both("mixed")).await));
    }
    for _ in 0..5 {
        let r = ask(&mut c, both("mixed")).await;
        assert_eq!(codes(&r), [Code::OverLimit, Code::Ok]);
    }
    let mut peek = request("lc", vec![desc(&[("log", "l")])]);
    peek.descriptors[0].hits_addend = Some(0);
    assert_eq!(remaining(&ask(&mut c, peek).await), [980], "the log holds only the 20 admitted requests");
}

/// docs/operations.md's "Cluster over TLS" settings as written (the nodes and the CA file
/// replaced by the test's) against three primaries that listen only on TLS: a request across
/// slots decided and its limit enforced; a wrong CA serves the failure mode and
/// /healthcheck names the certificate problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_listens_only_on_tls() {
    let certs = tls::Certs::generate();
    let (_cluster, addrs) = certs.tls_only_cluster(3);
    let dir = TempDir::new("cluster-tls");
    dir.write("c.yaml", &CONFIG.replacen("domain: c\n", "domain: c\nfailure_mode: closed\n", 1));
    let env = |ca: &str| {
        doc_env("docs/operations.md", "cluster-tls", |k, v| match (k, v.strip_prefix("/etc/redis-tls/")) {
            ("REDIS_URL", _) => addrs.join(","),
            (_, Some(_)) => certs.path(ca).display().to_string(),
            _ => v.to_string(),
        })
    };
    let svc = ServiceProc::start_in_env(dir.path(), &[], &env_refs(&env("ca.crt")));
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    let four = || {
        request(
            "c",
            vec![desc(&[("ip", "a")]), desc(&[("user", "u")]), desc(&[("tenant", "t")]), desc(&[("log", "l")])],
        )
    };
    let r = ask(&mut c, four()).await;
    assert_eq!(remaining(&r), [1, 999, 999, 999], "{r:?}\n{}", svc.log());
    assert_eq!(remaining(&ask(&mut c, four()).await), [0, 998, 998, 998]);
    let r = ask(&mut c, four()).await;
    assert_eq!(r.overall_code(), Code::OverLimit, "{r:?}");
    let (_, body) = svc.http("GET", "/healthcheck", "");
    assert!(body.contains("redis connected"), "{body}");

    let wrong = ServiceProc::start_in_env(dir.path(), &[], &env_refs(&env("other-ca.crt")));
    wrong.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let r = ask(&mut wrong.client().await, four()).await;
    assert_eq!(r.overall_code(), Code::OverLimit, "closed while the nodes cannot be reached: {r:?}");
    let t = std::time::Instant::now();
    loop {
        let body = wrong.http("GET", "/healthcheck", "").1;
        if body.contains("not signed by a trusted CA") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{body}\n{}", wrong.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 31.3 on Redis Cluster: every node stalled (SIGSTOP), a request whose descriptors are
/// in one slot (one command) and one across slots (check, then commit) are each answered
/// before their grpc-timeout (100 ms) by the domain's failure mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_domain_behind_stalled_nodes_answers_before_the_grpc_timeout() {
    let cluster = Cluster::start(3, 0);
    let dir = failure_mode_configs("cluster-deadline", "p", "minute");
    let svc = ServiceProc::start(dir.path(), &["--redis-type", "cluster", "--redis-url", &nodes(&cluster)]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    let values = |tag: &str| -> Vec<String> { ["a", "b", "c", "d"].iter().map(|v| format!("{tag}{v}")).collect() };
    let slots = |vs: &[String]| -> std::collections::HashSet<Slot> {
        vs.iter()
            .map(|v| Slot::for_key(redis_key("rls:", false, Algorithm::Fixed, "p_open", &[("k", v)], &[])))
            .collect()
    };
    for m in FAILURE_MODES {
        let r = ask(&mut c, request(&format!("p_{m}"), values("up").iter().map(|v| desc(&[("k", v)])).collect())).await;
        assert!(ok(&r), "{m}, Redis up: {r:?}");
    }
    let pids: Vec<u32> = cluster.nodes.iter().map(|n| n.pid().unwrap()).collect();
    pids.iter().for_each(|p| signal(*p, "-STOP"));
    for i in 0..3 {
        let timeout = Duration::from_millis(100);
        assert_failure_modes_answer_in_time(&mut c, "p", &[format!("one{i}")], timeout).await;
        let across: Vec<String> = values("s").iter().map(|v| format!("{v}{i}")).collect();
        assert!(slots(&across).len() >= 2, "several slots: {:?}", slots(&across));
        assert_failure_modes_answer_in_time(&mut c, "p", &across, timeout).await;
    }
    pids.iter().for_each(|p| signal(*p, "-CONT"));
    assert!(svc.metric("ratelimit_service_redis_deadline_exceeded") >= 1, "the stalled calls were cut");
}

/// docs/service.md's Redis user, as written for this server, with the cluster's grants, on
/// every node: a request across three slots is checked and committed (then refused, consuming
/// nothing), the module probe is answered, and no node refused the service anything but
/// redis-rs's ignored `CLIENT SETINFO`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_redis_user_on_a_cluster() {
    let cluster = Cluster::start(3, 0);
    let acl = doc_redis_user(cluster.nodes[0].version().has_module_acl_category(), Some("redis-user-cluster"));
    for n in &cluster.nodes {
        let mut con = n.conn();
        redis::cmd("ACL").arg(&acl).query::<()>(&mut con).unwrap_or_else(|e| panic!("{acl:?}: {e}"));
        redis::cmd("ACL").arg("LOG").arg("RESET").query::<()>(&mut con).unwrap();
    }
    let pw = acl.iter().find_map(|a| a.strip_prefix('>')).expect("a password");
    let auth = format!("{}:{pw}", acl[1]);
    let dir = TempDir::new("cluster-user");
    dir.write("c.yaml", CONFIG);
    let svc = ServiceProc::start(
        dir.path(),
        &["--redis-type", "cluster", "--redis-url", &nodes(&cluster), "--redis-auth", &auth],
    );
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    let three = request("c", vec![desc(&[("ip", "a")]), desc(&[("user", "u")]), desc(&[("tenant", "t")])]);
    let slots: std::collections::HashSet<Slot> =
        [(Algorithm::Fixed, "ip", "a"), (Algorithm::Sliding, "user", "u"), (Algorithm::Gcra, "tenant", "t")]
            .iter()
            .map(|(a, k, v)| Slot::for_key(redis_key("rls:", false, *a, "c", &[(k, v)], &[])))
            .collect();
    assert_eq!(slots.len(), 3, "the test needs three slots");
    for left in [1, 0] {
        let r = ask(&mut c, three.clone()).await;
        assert!(ok(&r), "{r:?}");
        assert_eq!(remaining(&r), [left, 999 - (1 - left), 999 - (1 - left)]);
    }
    let r = ask(&mut c, three.clone()).await;
    assert_eq!(codes(&r), [Code::OverLimit, Code::Ok, Code::Ok]);
    assert_eq!(remaining(&r), [0, 998, 998], "the refusal took nothing");
    let (status, body) = svc.http("GET", "/healthcheck", "");
    assert_eq!(status, 200, "{body}");
    for n in &cluster.nodes {
        assert_eq!(
            acl_log(&mut n.conn()),
            Vec::<(String, String)>::new(),
            "node {} refused these (reason, object)",
            n.port
        );
    }
}
