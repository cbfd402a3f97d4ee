//! The settings no other test sets (issue 33), each against real processes: the service binary
//! and redis-server with the module. `CACHE_KEY_PREFIX` (the keys carry it; services with
//! different prefixes on one Redis share nothing), `NEAR_LIMIT_RATIO` (the near-limit stat as
//! envoyproxy/ratelimit counts it), `MERGE_DOMAIN_CONFIG` (a domain in two files refused
//! without it, merged with it), `REDIS_POOL_SIZE` (the connections Redis sees),
//! `REDIS_BREAKER_FAILURES` (the breaker opens at the Nth failure of a stalled Redis, then every
//! failure mode answers without waiting, and it closes once Redis is back), `STATS_MAX_KEYS`
//! (request-time /metrics series capped), and envoyproxy/ratelimit's runtime path
//! (`RUNTIME_ROOT`/`RUNTIME_SUBDIRECTORY`/`RUNTIME_APPDIRECTORY`, reloaded on a symlink swap).

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Server;
use redis_ratelimit_service::pb::{Code, RateLimitRequest};
use support::*;

fn url(redis: &Server) -> String {
    format!("127.0.0.1:{}", redis.port)
}

fn one_rule(domain: &str, key: &str, n: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: minute, requests_per_unit: {n}}}\n"
    )
}

fn req(domain: &str, key: &str, value: &str) -> RateLimitRequest {
    request(domain, vec![desc(&[(key, value)])])
}

/// The limit of the (single) status, `None` when no rule matched.
fn limit_of(r: &redis_ratelimit_service::pb::RateLimitResponse) -> Option<u32> {
    r.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit)
}

/// The keys in Redis, sorted.
fn keys(con: &mut redis::Connection) -> Vec<String> {
    let mut k: Vec<String> = redis::cmd("KEYS").arg("*").query(con).unwrap();
    k.sort();
    k
}

/// CACHE_KEY_PREFIX: every key the service writes starts with it (per-request checks and
/// leases alike), so services with different prefixes on one Redis keep separate limits and
/// services with the same prefix share them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_key_prefix_separates_the_limits_of_services_sharing_a_redis() {
    let redis = Server::start();
    let mut con = redis.conn();
    set_clock(&mut con, (T0_S + 1) * 1_000_000);
    let dir = TempDir::new("prefix");
    dir.write("p.yaml", &one_rule("pfx", "k", 2));
    let url = url(&redis);
    let start = |prefix: &str, extra: &[&str]| {
        let mut args = vec!["--redis-url", url.as_str()];
        args.extend_from_slice(extra);
        ServiceProc::start_in_env(dir.path(), &args, &[("CACHE_KEY_PREFIX", prefix)])
    };
    let (a, b, a2) = (start("alpha:", &[]), start("beta/", &[]), start("alpha:", &[]));
    for s in [&a, &b, &a2] {
        s.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    }
    let (mut ca, mut cb, mut ca2) = (a.client().await, b.client().await, a2.client().await);
    let v = || req("pfx", "k", "v");
    assert_eq!(remaining(&ask(&mut ca, v()).await), [1]);
    assert_eq!(remaining(&ask(&mut ca, v()).await), [0]);
    assert_eq!(codes(&ask(&mut ca, v()).await), [Code::OverLimit]);
    // Another prefix: a limit of its own.
    assert_eq!(remaining(&ask(&mut cb, v()).await), [1], "beta/ shares nothing with alpha:");
    // The same prefix: the same limit.
    assert_eq!(codes(&ask(&mut ca2, v()).await), [Code::OverLimit], "a second alpha: service shares the limit");
    assert_eq!(keys(&mut con), ["alpha:fixed:pfx|k=v", "beta/fixed:pfx|k=v"]);

    // A leased value's claims go to the prefixed key too.
    let l = start("lease:", &["--leases", "true", "--lease-hot-requests", "1"]);
    l.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut cl = l.client().await;
    assert!(ok(&ask(&mut cl, req("pfx", "k", "hot")).await));
    let leased: Vec<String> = keys(&mut con).into_iter().filter(|k| k.contains("hot")).collect();
    assert_eq!(leased, ["lease:fixed:pfx|k=hot"]);
    assert!(keys(&mut con).iter().all(|k| !k.starts_with("rls:")), "{:?}", keys(&mut con));
}

