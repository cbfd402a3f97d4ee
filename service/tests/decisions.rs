//! The service's decisions over real gRPC and HTTP against redis-server with the module:
//! every algorithm extension answers what the module answers, a request's descriptors are
//! decided together in exactly one Redis command, a refused request consumes nothing, shadow
//! mode never refuses, bad requests touch nothing, /json, /healthcheck, /metrics and the
//! response headers.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::time::Duration;

use common::Server;
use redis_ratelimit_service::pb::{Code, RateLimitOverride, RateLimitUnit};
use support::*;

const CONFIG: &str = "domain: algos
descriptors:
  - key: fixed
    rate_limit: {requests_per_unit: 5, period: 10s, algorithm: fixed}
  - key: sliding
    rate_limit: {requests_per_unit: 5, period: 10s, algorithm: sliding}
  - key: sliding_log
    rate_limit: {requests_per_unit: 5, period: 10s, algorithm: sliding_log}
  - key: gcra
    rate_limit: {requests_per_unit: 5, period: 10s, algorithm: gcra, burst: 7}
  - key: token_bucket
    rate_limit: {requests_per_unit: 5, period: 10s, algorithm: token_bucket, burst: 7}
  - key: leaky
    rate_limit: {requests_per_unit: 5, period: 10s, algorithm: leaky, burst: 3}
";

const ATOMIC: &str = "domain: atomic
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: gcra}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: warm
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
";

/// Loads the script on the server (its first use costs an EVALSHA answered NOSCRIPT, then an
/// EVAL), so that later counts are per request.
async fn warm_script(c: &mut redis_ratelimit_service::pb::RateLimitServiceClient<tonic::transport::Channel>) {
    ask(c, request("atomic", vec![desc(&[("warm", "w")])])).await;
}

/// Top-level script calls (the RL.* calls a script makes are counted by Redis too).
fn script_calls(con: &mut redis::Connection) -> u64 {
    command_calls_of(con, "evalsha") + command_calls_of(con, "eval")
}

struct Fixture {
    redis: Server,
    svc: ServiceProc,
    _dir: TempDir,
}

fn fixture(extra: &[&str]) -> Fixture {
    let redis = Server::start();
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let dir = TempDir::new("decisions");
    dir.write("algos.yaml", CONFIG);
    dir.write("atomic.yaml", ATOMIC);
    let url = format!("127.0.0.1:{}", redis.port);
    let mut args = vec!["--redis-url", url.as_str()];
    args.extend_from_slice(extra);
    let svc = ServiceProc::start(dir.path(), &args);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    Fixture { redis, svc, _dir: dir }
}

