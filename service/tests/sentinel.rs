//! The service over Redis Sentinel (issue 35.1), with envoyproxy/ratelimit's settings
//! (`REDIS_TYPE=sentinel`, `REDIS_URL=<master name>,<sentinel>,...`, `REDIS_SENTINEL_AUTH`: the
//! sentinels ask for a password of their own): a primary with the module, two replicas, three sentinels; the primary killed under load. Every request is answered
//! within REDIS_TIMEOUT (+ slack) through the gap, with the domain's failure mode (`closed`);
//! the first request decided by the new primary is answered ≤ 100 ms after the sentinels'
//! `+switch-master` (though the breaker opened in the gap); /healthcheck names the new primary.
//! The same over TLS (issue 35.2), with docs/operations.md's settings as written: the
//! sentinels and the nodes reached on their TLS ports only, a private CA; a wrong CA named on
//! /healthcheck. And docs/service.md's Redis users (the servers' and the sentinels'), as
//! written.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/sentinel.rs"]
mod sentinel;
mod support;
#[path = "../../tests/common/tls.rs"]
mod tls;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis_ratelimit_service::pb::Code;
use sentinel::{replicated, SentinelTls, Sentinels, MASTER};
use support::*;
use tls::Certs;

const TIMEOUT: Duration = Duration::from_millis(100);
const SLACK: Duration = Duration::from_millis(100);