/// NEAR_LIMIT_RATIO: `near_limit` counts the admitted hits past floor(limit × ratio), only the
/// part of a request's hits beyond it (envoyproxy/ratelimit's `checkNearLimitThreshold`); a
/// refused request's hits are over the limit, none near it. Out of 0..1 it is refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_limit_ratio_sets_where_the_near_limit_stat_starts() {
    let redis = Server::start();
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let dir = TempDir::new("near");
    dir.write("n.yaml", &one_rule("near", "k", 10));
    let url = url(&redis);
    let half = ServiceProc::start(dir.path(), &["--redis-url", &url, "--near-limit-ratio", "0.5"]);
    let default = ServiceProc::start(dir.path(), &["--redis-url", &url]);
    for (svc, value) in [(&half, "half"), (&default, "default")] {
        svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
        let mut c = svc.client().await;
        // Hits 4, 3, 3 (the count after each: 4, 7, 10 of 10), then 1 refused.
        for (hits, admitted) in [(4, true), (3, true), (3, true), (1, false)] {
            let r = ask(&mut c, RateLimitRequest { hits_addend: hits, ..req("near", "k", value) }).await;
            assert_eq!(ok(&r), admitted, "{value}: {hits} hits: {r:?}");
        }
    }
    let stat = |svc: &ServiceProc, s: &str| {
        svc.metric(&format!("ratelimit_service_rate_limit_{s}{{domain=\"near\",key1=\"k\"}}"))
    };
    // 0.5: the threshold is 5; the second request crosses it (7 − 5 = 2 near), the third is
    // wholly past it (3): 5. The default 0.8: threshold 8, only the third crosses it (10 − 8).
    for (svc, near) in [(&half, 5), (&default, 2)] {
        let got = ["total_hits", "within_limit", "near_limit", "over_limit"].map(|s| stat(svc, s));
        assert_eq!(got, [11, 10, near, 1], "total, within, near, over");
    }
    for bad in ["1.5", "-0.1"] {
        let flag = format!("--near-limit-ratio={bad}");
        let mut svc = ServiceProc::spawn(dir.path(), &["--redis-url", &url, &flag], None);
        let st = svc.wait_exit(Duration::from_secs(20));
        assert!(!st.success(), "NEAR_LIMIT_RATIO={bad} started:\n{}", svc.log());
        assert!(svc.log().contains("NEAR_LIMIT_RATIO"), "{}", svc.log());
    }
}

/// MERGE_DOMAIN_CONFIG: a second file with the same domain is refused without it (the last
/// good configuration keeps serving), merged with it; merged files still may not define one
/// descriptor twice (envoyproxy/ratelimit: "duplicate descriptor composite key").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_domain_config_merges_a_domain_split_over_files() {
    let redis = Server::start();
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let dir = TempDir::new("merge");
    dir.write("a.yaml", &one_rule("m", "a", 1));
    let url = url(&redis);
    let no = ServiceProc::start(dir.path(), &["--redis-url", &url]);
    let yes = ServiceProc::start_in_env(dir.path(), &["--redis-url", &url], &[("MERGE_DOMAIN_CONFIG", "true")]);
    for s in [&no, &yes] {
        s.wait_log("loaded rate limit configuration: 1 file(s), domains [m]", Duration::from_secs(10));
    }
    dir.write("b.yaml", &one_rule("m", "b", 2));
    no.wait_log("duplicate domain 'm' in config file", Duration::from_secs(10));
    yes.wait_log("loaded rate limit configuration: 2 file(s), domains [m], 2 rule(s)", Duration::from_secs(10));
    assert_eq!(no.metric("ratelimit_service_config_load_error"), 1);
    assert_eq!(yes.metric("ratelimit_service_config_load_error"), 0);
    let (mut cn, mut cy) = (no.client().await, yes.client().await);
    // Refused: a.yaml alone keeps serving; b's descriptor has no rule.
    assert_eq!(limit_of(&ask(&mut cn, req("m", "a", "no")).await), Some(1));
    let r = ask(&mut cn, req("m", "b", "no")).await;
    assert!(ok(&r) && limit_of(&r).is_none(), "{r:?}");
    // Merged: both files' descriptors.
    assert_eq!(limit_of(&ask(&mut cy, req("m", "a", "yes")).await), Some(1));
    let r = ask(&mut cy, req("m", "b", "yes")).await;
    assert_eq!((limit_of(&r), remaining(&r)), (Some(2), vec![1]));

    dir.write("c.yaml", &one_rule("m", "a", 7));
    yes.wait_log("duplicate descriptor composite key 'm.a'", Duration::from_secs(10));
    assert_eq!(yes.metric("ratelimit_service_config_load_error"), 1);
    assert_eq!(limit_of(&ask(&mut cy, req("m", "a", "yes2")).await), Some(1), "the merged set keeps serving");
}

/// The service's connections to Redis as Redis lists them (our own connection left out).
fn service_connections(con: &mut redis::Connection) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(con).unwrap();
    list.lines().filter(|l| !l.contains("cmd=client|list")).count()
}

