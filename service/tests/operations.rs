//! Operations against real processes: hot reload without dropping requests, a broken
//! configuration refused (named by file, domain and descriptor) while the last good one keeps
//! serving, Redis killed and restarted under each failure mode (error, open, closed, local),
//! one domain per mode in one service, and the shutdown: unhealthy at SIGTERM (/healthcheck and
//! grpc.health.v1), still serving for the drain period, requests in flight answered, exit 0.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Server;
use redis_ratelimit_service::pb::Code;
use support::*;
use tonic_health::pb::health_check_response::ServingStatus;

fn limit_yaml(domain: &str, n: u32) -> String {
    format!("domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {n}}}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_keeps_serving_and_a_broken_config_is_refused() {
    let redis = Server::start();
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let dir = TempDir::new("reload");
    dir.write("a.yaml", &limit_yaml("reload", 3));
    let url = format!("127.0.0.1:{}", redis.port);
    let svc = ServiceProc::start(dir.path(), &["--redis-url", &url]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    let r = ask(&mut c, request("reload", vec![desc(&[("k", "v")])])).await;
    assert_eq!(remaining(&r), [2]);

    // Requests keep flowing during every reload below: none may fail.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let load = {
        let (stop, sent) = (stop.clone(), sent.clone());
        let mut c2 = svc.client().await;
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = c2.should_rate_limit(request("reload", vec![desc(&[("k", "load")])])).await;
                if let Err(e) = r {
                    panic!("a request failed during a reload: {e}");
                }
                sent.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };

    // A new limit: served after the reload; the module carries the count into it.
    dir.write("a.yaml", &limit_yaml("reload", 10));
    wait_until(Duration::from_secs(10), "the reload", || svc.log_count("loaded rate limit configuration") >= 2);
    let r = ask(&mut c, request("reload", vec![desc(&[("k", "v")])])).await;
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 10);
    assert_eq!(remaining(&r), [8]);

    // A second file with a new domain.
    dir.write("b.yaml", &limit_yaml("second", 1));
    wait_until(Duration::from_secs(10), "the reload of b.yaml", || {
        svc.log_count("loaded rate limit configuration") >= 3
    });
    assert!(ok(&ask(&mut c, request("second", vec![desc(&[("k", "v")])])).await));
    assert_eq!(codes(&ask(&mut c, request("second", vec![desc(&[("k", "v")])])).await), [Code::OverLimit]);

    // A broken file: refused with its file, domain and descriptor; the last good config serves.
    dir.write(
        "b.yaml",
        "domain: second\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    svc.wait_log("refused the new rate limit configuration", Duration::from_secs(10));
    let log = svc.log();
    let line = log.lines().find(|l| l.contains("refused the new rate limit configuration")).unwrap();
    assert!(
        line.contains("b.yaml: domain 'second': descriptor 'k': invalid rate limit unit 'fortnight'"),
        "the refusal names file, domain and descriptor: {line}"
    );
    let r = ask(&mut c, request("reload", vec![desc(&[("k", "v")])])).await;
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 10, "the last good config serves");
    assert_eq!(codes(&ask(&mut c, request("second", vec![desc(&[("k", "v")])])).await), [Code::OverLimit]);
    assert_eq!(svc.metric("ratelimit_service_config_load_error"), 1);
    assert_eq!(svc.metric("ratelimit_service_config_load_success"), 3);
    // Invalid YAML too, then a fix.
    dir.write("a.yaml", "domain: [reload\n");
    wait_until(Duration::from_secs(10), "the second refusal", || {
        svc.metric("ratelimit_service_config_load_error") == 2
    });
    dir.write("a.yaml", &limit_yaml("reload", 20));
    dir.write("b.yaml", &limit_yaml("second", 1));
    wait_until(Duration::from_secs(10), "the fix", || svc.log_count("loaded rate limit configuration") >= 4);
    let r = ask(&mut c, request("reload", vec![desc(&[("k", "v")])])).await;
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 20);

    stop.store(true, Ordering::Relaxed);
    load.await.expect("no request failed during the reloads");
    assert!(sent.load(Ordering::Relaxed) > 10, "the load ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_under_each_failure_mode() {
    let mut redis = Server::start();
    let dir = failure_mode_configs("failures", "p", "second");
    let url = format!("127.0.0.1:{}", redis.port);
    // 2 instances: the local fallback admits 4 / 2 = 2 per second per descriptor.
    let svc = ServiceProc::start(
        dir.path(),
        &["--redis-url", &url, "--instances", "2", "--redis-timeout", "200ms", "--redis-breaker-cool-down", "300ms"],
    );
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    let req = |m: &str, v: &str| request(&format!("p_{m}"), vec![desc(&[("k", v)])]);
    for m in ["error", "open", "closed", "local"] {
        let r = ask(&mut c, req(m, "up")).await;
        assert!(ok(&r) && remaining(&r) == [3], "{m} with Redis up: {r:?}");
    }

    redis.kill9();
    // error: the call fails (UNAVAILABLE) and Envoy's failure_mode_deny decides.
    for _ in 0..8 {
        let e = c.should_rate_limit(req("error", "down")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    }
    // The breaker is open now: no request waits for Redis.
    assert!(svc.metric("ratelimit_service_breaker_opens") >= 1);
    let started = std::time::Instant::now();
    for _ in 0..5 {
        let r = ask(&mut c, req("open", "down")).await;
        assert!(ok(&r), "open admits while Redis is down");
        let r = ask(&mut c, req("closed", "down")).await;
        assert_eq!(codes(&r), [Code::OverLimit], "closed refuses while Redis is down");
    }
    assert!(started.elapsed() < Duration::from_secs(2), "answers without waiting on Redis: {:?}", started.elapsed());
    // local: a token bucket per descriptor at 4 / 2 instances: two admitted, then refused.
    let local: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(ok(&ask(&mut c, req("local", "down")).await));
        }
        v
    };
    assert_eq!(local, [true, true, false, false], "local fallback at limit ÷ instances");
    assert!(svc.metric("ratelimit_service_failure_policy{decision=\"local_deny\"}") >= 2);

    // Redis back: every domain is decided by Redis again within a few cool-downs.
    redis.start_again();
    for m in ["error", "open", "closed", "local"] {
        wait_until(Duration::from_secs(15), &format!("{m} decided by Redis again"), || {
            let rt = tokio::runtime::Handle::current();
            let mut c = futures_block(&rt, svc.client());
            match futures_block(&rt, c.should_rate_limit(req(m, &format!("back-{m}")))) {
                Ok(r) => {
                    let r = r.into_inner();
                    // Redis decides: a fresh key reports its remaining (fallbacks report 0).
                    ok(&r) && r.statuses[0].limit_remaining == 3
                }
                Err(_) => false,
            }
        });
    }
}