/// The module's reply fields as integers.
fn module(con: &mut redis::Connection, args: &[String]) -> Vec<i64> {
    let mut c = redis::cmd(&args[0]);
    for a in &args[1..] {
        c.arg(a);
    }
    c.query(con).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_answers_what_the_module_answers() {
    let f = fixture(&[]);
    let mut c = f.svc.client().await;
    let mut con = f.redis.conn();
    for (algo, cmd, extra) in [
        ("fixed", "RL.FIXED", vec![]),
        ("sliding", "RL.SLIDING", vec![]),
        ("sliding_log", "RL.SLIDINGLOG", vec![]),
        ("gcra", "RL.GCRA", vec!["BURST", "7"]),
        ("token_bucket", "RL.TOKENBUCKET", vec!["BURST", "7"]),
        ("leaky", "RL.LEAKY", vec!["BURST", "3"]),
    ] {
        set_clock(&mut con, (T0_S + 100) * 1_000_000);
        reset_stats(&mut con);
        for step in 0..14u64 {
            let hits = if step % 5 == 4 { 2 } else { 1 };
            let mut r = request("algos", vec![desc(&[(algo, "svc")])]);
            r.hits_addend = hits as u32;
            let got = ask(&mut c, r).await;
            let mut args: Vec<String> =
                [cmd, &format!("twin:{algo}"), "5", "10s"].iter().map(|s| s.to_string()).collect();
            args.extend(extra.iter().map(|s| s.to_string()));
            args.extend(["COST".to_string(), hits.to_string()]);
            let want = module(&mut con, &args);
            let s = &got.statuses[0];
            let what = format!("{algo} step {step}: service {got:?}, module {want:?}");
            assert_eq!(s.code == Code::Ok as i32, want[0] as u64 == hits, "{what}");
            assert_eq!(s.limit_remaining as i64, want[2], "{what}");
            // Whole seconds, rounded up (issue 31.12): never early for a reader of `seconds`.
            let reset = s.duration_until_reset.as_ref().unwrap();
            assert_eq!((reset.seconds, reset.nanos), ((want[4] + 999) / 1000, 0), "{what}");
            if s.code == Code::OverLimit as i32 {
                let retry = header(&got, "Retry-After").expect("Retry-After on a refusal").parse::<i64>().unwrap();
                assert_eq!(retry, (want[3] + 999) / 1000, "{what}");
            }
            advance_clock(&mut con, 700_000);
        }
        // Every check was this algorithm's own command (twin calls counted too): 14 + 14.
        assert_eq!(command_calls_of(&mut con, &cmd.to_ascii_lowercase()), 28, "{algo}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_are_decided_together_in_one_command_and_a_refusal_consumes_nothing() {
    let f = fixture(&[]);
    let mut c = f.svc.client().await;
    let mut con = f.redis.conn();
    let three =
        |ip: &str| request("atomic", vec![desc(&[("ip", ip)]), desc(&[("user", "u1")]), desc(&[("tenant", "t1")])]);
    for n in [1usize, 2, 3] {
        reset_stats(&mut con);
        let mut r = three(&format!("count{n}"));
        r.descriptors.truncate(n);
        ask(&mut c, r).await;
        assert_eq!(command_calls(&mut con), 1, "{n} descriptor(s): exactly one Redis command");
    }
    // ip limit 2/min: two admitted, the third refused, and the refusal takes nothing from
    // the user and tenant limits.
    let r1 = ask(&mut c, three("10.0.0.1")).await;
    let r2 = ask(&mut c, three("10.0.0.1")).await;
    assert!(ok(&r1) && ok(&r2));
    let before = remaining(&r2);
    for _ in 0..3 {
        let r = ask(&mut c, three("10.0.0.1")).await;
        assert_eq!(codes(&r), [Code::OverLimit, Code::Ok, Code::Ok]);
        assert_eq!(remaining(&r), [0, before[1], before[2]], "a refused request reports, and keeps, what remains");
    }
    let r = ask(&mut c, three("10.0.0.2")).await;
    assert!(ok(&r));
    assert_eq!(remaining(&r), [1, before[1] - 1, before[2] - 1], "nothing was taken by the refusals");

    // Different hits_addend per descriptor: still one command (the script), still atomic.
    warm_script(&mut c).await;
    reset_stats(&mut con);
    let mut r = three("10.0.0.3");
    r.descriptors[1].hits_addend = Some(5);
    r.descriptors[2].hits_addend = Some(3);
    let got = ask(&mut c, r.clone()).await;
    assert!(ok(&got));
    assert_eq!(remaining(&got), [1, before[1] - 6, before[2] - 4]);
    assert_eq!(script_calls(&mut con), 1, "one EVALSHA");
    assert_eq!(
        command_calls(&mut con),
        1 + 6,
        "the EVALSHA, then its three dry runs and three checks (Redis counts them as calls)"
    );
    r.descriptors[0].hits_addend = Some(2);
    let got = ask(&mut c, r).await;
    assert_eq!(codes(&got), [Code::OverLimit, Code::Ok, Code::Ok]);
    assert_eq!(remaining(&got), [1, before[1] - 6, before[2] - 4], "refused: nothing consumed");

    // A descriptor asking more than its capacity is refused for good, without Redis for it,
    // and without a Retry-After.
    let mut r = request("atomic", vec![desc(&[("ip", "10.0.0.9")])]);
    r.hits_addend = 3;
    reset_stats(&mut con);
    let got = ask(&mut c, r).await;
    assert_eq!(codes(&got), [Code::OverLimit]);
    assert!(header(&got, "Retry-After").is_none());
    assert_eq!(command_calls(&mut con), 0);
}

/// Issue 31.2: the same descriptor twice in one request counts on one key with the hits summed
/// (as envoyproxy/ratelimit counts both), still in one command; a request's override and a
/// configured rule on the same entries count apart, each against its own limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_descriptor_twice_counts_both_in_one_command() {
    let f = fixture(&[]);
    let mut c = f.svc.client().await;
    let mut con = f.redis.conn();
    // ip: 2 per minute. Twice in one request: 2 hits, the limit's all.
    let twice = |ip: &str| request("atomic", vec![desc(&[("ip", ip)]), desc(&[("ip", ip)])]);
    reset_stats(&mut con);
    let r = ask(&mut c, twice("1.0.0.1")).await;
    assert!(ok(&r), "{r:?}");
    assert_eq!(remaining(&r), [0, 0]);
    assert_eq!(command_calls(&mut con), 1, "one command");
    assert_eq!(command_calls_of(&mut con, "rl.fixed"), 1, "one key: the limiter command, COST 2");
    let r = ask(&mut c, twice("1.0.0.1")).await;
    assert_eq!(codes(&r), [Code::OverLimit, Code::OverLimit]);
    // With another descriptor of the same cost: one RL.MULTI over two distinct keys.
    reset_stats(&mut con);
    let mut r = twice("1.0.0.2");
    r.descriptors.push(desc(&[("tenant", "t2")]));
    r.descriptors[2].hits_addend = Some(2);
    let got = ask(&mut c, r.clone()).await;
    assert!(ok(&got), "{got:?}");
    assert_eq!(remaining(&got), [0, 0, 998]);
    assert_eq!((command_calls(&mut con), command_calls_of(&mut con, "rl.multi")), (1, 1));
    let got = ask(&mut c, r).await;
    assert_eq!(codes(&got), [Code::OverLimit, Code::OverLimit, Code::Ok]);
    assert_eq!(remaining(&got), [0, 0, 998], "refused: nothing consumed");
    // Summed hits above the capacity: refused without Redis.
    reset_stats(&mut con);
    let mut r = twice("1.0.0.3");
    r.descriptors[1].hits_addend = Some(2);
    assert_eq!(codes(&ask(&mut c, r).await), [Code::OverLimit, Code::OverLimit]);
    assert_eq!(command_calls(&mut con), 0);
    assert!(ok(&ask(&mut c, twice("1.0.0.3")).await), "the refusal took nothing");
    assert_eq!(
        f.svc.metric("ratelimit_service_redis_error"),
        0,
        "never a Redis failure (RL.MULTI's 'keys must be distinct' was one)"
    );

    // An override (1 per minute) beside the configured rule (2 per minute) on the same entries.
    let mut both = request("atomic", vec![desc(&[("ip", "o")]), desc(&[("ip", "o")])]);
    both.descriptors[0].limit = Some(RateLimitOverride { requests_per_unit: 1, unit: RateLimitUnit::Minute as i32 });
    let r = ask(&mut c, both.clone()).await;
    assert!(ok(&r), "{r:?}");
    assert_eq!(remaining(&r), [0, 1], "two keys, each its own limit");
    let r = ask(&mut c, both).await;
    assert_eq!(codes(&r), [Code::OverLimit, Code::Ok]);
    assert_eq!(remaining(&r), [0, 1]);
    let rule_only = request("atomic", vec![desc(&[("ip", "o")])]);
    assert!(ok(&ask(&mut c, rule_only.clone()).await), "the rule's second unit");
    assert!(!ok(&ask(&mut c, rule_only).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_never_refuses_and_counts() {
    let f = fixture(&[]);
    let mut c = f.svc.client().await;
    let mut con = f.redis.conn();
    let req = |ip: &str| request("atomic", vec![desc(&[("shadow", "s")]), desc(&[("ip", ip)])]);
    // The shadow limit (1/min) is over after the first request but never refuses; the
    // enforced ip limit (2/min) still refuses its third request.
    warm_script(&mut c).await;
    reset_stats(&mut con);
    let a = ask(&mut c, req("1.1.1.1")).await;
    let b = ask(&mut c, req("1.1.1.1")).await;
    assert_eq!(script_calls(&mut con), 2, "one command per request with a shadow descriptor too");
    assert!(ok(&a) && ok(&b), "{b:?}");
    assert_eq!(codes(&b), [Code::Ok, Code::Ok]);
    let c3 = ask(&mut c, req("1.1.1.1")).await;
    assert_eq!(codes(&c3), [Code::Ok, Code::OverLimit]);
    for _ in 0..5 {
        assert!(ok(&ask(&mut c, request("atomic", vec![desc(&[("shadow", "s")])])).await));
    }
    let labels = "domain=\"atomic\",key1=\"shadow\"";
    assert_eq!(f.svc.metric(&format!("ratelimit_service_rate_limit_total_hits{{{labels}}}")), 8);
    assert_eq!(f.svc.metric(&format!("ratelimit_service_rate_limit_shadow_mode{{{labels}}}")), 7);

    // SHADOW_MODE for the whole service: refusals answered OK, counted.
    let g = fixture(&["--shadow-mode", "true"]);
    let mut gc = g.svc.client().await;
    for _ in 0..4 {
        let r = ask(&mut gc, request("atomic", vec![desc(&[("ip", "2.2.2.2")])])).await;
        assert!(ok(&r), "global shadow mode refused {r:?}");
    }
    assert_eq!(g.svc.metric("ratelimit_service_global_shadow_mode"), 2);
    assert_eq!(g.svc.metric("ratelimit_service_rate_limit_over_limit{domain=\"atomic\",key1=\"ip\"}"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_invalid_arguments_and_touch_nothing() {
    let f = fixture(&[]);
    let mut c = f.svc.client().await;
    let mut con = f.redis.conn();
    reset_stats(&mut con);
    let mut huge = request("atomic", vec![desc(&[("ip", "x")])]);
    huge.descriptors[0].hits_addend = Some(u64::MAX);
    let mut bad_unit = request("atomic", vec![desc(&[("ip", "x")])]);
    bad_unit.descriptors[0].limit = Some(RateLimitOverride { requests_per_unit: 1, unit: 0 });
    let cases = [
        (request("", vec![desc(&[("ip", "x")])]), "domain must not be empty"),
        (request("atomic", vec![]), "descriptor list must not be empty"),
        (request("atomic", vec![desc(&[])]), "descriptor 0 has no entries"),
        (request("atomic", vec![desc(&[("ip", "x")]), desc(&[("", "v")])]), "descriptor 1 entry 0 has an empty key"),
        (huge, "hits_addend"),
        (bad_unit, "no valid unit"),
    ];
    for (r, msg) in cases {
        let e = c.should_rate_limit(r).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(msg), "{e:?} should say {msg}");
    }
    assert_eq!(command_calls(&mut con), 0, "bad requests touch no limit");
    // Unknown domains and descriptors without a rule are OK, as in envoyproxy/ratelimit.
    let r = ask(&mut c, request("nowhere", vec![desc(&[("a", "b")])])).await;
    assert!(ok(&r) && r.statuses.len() == 1);
    // A request's own limit (Envoy's override) applies as a fixed window.
    let mut o = request("atomic", vec![desc(&[("ip", "override")])]);
    o.descriptors[0].limit = Some(RateLimitOverride { requests_per_unit: 1, unit: RateLimitUnit::Minute as i32 });
    assert!(ok(&ask(&mut c, o.clone()).await));
    assert_eq!(codes(&ask(&mut c, o).await), [Code::OverLimit]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_endpoints_and_headers() {
    let f = fixture(&[]);
    let body = r#"{"domain":"atomic","descriptors":[{"entries":[{"key":"ip","value":"9.9.9.9"}]}]}"#;
    let (s1, b1) = f.svc.http("POST", "/json", body);
    assert_eq!(s1, 200, "{b1}");
    assert!(b1.contains(r#""overallCode":"OK""#) && b1.contains(r#""limitRemaining":1"#), "{b1}");
    f.svc.http("POST", "/json", body);
    let (s3, b3) = f.svc.http("POST", "/json", body);
    assert_eq!(s3, 429, "{b3}");
    assert!(b3.contains(r#""code":"OVER_LIMIT""#) && b3.contains(r#""unit":"MINUTE""#), "{b3}");
    assert!(b3.contains("retry-after"), "{b3}");
    assert_eq!(f.svc.http("POST", "/json", "{nope").0, 400);
    assert_eq!(f.svc.http("POST", "/json", r#"{"domain":"","descriptors":[]}"#).0, 400);
    let (hs, hb) = f.svc.http("GET", "/healthcheck", "");
    assert_eq!(hs, 200, "{hb}");
    assert!(hb.starts_with("OK"));
    let (_, m) = f.svc.http("GET", "/metrics", "");
    for name in [
        "ratelimit_service_rate_limit_total_hits{domain=\"atomic\",key1=\"ip\"} 3",
        "ratelimit_service_rate_limit_over_limit{domain=\"atomic\",key1=\"ip\"} 1",
        "ratelimit_service_rate_limit_within_limit{domain=\"atomic\",key1=\"ip\"} 2",
        "ratelimit_service_rate_limit_near_limit{domain=\"atomic\",key1=\"ip\"} 1",
        "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 4",
        "ratelimit_service_redis_calls{command=\"check\"} 3",
        "ratelimit_service_redis_latency_seconds_count 3",
        "ratelimit_service_config_load_success 1",
    ] {
        assert!(m.contains(name), "/metrics lacks '{name}':\n{m}");
    }
    let (_, cfg) = f.svc.http("GET", "/rlconfig", "");
    assert!(cfg.contains("atomic.ip: unit=MINUTE requests_per_unit=2"), "{cfg}");

    // gRPC: the draft headers on every response, Retry-After on a refusal.
    let mut c = f.svc.client().await;
    let both = request("atomic", vec![desc(&[("ip", "8.8.8.8")]), desc(&[("user", "h")])]);
    let r = ask(&mut c, both.clone()).await;
    assert_eq!(header(&r, "RateLimit-Policy"), Some("\"atomic.ip\";q=2;w=60, \"atomic.user\";q=100;w=3600"));
    assert_eq!(header(&r, "RateLimit"), Some("\"atomic.ip\";r=1;t=59, \"atomic.user\";r=99;t=7199"));
    assert!(header(&r, "Retry-After").is_none());
    ask(&mut c, both.clone()).await;
    let r = ask(&mut c, both).await;
    assert_eq!(header(&r, "Retry-After"), Some("59"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_headers_as_envoyproxy_sends_them() {
    // LIMIT_RESPONSE_HEADERS_ENABLED with a renamed limit header: the three fields of the
    // binding descriptor (the one with the least remaining), no draft headers.
    let f = fixture(&["--limit-response-headers-enabled", "true", "--limit-limit-header", "X-RateLimit-Limit"]);
    let mut c = f.svc.client().await;
    let both = || request("atomic", vec![desc(&[("ip", "7.7.7.7")]), desc(&[("user", "legacy")])]);
    let r = ask(&mut c, both()).await;
    assert_eq!(header(&r, "X-RateLimit-Limit"), Some("2"), "{r:?}");
    assert_eq!(header(&r, "RateLimit-Remaining"), Some("1"));
    assert_eq!(header(&r, "RateLimit-Reset"), Some("59"));
    assert!(header(&r, "RateLimit-Policy").is_none() && header(&r, "RateLimit").is_none());
    assert!(header(&r, "Retry-After").is_none());
    ask(&mut c, both()).await;
    let r = ask(&mut c, both()).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(header(&r, "RateLimit-Remaining"), Some("0"));
    assert_eq!(header(&r, "Retry-After"), Some("59"));
    // RESPONSE_HEADERS=off: none at all.
    let g = fixture(&["--response-headers", "off"]);
    let mut gc = g.svc.client().await;
    assert!(ask(&mut gc, both()).await.response_headers_to_add.is_empty());
}