/// REDIS_POOL_SIZE: the service opens exactly that many connections to a single server, at
/// start (in the background: the connection layer), however many requests run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_pool_size_is_the_number_of_connections_redis_sees() {
    let dir = TempDir::new("pool");
    dir.write("p.yaml", &one_rule("pool", "k", 1_000_000));
    for size in [1usize, 3] {
        let redis = Server::start();
        let mut con = redis.conn();
        let svc =
            ServiceProc::start(dir.path(), &["--redis-url", &url(&redis), "--redis-pool-size", &size.to_string()]);
        svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
        wait_until(Duration::from_secs(5), &format!("pool {size}: connected before any request"), || {
            service_connections(&mut con) == size
        });
        let mut tasks = Vec::new();
        for t in 0..8 {
            let mut c = svc.client().await;
            tasks.push(tokio::spawn(async move {
                for i in 0..10 {
                    assert!(ok(&ask(&mut c, req("pool", "k", &format!("{t}-{i}"))).await));
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(service_connections(&mut con), size, "pool {size}");
    }
}

/// SIGCONTs a stopped redis-server when dropped (a failed assertion must not leave it stopped).
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        kill(pid, "-STOP");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        kill(self.0, "-CONT");
    }
}

fn kill(pid: u32, sig: &str) {
    let st = std::process::Command::new("kill").args([sig, &pid.to_string()]).status().unwrap();
    assert!(st.success(), "kill {sig} {pid}");
}

/// REDIS_BREAKER_FAILURES: with Redis stalled (SIGSTOP), the first N − 1 calls each wait
/// REDIS_TIMEOUT and the breaker stays closed; the Nth opens it; from then on every failure
/// mode answers at once without a Redis call; after SIGCONT the next probe closes it and Redis
/// decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_breaker_failures_opens_the_breaker_at_the_nth_failure() {
    const TIMEOUT: Duration = Duration::from_millis(400);
    let redis = Server::start();
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let dir = failure_mode_configs("breaker", "b", "minute");
    let svc = ServiceProc::start(
        dir.path(),
        &[
            "--redis-url",
            &url(&redis),
            "--redis-pool-size",
            "1",
            "--redis-timeout",
            "400ms",
            "--redis-breaker-failures",
            "3",
            "--redis-breaker-cool-down",
            "3s",
            "--instances",
            "2",
        ],
    );
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    let r = |m: &str, v: &str| req(&format!("b_{m}"), "k", v);
    for m in FAILURE_MODES {
        assert_eq!(remaining(&ask(&mut c, r(m, "up")).await), [3], "{m} with Redis up");
    }
    let counters = |svc: &ServiceProc| {
        ["redis_failures", "breaker_opens", "breaker_rejects", "redis_breaker_open"]
            .map(|n| svc.metric(&format!("ratelimit_service_{n}")))
    };
    assert_eq!(counters(&svc), [0, 0, 0, 0]);

    let stopped = Stopped::new(redis.pid().unwrap());
    for n in 1..=3u64 {
        let started = Instant::now();
        assert_eq!(codes(&ask(&mut c, r("closed", "stalled")).await), [Code::OverLimit]);
        assert!(started.elapsed() >= TIMEOUT, "failure {n} waited for Redis: {:?}", started.elapsed());
        let opened = u64::from(n == 3);
        assert_eq!(counters(&svc), [n, opened, 0, opened], "after failure {n}");
    }
    // Open: each mode answers without waiting on Redis.
    let started = Instant::now();
    let e = c.should_rate_limit(r("error", "stalled")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(ok(&ask(&mut c, r("open", "stalled")).await));
    assert_eq!(codes(&ask(&mut c, r("closed", "stalled")).await), [Code::OverLimit]);
    assert!(ok(&ask(&mut c, r("local", "stalled")).await), "local: 4 ÷ 2 instances admits");
    assert!(started.elapsed() < TIMEOUT, "four answers without a Redis wait: {:?}", started.elapsed());
    assert_eq!(counters(&svc), [3, 1, 4, 1], "no call went to Redis");

    drop(stopped);
    // After the cool-down one call probes Redis, which answers: closed again.
    wait_until(Duration::from_secs(15), "Redis deciding again", || {
        let rt = tokio::runtime::Handle::current();
        let r = tokio::task::block_in_place(|| rt.block_on(c.should_rate_limit(r("error", "back"))));
        matches!(r, Ok(r) if remaining(r.get_ref()) == [3])
    });
    let [failures, opens, _, open] = counters(&svc);
    assert_eq!((failures, opens, open), (3, 1, 0), "the probe succeeded: closed");
    for m in FAILURE_MODES {
        assert_eq!(remaining(&ask(&mut c, r(m, "after")).await), [3], "{m} decided by Redis");
    }
}

/// STATS_MAX_KEYS: at most that many request-time stats keys (here `detailed_metric`'s, one per
/// value); past it a request counts into its rule's own series and in
/// `ratelimit_service_stats_keys_dropped` (once per request that found no room).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_max_keys_caps_the_per_value_series() {
    let redis = Server::start();
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let dir = TempDir::new("stats");
    dir.write(
        "s.yaml",
        "domain: stats\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
    );
    let svc = ServiceProc::start(dir.path(), &["--redis-url", &url(&redis), "--stats-max-keys", "3"]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    for v in (0..10).chain([0, 9]) {
        assert!(ok(&ask(&mut c, req("stats", "user", &format!("u{v}"))).await));
    }
    let (_, text) = svc.http("GET", "/metrics", "");
    let series: Vec<&str> =
        text.lines().filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{domain=\"stats\"")).collect();
    assert_eq!(
        series,
        [
            "ratelimit_service_rate_limit_total_hits{domain=\"stats\",key1=\"user\"} 8",
            "ratelimit_service_rate_limit_total_hits{domain=\"stats\",key1=\"user_u0\"} 2",
            "ratelimit_service_rate_limit_total_hits{domain=\"stats\",key1=\"user_u1\"} 1",
            "ratelimit_service_rate_limit_total_hits{domain=\"stats\",key1=\"user_u2\"} 1",
        ],
        "three per-value series, the rest counted in the rule's own"
    );
    assert_eq!(svc.metric("ratelimit_service_stats_keys_dropped"), 8);
}

/// envoyproxy/ratelimit's default configuration path, the one a migrating deployment sets:
/// `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY/*.yaml` (its README; its loader
/// keeps the keys under `RUNTIME_APPDIRECTORY.`), with `RUNTIME_ROOT` a symlink swapped to a new
/// directory to reload (its default `RUNTIME_WATCH_ROOT=true` way), and inside the config
/// directory a Kubernetes ConfigMap's own `..data` symlink swap (the `RUNTIME_WATCH_ROOT=false`
/// way). Files outside the config directory are not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_path_is_read_and_reloaded_on_a_symlink_swap() {
    let redis = Server::start();
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let base = TempDir::new("runtime");
    let write = |rel: &str, text: &str| {
        let p = base.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    let swap = |link: &Path, target: &str| {
        // A new symlink renamed over the old one: atomic, as `ln -sfn` + `mv -T` does it.
        let tmp = link.parent().unwrap().join("swap.tmp");
        std::os::unix::fs::symlink(target, &tmp).unwrap();
        std::fs::rename(&tmp, link).unwrap();
    };
    write("v1/ratelimit/config/limits.yaml", &one_rule("rt", "k", 2));
    write("v1/ratelimit/other.yaml", &one_rule("outside", "k", 1));
    write("v2/ratelimit/config/..2026_01/limits.yaml", &one_rule("rt", "k", 5));
    write("v2/ratelimit/config/..2026_02/limits.yaml", &one_rule("rt", "k", 9));
    std::os::unix::fs::symlink("..2026_01", base.path().join("v2/ratelimit/config/..data")).unwrap();
    std::os::unix::fs::symlink("..data/limits.yaml", base.path().join("v2/ratelimit/config/limits.yaml")).unwrap();
    let current = base.path().join("current");
    std::os::unix::fs::symlink("v1", &current).unwrap();

    let root = current.to_str().unwrap().to_string();
    let env =
        [("RUNTIME_ROOT", root.as_str()), ("RUNTIME_SUBDIRECTORY", "ratelimit"), ("RUNTIME_APPDIRECTORY", "config")];
    let svc = ServiceProc::start_in_env(Path::new(""), &["--redis-url", &url(&redis)], &env);
    svc.wait_log("loaded rate limit configuration: 1 file(s), domains [rt]", Duration::from_secs(10));
    svc.wait_log(&format!("reading the rate limit configuration from {root}/ratelimit/config"), Duration::ZERO);
    let mut c = svc.client().await;
    assert_eq!(limit_of(&ask(&mut c, req("rt", "k", "a")).await), Some(2));
    assert_eq!(limit_of(&ask(&mut c, req("outside", "k", "a")).await), None, "other.yaml is not read");

    swap(&current, "v2");
    wait_until(Duration::from_secs(10), "the root's swap reloaded", || {
        svc.log_count("loaded rate limit configuration") >= 2
    });
    assert_eq!(limit_of(&ask(&mut c, req("rt", "k", "b")).await), Some(5));

    swap(&base.path().join("v2/ratelimit/config/..data"), "..2026_02");
    wait_until(Duration::from_secs(10), "the ConfigMap's swap reloaded", || {
        svc.log_count("loaded rate limit configuration") >= 3
    });
    assert_eq!(limit_of(&ask(&mut c, req("rt", "k", "c")).await), Some(9));
    assert_eq!(svc.metric("ratelimit_service_config_load_error"), 0);
}