/// Issue 31.9: a configuration that is there but wrong at start stops the process (non-zero,
/// naming the file and the problem) instead of serving with no limits and /healthcheck 200.
#[test]
fn a_bad_configuration_at_start_exits_naming_the_file_and_the_problem() {
    for (text, problem) in [
        (
            "domain: start\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "bad.yaml: domain 'start': descriptor 'k': invalid rate limit unit 'fortnight'",
        ),
        ("domain: [start\n", "bad.yaml"),
    ] {
        let dir = TempDir::new("bad-start");
        dir.write("good.yaml", &limit_yaml("good", 1));
        dir.write("bad.yaml", text);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_redis-ratelimit-service"))
            .args(["--grpc-host", "127.0.0.1", "--grpc-port", "0", "--http-host", "127.0.0.1", "--http-port", "0"])
            .args(["--redis-url", "127.0.0.1:1"])
            .arg("--config")
            .arg(dir.path())
            .env_remove("PORT")
            .env_remove("HOST")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        let line = err.lines().find(|l| l.starts_with("redis-ratelimit-service: ")).unwrap_or_else(|| panic!("{err}"));
        assert!(line.contains("invalid rate limit configuration") && line.contains(problem), "{line}");
    }
}

/// Issue 31.10: emptying the configuration directory does not drop every limit: the reload is
/// refused (WARN, counted in config_load_error) and the last configuration keeps serving,
/// unless ALLOW_EMPTY_CONFIG; a configuration with a domain loads again as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_removes_every_domain_is_refused_unless_allowed() {
    let redis = Server::start();
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let url = format!("127.0.0.1:{}", redis.port);
    for allow in [false, true] {
        let dir = TempDir::new("emptied");
        dir.write("a.yaml", &limit_yaml(&format!("emptied{allow}"), 1));
        let svc = ServiceProc::start(dir.path(), &["--redis-url", &url, "--allow-empty-config", &allow.to_string()]);
        svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
        let mut c = svc.client().await;
        let req = || request(&format!("emptied{allow}"), vec![desc(&[("k", "v")])]);
        assert!(ok(&ask(&mut c, req()).await));
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        if allow {
            svc.wait_log("loaded rate limit configuration: 0 file(s), domains []", Duration::from_secs(10));
            assert!(ok(&ask(&mut c, req()).await), "no limit any more, as allowed");
            assert_eq!(svc.metric("ratelimit_service_config_load_error"), 0);
            continue;
        }
        svc.wait_log("it has no domain", Duration::from_secs(10));
        let log = svc.log();
        let line = log.lines().find(|l| l.contains("it has no domain")).unwrap();
        assert!(line.contains("WARN") && line.contains("ALLOW_EMPTY_CONFIG"), "{line}");
        assert_eq!(svc.metric("ratelimit_service_config_load_error"), 1);
        assert_eq!(codes(&ask(&mut c, req()).await), [Code::OverLimit], "the last configuration still limits");
        // Refused once, not at every poll; a configuration with a domain loads.
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(svc.metric("ratelimit_service_config_load_error"), 1);
        dir.write("b.yaml", &limit_yaml("other", 1));
        wait_until(Duration::from_secs(10), "b.yaml", || svc.log_count("domains [other]") == 1);
        assert!(ok(&ask(&mut c, req()).await), "the new configuration has no such domain");
    }
}