/// The service over `sentinels` (`REDIS_TYPE=sentinel`, `REDIS_URL` naming them and the
/// primary), the configurations in `dir`, `env` besides; its configuration loaded.
fn over_sentinels(dir: &TempDir, sentinels: &Sentinels, env: &[(&str, &str)]) -> ServiceProc {
    let url = format!("{MASTER},{}", sentinels.addrs().join(","));
    let mut all = vec![("REDIS_TYPE", "sentinel"), ("REDIS_URL", url.as_str())];
    all.extend_from_slice(env);
    let svc = ServiceProc::start_in_env(dir.path(), &[], &all);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    svc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_through_the_service() {
    let (mut primary, _replicas) = replicated(2);
    // The sentinels ask for a password of their own (REDIS_SENTINEL_AUTH).
    let sentinels = Sentinels::start_with_password(&primary, 3, Some("s3ntinel"));
    let dir = failure_mode_configs("sentinel", "p", "hour");
    let svc = over_sentinels(&dir, &sentinels, &[("REDIS_TIMEOUT", "100ms"), ("REDIS_SENTINEL_AUTH", "s3ntinel")]);
    decided_by_the_primary(&svc).await;
    let (_, body) = svc.http("GET", "/healthcheck", "");
    assert!(body.contains(&format!("redis connected to 127.0.0.1:{}", primary.port)), "{body}");

    // Without REDIS_SENTINEL_AUTH the sentinels refuse to name the primary.
    let no_auth = over_sentinels(&dir, &sentinels, &[("REDIS_TIMEOUT", "100ms")]);
    wait_until(Duration::from_secs(5), "the sentinels' refusal named", || {
        let (_, body) = no_auth.http("GET", "/healthcheck", "");
        body.contains("redis unavailable") && body.contains("no sentinel named the master")
    });
    drop(no_auth);

    let (_, new_port) = failover_under_load(&svc, &sentinels, || primary.kill9()).await;
    let (_, body) = svc.http("GET", "/healthcheck", "");
    assert!(body.contains(&format!("redis connected to 127.0.0.1:{new_port}")), "{body}");
    assert!(body.contains(&format!("sentinel master '{MASTER}' at 127.0.0.1:{new_port}")), "{body}");
}

/// Waits until the service decides from Redis (the primary connected).
async fn decided_by_the_primary(svc: &ServiceProc) {
    let mut c = svc.client().await;
    wait_until(Duration::from_secs(5), "decided by the primary", || {
        let rt = tokio::runtime::Handle::current();
        let r = tokio::task::block_in_place(|| {
            rt.block_on(c.should_rate_limit(request("p_closed", vec![desc(&[("k", "first")])])))
        });
        matches!(r, Ok(r) if remaining(r.get_ref()) == [3])
    });
}

/// A request for a fresh key every 5 ms while `fail` fails the primary over. Every request is
/// answered within REDIS_TIMEOUT (+ slack), some in the gap by the failure mode (`closed`), and
/// the first decided by the new primary ≤ 100 ms after `+switch-master`. Returns the switch's
/// time and the new primary's port.
async fn failover_under_load(svc: &ServiceProc, sentinels: &Sentinels, fail: impl FnOnce()) -> (Instant, u16) {
    let watch = sentinels.watch_switch();
    // (started, ended, decided by Redis) per request.
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<(Instant, Instant, bool)>>> = Arc::default();
    let load = {
        let (stop, seen, c) = (stop.clone(), seen.clone(), svc.client().await);
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let (mut c, seen) = (c.clone(), seen.clone());
                tokio::spawn(async move {
                    let t = Instant::now();
                    let r = c.should_rate_limit(request("p_closed", vec![desc(&[("k", &format!("n{n}"))])])).await;
                    let r = r.expect("closed answers").into_inner();
                    let by_redis = r.overall_code() == Code::Ok && r.statuses[0].limit_remaining == 3;
                    assert!(by_redis || r.overall_code() == Code::OverLimit, "{r:?}");
                    seen.lock().unwrap().push((t, Instant::now(), by_redis));
                });
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    fail();
    let (switched, new_port) = tokio::task::block_in_place(|| watch.wait(Duration::from_secs(20)));
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    tokio::time::sleep(TIMEOUT + SLACK).await;

    let seen = seen.lock().unwrap().clone();
    let worst = seen.iter().map(|s| s.1 - s.0).max().unwrap();
    assert!(worst <= TIMEOUT + SLACK, "a request took {worst:?}");
    assert!(seen.iter().any(|s| !s.2), "the gap answered with the failure mode");
    let first = seen.iter().filter(|s| s.2 && s.1 >= switched).map(|s| s.1).min().expect("decided after the switch");
    assert!(
        first - switched <= Duration::from_millis(100),
        "first decided {:?} after +switch-master",
        first - switched
    );
    (switched, new_port)
}

/// Sentinel over TLS with docs/operations.md's settings as written (the sentinels' addresses
/// and the CA file replaced by the test's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_over_tls_through_the_service() {
    let certs = Certs::generate();
    let mut nodes = sentinel::replicated_tls(2, || certs.node_opts());
    let (mut primary, primary_port) = nodes.remove(0);
    let files = SentinelTls { cert: certs.path("node.crt"), key: certs.path("node.key"), ca: certs.path("ca.crt") };
    let sentinels = Sentinels::start_tls(primary_port, 3, &files);
    let dir = failure_mode_configs("sentinel-tls", "p", "hour");
    let env = |ca: &str| {
        doc_env("docs/operations.md", "sentinel-tls", |k, v| match (k, v.strip_prefix("/etc/redis-tls/")) {
            ("REDIS_URL", _) => format!("{MASTER},{}", sentinels.tls_addrs().join(",")),
            (_, Some(_)) => certs.path(ca).display().to_string(),
            _ => v.to_string(),
        })
    };
    let documented = env("ca.crt");
    assert!(documented.iter().any(|(k, v)| k == "REDIS_TIMEOUT" && v == "100ms"), "{documented:?}");
    let svc = ServiceProc::start_in_env(dir.path(), &[], &env_refs(&documented));
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    decided_by_the_primary(&svc).await;
    let (_, body) = svc.http("GET", "/healthcheck", "");
    assert!(body.contains(&format!("redis connected to 127.0.0.1:{primary_port}")), "{body}");

    // A CA that did not sign the sentinels' certificates: named on /healthcheck.
    let wrong = ServiceProc::start_in_env(dir.path(), &[], &env_refs(&env("other-ca.crt")));
    wait_until(Duration::from_secs(5), "the wrong CA named", || {
        let (_, body) = wrong.http("GET", "/healthcheck", "");
        body.contains("redis unavailable") && body.contains("not signed by a trusted CA")
    });
    drop(wrong);

    let (_, new_port) = failover_under_load(&svc, &sentinels, || primary.kill9()).await;
    let (_, body) = svc.http("GET", "/healthcheck", "");
    assert!(body.contains(&format!("redis connected to 127.0.0.1:{new_port}")), "{body}");
}

/// docs/service.md's Redis user as written for this server, with Sentinel's grant, on the
/// primary and the replica, and its sentinels' user on every sentinel: the service finds the
/// primary, requests are decided by it, and neither the primary nor any sentinel refused the
/// service anything but redis-rs's ignored `CLIENT SETINFO`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_redis_users_with_sentinel() {
    let (primary, replicas) = replicated(1);
    let sentinels = Sentinels::start(&primary, 3);
    let acl = doc_redis_user(primary.version().has_module_acl_category(), Some("redis-user-sentinel"));
    for s in std::iter::once(&primary).chain(&replicas) {
        let mut con = s.conn();
        redis::cmd("ACL").arg(&acl).query::<()>(&mut con).unwrap_or_else(|e| panic!("{acl:?}: {e}"));
        redis::cmd("ACL").arg("LOG").arg("RESET").query::<()>(&mut con).unwrap();
    }
    let sentinel_acl = doc_acl_setuser("redis-user-sentinels");
    let sentinel_conns = || {
        sentinels
            .ports
            .iter()
            .map(|p| redis::Client::open(format!("redis://127.0.0.1:{p}/")).unwrap().get_connection().unwrap())
    };
    for mut con in sentinel_conns() {
        redis::cmd("ACL").arg(&sentinel_acl).query::<()>(&mut con).unwrap_or_else(|e| panic!("{sentinel_acl:?}: {e}"));
        redis::cmd("ACL").arg("LOG").arg("RESET").query::<()>(&mut con).unwrap();
    }
    let auth = |acl: &[String]| format!("{}:{}", acl[1], acl.iter().find_map(|a| a.strip_prefix('>')).unwrap());
    let dir = failure_mode_configs("sentinel-user", "p", "hour");
    let svc =
        over_sentinels(&dir, &sentinels, &[("REDIS_AUTH", &auth(&acl)), ("REDIS_SENTINEL_AUTH", &auth(&sentinel_acl))]);
    decided_by_the_primary(&svc).await;
    let (status, body) = svc.http("GET", "/healthcheck", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("redis connected to 127.0.0.1:{}", primary.port)), "{body}");
    // Each sentinel has the service subscribed to `+switch-master`, as its user.
    let user = format!("user={}", sentinel_acl[1]);
    wait_until(Duration::from_secs(5), "the service subscribed on every sentinel", || {
        sentinel_conns().all(|mut con| {
            let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut con).unwrap();
            clients.lines().any(|l| l.split(' ').any(|f| f == user) && l.split(' ').any(|f| f == "sub=1"))
        })
    });
    assert_eq!(acl_log(&mut primary.conn()), Vec::<(String, String)>::new(), "the primary refused these");
    for mut con in sentinel_conns() {
        assert_eq!(acl_log(&mut con), Vec::<(String, String)>::new(), "a sentinel refused these");
    }
}