/// Issue 31.8: Redis without the module (redis-server started without `--loadmodule`): the log
/// says so at start, /healthcheck and grpc.health fail naming it (an `open` domain would
/// otherwise answer OK to everything, enforcing nothing), requests are still answered by the
/// failure mode; after `MODULE LOAD` health recovers and Redis decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_without_the_module_is_named_and_unhealthy_until_loaded() {
    let port = common::free_port();
    let dir = TempDir::new("no-module");
    let mut cmd = std::process::Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--dir", &dir.path().to_string_lossy(), "--enable-module-command", "yes"])
        .stdout(std::process::Stdio::null());
    let mut redis = common::spawn_owned(cmd).unwrap();
    let url = format!("127.0.0.1:{port}");
    wait_until(Duration::from_secs(10), "redis-server", || {
        redis::Client::open(format!("redis://{url}")).unwrap().get_connection().is_ok()
    });
    let mut con = redis::Client::open(format!("redis://{url}")).unwrap().get_connection().unwrap();
    let config = TempDir::new("no-module-config");
    config.write(
        "open.yaml",
        "domain: open\nfailure_mode: open\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 4}\n",
    );
    let svc = ServiceProc::start(config.path(), &["--redis-url", &url]);
    let log = svc.log();
    let line =
        log.lines().find(|l| l.contains("does not have the redis-ratelimit module")).unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("ERROR") && line.contains("MODULE LOAD"), "{line}");
    let (status, body) = svc.http("GET", "/healthcheck", "");
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("Redis does not have the redis-ratelimit module loaded"), "{body}");
    for name in ["ratelimit", ""] {
        assert_eq!(svc.grpc_health(name).await.unwrap(), ServingStatus::NotServing, "grpc.health {name:?}");
    }
    let mut c = svc.client().await;
    let req = || request("open", vec![desc(&[("k", "v")])]);
    assert!(ok(&ask(&mut c, req()).await), "open: answered by the failure mode");

    redis::cmd("MODULE")
        .arg("LOAD")
        .arg(common::module_path().to_string_lossy().as_ref())
        .query::<()>(&mut con)
        .unwrap();
    wait_until(Duration::from_secs(10), "/healthcheck 200", || svc.http("GET", "/healthcheck", "").0 == 200);
    assert_eq!(svc.log_count("the redis-ratelimit module is loaded in Redis now"), 1);
    for name in ["ratelimit", ""] {
        let rt = tokio::runtime::Handle::current();
        wait_until(Duration::from_secs(10), &format!("grpc.health {name:?} SERVING"), || {
            matches!(futures_block(&rt, svc.grpc_health(name)), Ok(ServingStatus::Serving))
        });
    }
    assert_eq!(remaining(&ask(&mut c, req()).await), [3], "Redis decides again");
    let _ = redis.kill();
    let _ = redis.wait();
}

/// Issue 31.7: 2,000 HTTP connections that never finish their headers. The listener holds at
/// most HTTP_MAX_CONNECTIONS (1,000 here) and closes the others at once; the ones it holds are
/// closed after HTTP_HEADER_READ_TIMEOUT (15 s). Meanwhile gRPC answers and a reload loads
/// (file descriptors to spare); afterwards /healthcheck answers again (about 20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_half_sent_http_connections_are_bounded_and_closed() {
    use std::io::{Read, Write};
    use std::time::Instant;
    let redis = Server::start();
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let dir = TempDir::new("http-flood");
    dir.write("a.yaml", &limit_yaml("flood", 5));
    let url = format!("127.0.0.1:{}", redis.port);
    let timeout = Duration::from_secs(15);
    let svc = ServiceProc::start(
        dir.path(),
        &["--redis-url", &url, "--http-header-read-timeout", "15s", "--http-max-connections", "1000"],
    );
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut idle: Vec<(Instant, std::net::TcpStream)> = (0..2000)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&svc.http).unwrap();
            // An unfinished request: no blank line ends its headers (a write to a connection
            // the listener closed at once may fail: that is the point).
            let _ = s.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n");
            (Instant::now(), s)
        })
        .collect();
    let first_made = idle[0].0;
    let mut c = svc.client().await;
    assert_eq!(remaining(&ask(&mut c, request("flood", vec![desc(&[("k", "v")])])).await), [4], "gRPC answers");
    dir.write("b.yaml", &limit_yaml("flood2", 1));
    svc.wait_log("domains [flood, flood2]", Duration::from_secs(10));
    assert!(ok(&ask(&mut c, request("flood2", vec![desc(&[("k", "v")])])).await), "the reload serves");
    assert!(first_made.elapsed() < timeout, "checked while every held connection was open");
    // Beyond the limit closed at once, the others held; after the timeout every one closed.
    let open_now = |idle: &mut Vec<(Instant, std::net::TcpStream)>| {
        idle.iter_mut()
            .filter(|(_, s)| {
                let mut s: &std::net::TcpStream = s;
                s.set_nonblocking(true).unwrap();
                let mut buf = [0u8; 256];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => return false,
                        Ok(_) => {}
                        Err(e) => return e.kind() == std::io::ErrorKind::WouldBlock,
                    }
                }
            })
            .count()
    };
    let held = open_now(&mut idle);
    assert!((900..=1000).contains(&held), "{held} held (at most HTTP_MAX_CONNECTIONS), the others closed");
    assert!(first_made.elapsed() < timeout, "counted before the timeout");
    let last_made = idle.iter().map(|(m, _)| *m).max().unwrap();
    std::thread::sleep((timeout + Duration::from_secs(2)).saturating_sub(last_made.elapsed()));
    assert_eq!(open_now(&mut idle), 0, "every idle connection closed after the timeout");
    assert_eq!(svc.http("GET", "/healthcheck", "").0, 200, "/healthcheck answers again");
}

fn futures_block<F: std::future::Future>(rt: &tokio::runtime::Handle, f: F) -> F::Output {
    tokio::task::block_in_place(|| rt.block_on(f))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_file_is_served_and_reloaded_and_health_waits_for_a_config() {
    let redis = Server::start();
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let url = format!("127.0.0.1:{}", redis.port);
    // HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: /healthcheck fails until a file with a domain
    // is loaded. CONFIG_PATH names one file (not a directory) that does not exist yet.
    let dir = TempDir::new("single-file");
    let file = dir.path().join("limits.yaml");
    let svc = ServiceProc::start(&file, &["--redis-url", &url, "--healthy-with-at-least-one-config-loaded", "true"]);
    let (status, body) = svc.http("GET", "/healthcheck", "");
    assert_eq!(status, 500, "unhealthy without a configuration: {body}");
    assert!(body.contains("no configuration"), "{body}");
    for name in ["ratelimit", ""] {
        assert_eq!(svc.grpc_health(name).await.unwrap(), ServingStatus::NotServing, "grpc.health {name:?}");
    }
    dir.write("limits.yaml", &limit_yaml("single", 2));
    wait_until(Duration::from_secs(10), "the file's first load", || {
        svc.log_count("loaded rate limit configuration: 1 file(s), domains [single]") >= 1
    });
    assert_eq!(svc.http("GET", "/healthcheck", "").0, 200);
    // grpc.health follows within a poll interval.
    for name in ["ratelimit", ""] {
        let rt = tokio::runtime::Handle::current();
        wait_until(Duration::from_secs(10), &format!("grpc.health {name:?} SERVING"), || {
            matches!(futures_block(&rt, svc.grpc_health(name)), Ok(ServingStatus::Serving))
        });
    }
    let mut c = svc.client().await;
    assert_eq!(remaining(&ask(&mut c, request("single", vec![desc(&[("k", "v")])])).await), [1]);
    // An in-place edit of the file reloads it.
    std::fs::write(&file, limit_yaml("single", 5)).unwrap();
    wait_until(Duration::from_secs(10), "the edit", || svc.log_count("loaded rate limit configuration") >= 2);
    let r = ask(&mut c, request("single", vec![desc(&[("k", "v")])])).await;
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 5);
    assert_eq!(remaining(&r), [3]);
}

/// `make run-service`'s configuration (service/config) as the README and docs/service.md use
/// it: their curl answers what they print, seed 003's payment domain is a leaky bucket per IP
/// and a sliding window per user, and edge_proxy_per_ip blocks its listed address and limits
/// API keys with a token bucket per 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_configuration_answers_what_the_readme_shows() {
    let redis = Server::start();
    let url = format!("127.0.0.1:{}", redis.port);
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let svc = ServiceProc::start(&config, &["--redis-url", &url]);
    svc.wait_log("domains [edge_proxy_per_ip, payment]", Duration::from_secs(10));
    let body = r#"{"domain":"payment","descriptors":[{"entries":[{"key":"user_id","value":"alice"}]}]}"#;
    let (status, b) = svc.http("POST", "/json", body);
    assert_eq!(status, 200, "{b}");
    let want = r#"{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":1000,"unit":"HOUR"},"limitRemaining":999,"durationUntilReset":""#;
    assert!(b.starts_with(want), "the README's answer: {b}");
    assert!(b.contains(r#""responseHeadersToAdd":["#), "{b}");
    let (_, m) = svc.http("GET", "/metrics", "");
    assert!(m.contains("ratelimit_service_rate_limit_total_hits{domain=\"payment\",key1=\"user_id\"} 1"), "{m}");

    let mut con = redis.conn();
    reset_stats(&mut con);
    let mut c = svc.client().await;
    let r = ask(&mut c, request("payment", vec![desc(&[("remote_address", "10.1.1.1")]), desc(&[("user_id", "bob")])]))
        .await;
    assert!(ok(&r), "{r:?}");
    assert_eq!(remaining(&r), [49, 999]);
    assert_eq!(command_calls_of(&mut con, "rl.multi"), 1, "the leaky bucket and the sliding window in one RL.MULTI");
    let keys: Vec<String> = redis::cmd("KEYS").arg("rls:*").query(&mut con).unwrap();
    assert!(keys.contains(&"rls:leaky:payment|remote_address=10.1.1.1".to_string()), "{keys:?}");
    assert!(keys.contains(&"rls:sliding:payment|user_id=bob".to_string()), "{keys:?}");

    let r = ask(&mut c, request("edge_proxy_per_ip", vec![desc(&[("remote_address", "50.0.0.5")])])).await;
    assert_eq!(codes(&r), [Code::OverLimit], "the blocklisted address");
    let r = ask(&mut c, request("edge_proxy_per_ip", vec![desc(&[("api_key", "k1")])])).await;
    let l = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((l.requests_per_unit, r.statuses[0].limit_remaining), (300, 49), "300 per 30 s, burst 50: {r:?}");
    assert_eq!(header(&r, "RateLimit-Policy"), Some("\"edge_proxy_per_ip.api_key\";q=50;w=5"));
}

/// Redis slow rather than down: the process stopped (SIGSTOP), its connections open and
/// silent. Each call gives up after REDIS_TIMEOUT and the domain's failure mode answers; once
/// Redis runs again (SIGCONT) every domain is decided by Redis again, and the late replies of
/// the calls that timed out are not taken for the answers of later ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_times_out_into_each_failure_mode() {
    let redis = Server::start();
    // The module's clock pinned: the per-second windows below cannot roll over mid-count.
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let pid = redis.pid().unwrap();
    let dir = failure_mode_configs("stalled", "p", "second");
    let url = format!("127.0.0.1:{}", redis.port);
    let svc = ServiceProc::start(
        dir.path(),
        &["--redis-url", &url, "--instances", "2", "--redis-timeout", "200ms", "--redis-breaker-cool-down", "300ms"],
    );
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    let req = |m: &str, v: &str| request(&format!("p_{m}"), vec![desc(&[("k", v)])]);
    for m in ["error", "open", "closed", "local"] {
        assert_eq!(remaining(&ask(&mut c, req(m, "up")).await), [3], "{m} with Redis up");
    }

    signal(pid, "-STOP");
    let started = std::time::Instant::now();
    let e = c.should_rate_limit(req("error", "stalled")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(started.elapsed() < Duration::from_millis(1500), "gave up after the timeout: {:?}", started.elapsed());
    for i in 0..3 {
        assert!(ok(&ask(&mut c, req("open", &format!("stalled{i}"))).await), "open admits while Redis stalls");
        let r = ask(&mut c, req("closed", &format!("stalled{i}"))).await;
        assert_eq!(codes(&r), [Code::OverLimit], "closed refuses while Redis stalls");
    }
    let local: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(ok(&ask(&mut c, req("local", "stalled")).await));
        }
        v
    };
    assert_eq!(local, [true, true, false, false], "local fallback at limit ÷ instances");
    assert!(started.elapsed() < Duration::from_secs(5), "no call waited on Redis: {:?}", started.elapsed());
    assert!(svc.metric("ratelimit_service_redis_failures") >= 1);

    signal(pid, "-CONT");
    for m in ["error", "open", "closed", "local"] {
        let mut n = 0;
        wait_until(Duration::from_secs(15), &format!("{m} decided by Redis again"), || {
            n += 1;
            let rt = tokio::runtime::Handle::current();
            let r = tokio::task::block_in_place(|| rt.block_on(c.should_rate_limit(req(m, &format!("back{n}")))));
            matches!(r, Ok(r) if remaining(r.get_ref()) == [3])
        });
        // Each answer is its own request's: a key's count goes 3, 2, 1, 0, then refused.
        let key = format!("after-{m}");
        let mut seen = Vec::new();
        for _ in 0..5 {
            let r = ask(&mut c, req(m, &key)).await;
            seen.push((ok(&r), r.statuses[0].limit_remaining));
        }
        assert_eq!(seen, [(true, 3), (true, 2), (true, 1), (true, 0), (false, 0)], "{m}");
    }
}

/// Issue 31.3: a call carrying `grpc-timeout` (as Envoy's carries its filter's `timeout`, 20 ms
/// by default) is answered before it, by the domain's failure mode when Redis cannot answer in
/// time: Redis stalled (SIGSTOP), then killed, with REDIS_TIMEOUT (100 ms) far longer than the
/// caller's 20 ms. An answer after the deadline would be tonic's own `CANCELLED` ("Timeout
/// expired"), which Envoy takes as a failure and lets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_answered_before_its_grpc_timeout_by_the_failure_mode() {
    let mut redis = Server::start();
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let pid = redis.pid().unwrap();
    let dir = failure_mode_configs("deadline", "p", "minute");
    let url = format!("127.0.0.1:{}", redis.port);
    let svc = ServiceProc::start(dir.path(), &["--redis-url", &url, "--instances", "2"]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    let call = |m: &str, v: &str| {
        let mut r = tonic::Request::new(request(&format!("p_{m}"), vec![desc(&[("k", v)])]));
        r.set_timeout(Duration::from_millis(20));
        r
    };
    for m in ["error", "open", "closed", "local"] {
        let r = c.should_rate_limit(call(m, "up")).await.unwrap().into_inner();
        assert_eq!(remaining(&r), [3], "{m} with Redis up");
    }
    for (how, stalled) in [("stalled", true), ("killed", false)] {
        if stalled {
            signal(pid, "-STOP");
        } else {
            signal(pid, "-CONT");
            redis.kill9();
        }
        for i in 0..10 {
            let v = format!("{how}{i}");
            let e = c.should_rate_limit(call("error", &v)).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unavailable, "Redis {how}, error: {e:?}");
            let r = c.should_rate_limit(call("open", &v)).await.unwrap().into_inner();
            assert!(ok(&r), "Redis {how}, open: {r:?}");
            let r = c.should_rate_limit(call("closed", &v)).await.unwrap().into_inner();
            assert_eq!(codes(&r), [Code::OverLimit], "Redis {how}, closed");
        }
        // local: the limit ÷ INSTANCES, 2 of 4 per minute.
        let mut local = Vec::new();
        for _ in 0..4 {
            local.push(ok(&c.should_rate_limit(call("local", how)).await.unwrap().into_inner()));
        }
        assert_eq!(local, [true, true, false, false], "Redis {how}, local");
    }
    assert!(svc.metric("ratelimit_service_redis_deadline_exceeded") >= 1, "the stalled calls were cut");
}

/// With DRAIN_PERIOD: from SIGTERM on /healthcheck answers 500 and grpc.health.v1 NOT_SERVING,
/// while ShouldRateLimit (on a connection opened before, and on a new one) and /json are still
/// answered; the process exits 0 once the drain is over, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigterm_health_fails_while_requests_are_served_for_the_drain_period() {
    let (redis, dir, url) = one_domain("drain", "drain");
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let mut svc = ServiceProc::start(dir.path(), &["--redis-url", &url, "--drain-period", "2s"]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut before = svc.client().await;
    assert_eq!(remaining(&ask(&mut before, request("drain", vec![desc(&[("k", "v")])])).await), [99]);
    assert_eq!(svc.http("GET", "/healthcheck", "").0, 200);
    for name in ["ratelimit", ""] {
        assert_eq!(svc.grpc_health(name).await.unwrap(), ServingStatus::Serving, "grpc.health {name:?}");
    }
    // An unknown service name is NOT_FOUND, as the gRPC health protocol says.
    assert_eq!(svc.grpc_health("nope").await.unwrap_err().code(), tonic::Code::NotFound);

    let signalled = std::time::Instant::now();
    svc.signal("-TERM");
    svc.wait_log("SIGTERM: shutting down after a drain period of 2s", Duration::from_secs(10));
    let (status, body) = svc.http("GET", "/healthcheck", "");
    assert_eq!((status, body.as_str()), (500, "terminating"));
    for name in ["ratelimit", ""] {
        assert_eq!(svc.grpc_health(name).await.unwrap(), ServingStatus::NotServing, "grpc.health {name:?}");
    }
    assert_eq!(remaining(&ask(&mut before, request("drain", vec![desc(&[("k", "v")])])).await), [98]);
    let mut after = svc.client().await;
    assert_eq!(remaining(&ask(&mut after, request("drain", vec![desc(&[("k", "v")])])).await), [97]);
    let (status, body) =
        svc.http("POST", "/json", r#"{"domain":"drain","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""limitRemaining":96"#), "{body}");
    assert!(!svc.log().contains("drain period over"), "the checks above ran within the drain:\n{}", svc.log());

    let st = svc.wait_exit(Duration::from_secs(2 + 10));
    assert!(st.success(), "exit status {st}:\n{}", svc.log());
    assert!(signalled.elapsed() >= Duration::from_secs(2), "served the whole drain period");
    let log = svc.log();
    for phase in ["drain period over: stopping the servers", "servers stopped", "shut down"] {
        assert!(log.contains(phase), "the log says '{phase}':\n{log}");
    }
}

/// A redis-server with the module, a configuration directory with one domain
/// (`limit_yaml(domain, 100)`), and the service's `--redis-url` for that server.
fn one_domain(tag: &str, domain: &str) -> (Server, TempDir, String) {
    let redis = Server::start();
    let dir = TempDir::new(tag);
    dir.write("d.yaml", &limit_yaml(domain, 100));
    let url = format!("127.0.0.1:{}", redis.port);
    (redis, dir, url)
}

/// A second signal during the drain stops at once (SIGINT counts as SIGTERM), still exiting 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_cuts_the_drain_period_short() {
    let (_redis, dir, url) = one_domain("drain-cut", "drain");
    // Longer than the exit is waited for below: only the second signal can end it in time.
    let mut svc = ServiceProc::start(dir.path(), &["--redis-url", &url, "--drain-period", "10m"]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    svc.signal("-TERM");
    svc.wait_log("SIGTERM: shutting down after a drain period of 600s", Duration::from_secs(10));
    assert!(svc.running(), "still draining");
    svc.signal("-INT");
    let st = svc.wait_exit(Duration::from_secs(20));
    assert!(st.success(), "exit status {st}:\n{}", svc.log());
    assert!(svc.log().contains("SIGINT during the drain: cut short: stopping the servers"), "{}", svc.log());
}

/// WORKER_THREADS sets the threads that serve requests (tokio's workers, as the runtime counts
/// them, and the process's threads grow with it): several instances on one host each take
/// their share of its CPUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_sets_the_serving_threads() {
    let (_redis, dir, url) = one_domain("workers", "workers");
    let mut threads = Vec::new();
    for n in [1usize, 3] {
        let svc = ServiceProc::start(dir.path(), &["--redis-url", &url, "--worker-threads", &n.to_string()]);
        svc.wait_log(&format!("serving with {n} worker thread(s)"), Duration::from_secs(10));
        svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
        let mut c = svc.client().await;
        assert_eq!(remaining(&ask(&mut c, request("workers", vec![desc(&[("k", &format!("v{n}"))])])).await), [99]);
        threads.push(std::fs::read_dir(format!("/proc/{}/task", svc.pid())).unwrap().count() as i64);
    }
    // Two more workers, give or take a thread of tokio's blocking pool (the reloads use it).
    assert!((1..=3).contains(&(threads[1] - threads[0])), "threads with 1 and 3 workers: {threads:?}");
}

/// Without a drain period (the default) SIGTERM stops the servers at once and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_drain_period_sigterm_exits_at_once() {
    let (_redis, dir, url) = one_domain("no-drain", "nodrain");
    let mut svc = ServiceProc::start(dir.path(), &["--redis-url", &url]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    assert!(ok(&ask(&mut c, request("nodrain", vec![desc(&[("k", "v")])])).await));
    svc.signal("-TERM");
    let st = svc.wait_exit(Duration::from_secs(10));
    assert!(st.success(), "exit status {st}:\n{}", svc.log());
    let log = svc.log();
    assert!(log.contains("SIGTERM: shutting down: stopping the servers"), "{log}");
    assert!(!log.contains("drain period"), "no drain period: {log}");
}

/// A service whose Redis is stalled (SIGSTOP) with one ShouldRateLimit call in flight on it
/// (domain `p_open`: failure mode open), for the shutdown tests. Redis is continued on drop.
struct StalledCall {
    svc: ServiceProc,
    call:
        tokio::task::JoinHandle<Result<tonic::Response<redis_ratelimit_service::pb::RateLimitResponse>, tonic::Status>>,
    pid: u32,
    _redis: Server,
    _dir: TempDir,
}

impl StalledCall {
    async fn start(tag: &str, args: &[&str]) -> StalledCall {
        let redis = Server::start();
        let pid = redis.pid().unwrap();
        let dir = failure_mode_configs(tag, "p", "hour");
        let url = format!("127.0.0.1:{}", redis.port);
        let mut argv = vec!["--redis-url", url.as_str()];
        argv.extend_from_slice(args);
        let svc = ServiceProc::start(dir.path(), &argv);
        svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
        let mut c = svc.client().await;
        assert!(ok(&ask(&mut c, request("p_open", vec![desc(&[("k", "up")])])).await));
        let total = "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"}";
        assert_eq!(svc.metric(total), 1);

        signal(pid, "-STOP");
        let call =
            tokio::spawn(async move { c.should_rate_limit(request("p_open", vec![desc(&[("k", "stalled")])])).await });
        // The call has reached the service (it counts calls as they arrive).
        wait_until(Duration::from_secs(10), "the call in the service", || svc.metric(total) == 2);
        StalledCall { svc, call, pid, _redis: redis, _dir: dir }
    }

    fn resume_redis(&self) {
        signal(self.pid, "-CONT");
    }
}

impl Drop for StalledCall {
    fn drop(&mut self) {
        self.resume_redis();
    }
}

/// A ShouldRateLimit in flight when the servers stop is answered before the process exits: here
/// Redis is stalled (SIGSTOP), so the call is still waiting on it when SIGTERM comes, and is
/// answered by its domain's failure mode (open) once REDIS_TIMEOUT passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_at_sigterm_is_answered_before_the_exit() {
    let mut s = StalledCall::start("in-flight", &["--redis-timeout", "2s"]).await;
    s.svc.signal("-TERM");
    s.svc.wait_log("stopping the servers", Duration::from_secs(10));
    let answer = (&mut s.call).await.unwrap();
    s.resume_redis();
    let r = answer.unwrap_or_else(|e| panic!("the call in flight failed: {e}\n{}", s.svc.log())).into_inner();
    assert!(ok(&r), "failure mode open admits: {r:?}");
    let st = s.svc.wait_exit(Duration::from_secs(20));
    assert!(st.success(), "exit status {st}:\n{}", s.svc.log());
}

/// A request that outlives the graceful stop (Redis stalled, a Redis timeout longer than
/// SHUTDOWN_TIMEOUT) does not keep the process: after SHUTDOWN_TIMEOUT the connections still
/// open are closed and the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_outliving_the_shutdown_timeout_does_not_keep_the_process() {
    let mut s = StalledCall::start("outlive", &["--redis-timeout", "60s", "--shutdown-timeout", "1s"]).await;
    s.svc.signal("-TERM");
    let st = s.svc.wait_exit(Duration::from_secs(20));
    s.resume_redis();
    assert!(st.success(), "exit status {st}:\n{}", s.svc.log());
    assert!(s.svc.log().contains("graceful stop not done after SHUTDOWN_TIMEOUT"), "{}", s.svc.log());
    // Its connection closed with the process: the call ends, failed.
    let r = tokio::time::timeout(Duration::from_secs(10), &mut s.call).await.expect("the call ended").unwrap();
    assert!(r.is_err(), "{r:?}");
}

/// A second signal during the graceful stop ends its wait at once: a request outliving the
/// stop (Redis stalled, a 60 s Redis timeout, SHUTDOWN_TIMEOUT 10 min) does not keep the
/// process once the operator signals again, and the process still exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_during_the_graceful_stop_closes_at_once() {
    let mut s = StalledCall::start("force", &["--redis-timeout", "60s", "--shutdown-timeout", "10m"]).await;
    s.svc.signal("-TERM");
    s.svc.wait_log("stopping the servers", Duration::from_secs(10));
    assert!(s.svc.running(), "the graceful stop waits for the call in flight");
    s.svc.signal("-INT");
    let st = s.svc.wait_exit(Duration::from_secs(20));
    s.resume_redis();
    assert!(st.success(), "exit status {st}:\n{}", s.svc.log());
    let log = s.svc.log();
    assert!(log.contains("SIGINT during the graceful stop: closing the connections still open"), "{log}");
    assert!(!log.contains("graceful stop not done after SHUTDOWN_TIMEOUT"), "{log}");
    let r = tokio::time::timeout(Duration::from_secs(10), &mut s.call).await.expect("the call ended").unwrap();
    assert!(r.is_err(), "{r:?}");
}

/// A grpc.health.v1 Watch open at SIGTERM sees NOT_SERVING, then ends: it does not hold up the
/// graceful stop (which waits for every stream), and the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_health_watch_sees_not_serving_and_ends_at_the_stop() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let (_redis, dir, url) = one_domain("watch", "watch");
    let mut svc = ServiceProc::start(dir.path(), &["--redis-url", &url]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", svc.grpc)).unwrap();
    let mut c = HealthClient::new(channel.connect().await.unwrap());
    let mut watch = c.watch(HealthCheckRequest { service: "ratelimit".into() }).await.unwrap().into_inner();
    assert_eq!(watch.message().await.unwrap().unwrap().status(), ServingStatus::Serving);
    svc.signal("-TERM");
    let mut seen = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(m)) = watch.message().await {
            seen.push(m.status());
        }
    })
    .await;
    assert!(ended.is_ok(), "the Watch stream did not end within 20 s of SIGTERM (saw {seen:?}):\n{}", svc.log());
    assert_eq!(seen, [ServingStatus::NotServing], "then the stream ended");
    let st = svc.wait_exit(Duration::from_secs(10));
    assert!(st.success(), "exit status {st}:\n{}", svc.log());
}

/// Issue 31.7: a `ShouldRateLimit` request larger than GRPC_MAX_MESSAGE_BYTES is answered
/// RESOURCE_EXHAUSTED (tonic alone answers OUT_OF_RANGE), and the connection keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_is_resource_exhausted() {
    let (_redis, dir, url) = one_domain("oversized", "big");
    let svc = ServiceProc::start(dir.path(), &["--redis-url", &url, "--grpc-max-message-bytes", "1048576"]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let mut c = svc.client().await;
    let huge = "x".repeat(5 << 20);
    let e = c.should_rate_limit(request("big", vec![desc(&[("k", &huge)])])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    // Just under the limit: decoded, then refused by the request's own rules (an entry is at
    // most 4096 bytes), not by its size.
    let big = "x".repeat((1 << 20) - 100);
    let e = c.should_rate_limit(request("big", vec![desc(&[("k", &big)])])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(remaining(&ask(&mut c, request("big", vec![desc(&[("k", "v")])])).await), [99]);
}

/// Issue 31.7: a client with more calls in flight on one connection than
/// GRPC_MAX_CONCURRENT_STREAMS (2 here) gets no more streams at once than that (h2 clients wait
/// for a stream; a stream beyond the cap would be refused with REFUSED_STREAM): with Redis
/// stalled, each call holding its stream for REDIS_TIMEOUT (600 ms), 6 calls are answered in 3
/// waves, every one answered; meanwhile the service answers on other connections at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_the_stream_cap_wait_and_the_service_stays_responsive() {
    use std::time::Instant;
    let (redis, dir, url) = one_domain("streams", "streams");
    let svc = ServiceProc::start(
        dir.path(),
        &[
            "--redis-url",
            &url,
            "--grpc-max-concurrent-streams",
            "2",
            "--redis-timeout",
            "600ms",
            "--redis-breaker-failures",
            "1000",
        ],
    );
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    let c = svc.client().await;
    assert_eq!(remaining(&ask(&mut c.clone(), request("streams", vec![desc(&[("k", "v")])])).await), [99]);
    let pid = redis.pid().unwrap();
    signal(pid, "-STOP");
    let started = Instant::now();
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let mut c = c.clone();
            tokio::spawn(async move {
                let r = c.should_rate_limit(request("streams", vec![desc(&[("k", &format!("v{i}"))])])).await;
                (r.map(|_| ()).map_err(|e| e.code()), started.elapsed())
            })
        })
        .collect();
    // The service answers on another connection while those hold theirs.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let asked = Instant::now();
    assert_eq!(svc.grpc_health("").await.unwrap(), ServingStatus::Serving);
    assert!(asked.elapsed() < Duration::from_millis(300), "health took {:?}", asked.elapsed());
    let mut done = Vec::new();
    for call in calls {
        done.push(call.await.unwrap());
    }
    signal(pid, "-CONT");
    // `error` domain: every call answered UNAVAILABLE by the failure mode, none lost.
    assert!(done.iter().all(|(r, _)| *r == Err(tonic::Code::Unavailable)), "{done:?}");
    let mut at: Vec<Duration> = done.iter().map(|(_, t)| *t).collect();
    at.sort();
    // Two at a time: the last pair starts after two REDIS_TIMEOUTs.
    assert!(at[5] >= Duration::from_millis(3 * 600 - 100), "answered at {at:?}: more than 2 streams at once");
    assert!(at[1] < Duration::from_millis(600 + 400), "the first pair at once: {at:?}");
    assert_eq!(remaining(&ask(&mut c.clone(), request("streams", vec![desc(&[("k", "v")])])).await), [98]);
}
