//! envoyproxy/ratelimit's README "Examples" 1–11, each configuration as the README gives it,
//! through the service over real gRPC (and /metrics over HTTP) against redis-server with the
//! module: every example answers what the README says. The module's clock is pinned
//! (DEBUG_CLOCK) at a day boundary, so no window rolls during a test.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use common::Server;
use redis_ratelimit_service::pb::Code;
use support::*;

const EXAMPLES: &[(&str, &str)] = &[
    (
        "1.yaml",
        "domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
",
    ),
    (
        "2.yaml",
        "domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
",
    ),
    (
        "3.yaml",
        "domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
",
    ),
    (
        "4a.yaml",
        "domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
",
    ),
    (
        "4b.yaml",
        "domain: example4_nested
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
",
    ),
    (
        "5.yaml",
        "domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
",
    ),
    (
        "6.yaml",
        "domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
",
    ),
    (
        "7.yaml",
        "domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
",
    ),
    (
        "8.yaml",
        "domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    ),
    (
        "9.yaml",
        "domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    ),
    (
        "10.yaml",
        "domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
",
    ),
    (
        "10w.yaml",
        "domain: example10_wildcard
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit:
              unit: minute
              requests_per_unit: 100
",
    ),
    (
        "11.yaml",
        "domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
",
    ),
    (
        "11m.yaml",
        "domain: example11_metrics
descriptors:
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit:
          unit: minute
          requests_per_unit: 60
",
    ),
];

struct Fixture {
    redis: Server,
    svc: ServiceProc,
    _dir: TempDir,
}

fn fixture() -> Fixture {
    let redis = Server::start();
    set_clock(&mut redis.conn(), (T0_S + 1) * 1_000_000);
    let dir = TempDir::new("examples");
    for (name, text) in EXAMPLES {
        dir.write(name, text);
    }
    let url = format!("127.0.0.1:{}", redis.port);
    let svc = ServiceProc::start(dir.path(), &["--redis-url", &url]);
    svc.wait_log("loaded rate limit configuration", std::time::Duration::from_secs(10));
    Fixture { redis, svc, _dir: dir }
}

fn with_hits(
    mut r: redis_ratelimit_service::pb::RateLimitRequest,
    n: u32,
) -> redis_ratelimit_service::pb::RateLimitRequest {
    r.hits_addend = n;
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_1_to_4_limits_nesting_and_matching_order() {
    let f = fixture();
    let mut c = f.svc.client().await;

    // Example 1: database=users and database=default each get 500/s, independently.
    let r = ask(&mut c, with_hits(request("mongo_cps", vec![desc(&[("database", "users")])]), 500)).await;
    assert!(ok(&r), "{r:?}");
    assert_eq!(remaining(&r), [0]);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (500, redis_ratelimit_service::pb::Unit::Second as i32));
    let r = ask(&mut c, request("mongo_cps", vec![desc(&[("database", "users")])])).await;
    assert_eq!(codes(&r), [Code::OverLimit]);
    let r = ask(&mut c, request("mongo_cps", vec![desc(&[("database", "default")])])).await;
    assert!(ok(&r));
    assert_eq!(remaining(&r), [499]);
    // No rule for another value: OK without a limit.
    let r = ask(&mut c, request("mongo_cps", vec![desc(&[("database", "other")])])).await;
    assert!(ok(&r) && r.statuses[0].current_limit.is_none());

    // Example 2: 5 marketing messages a day per number, 100 messages a day per number; both
    // descriptors in one request, "a logical OR of all the individual rate limit decisions".
    let both = |n: &str| {
        request("messaging", vec![desc(&[("message_type", "marketing"), ("to_number", n)]), desc(&[("to_number", n)])])
    };
    for i in 0..5 {
        let r = ask(&mut c, both("2061111111")).await;
        assert!(ok(&r), "marketing message {i}: {r:?}");
        assert_eq!(remaining(&r), [4 - i, 99 - i]);
    }
    let r = ask(&mut c, both("2061111111")).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(codes(&r), [Code::OverLimit, Code::Ok]);
    // The refused request took nothing from the per-number limit.
    assert_eq!(remaining(&r), [0, 95]);
    let r = ask(&mut c, request("messaging", vec![desc(&[("to_number", "2061111111")])])).await;
    assert_eq!(remaining(&r), [94]);
    // Another number has its own limits.
    let r = ask(&mut c, both("2062222222")).await;
    assert!(ok(&r));
    assert_eq!(remaining(&r), [4, 99]);
    let day = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((day.requests_per_unit, day.unit), (5, redis_ratelimit_service::pb::Unit::Day as i32));
    // The windows are calendar days: the reset is the end of this day.
    assert_eq!(r.statuses[0].duration_until_reset.as_ref().unwrap().seconds, 86_399);

    // Example 3: key+value is matched before the key alone; 50.0.0.5 gets 0 per second.
    let mut con = f.redis.conn();
    reset_stats(&mut con);
    let r = ask(&mut c, request("edge_proxy_per_ip", vec![desc(&[("remote_address", "50.0.0.5")])])).await;
    assert_eq!(codes(&r), [Code::OverLimit]);
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 0);
    assert_eq!(command_calls(&mut con), 0, "a limit of 0 is refused without Redis");
    for i in 0..10 {
        let r = ask(&mut c, request("edge_proxy_per_ip", vec![desc(&[("remote_address", "50.0.0.1")])])).await;
        assert!(ok(&r), "request {i} from 50.0.0.1");
    }
    let r = ask(&mut c, request("edge_proxy_per_ip", vec![desc(&[("remote_address", "50.0.0.1")])])).await;
    assert_eq!(codes(&r), [Code::OverLimit]);
    let r = ask(&mut c, request("edge_proxy_per_ip", vec![desc(&[("remote_address", "50.0.0.2")])])).await;
    assert!(ok(&r) && remaining(&r) == [9]);

    // Example 4: the request's depth must match the configuration's.
    let two = || desc(&[("key", "value"), ("subkey", "subvalue")]);
    let r = ask(&mut c, request("example4", vec![two()])).await;
    assert!(ok(&r) && r.statuses[0].current_limit.is_none(), "no match at another depth: {r:?}");
    let r = ask(&mut c, request("example4_nested", vec![two()])).await;
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 300);
    assert_eq!(remaining(&r), [299]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_5_to_7_unlimited_shadow_mode_and_replaces() {
    let f = fixture();
    let mut c = f.svc.client().await;
    let mut con = f.redis.conn();

    // Example 5: unlimited is answered locally with LimitRemaining = MaxUint32.
    reset_stats(&mut con);
    let r = ask(&mut c, request("internal", vec![desc(&[("ldap", "x")])])).await;
    assert!(ok(&r));
    assert_eq!(remaining(&r), [u32::MAX]);
    assert_eq!(command_calls(&mut con), 0, "unlimited descriptors are not sent to Redis");
    // Its hits are counted (envoyproxy/ratelimit leaves an unlimited rule's stats at 0).
    let labels = "domain=\"internal\",key1=\"ldap\"";
    assert_eq!(f.svc.metric(&format!("ratelimit_service_rate_limit_total_hits{{{labels}}}")), 1);
    assert_eq!(f.svc.metric(&format!("ratelimit_service_rate_limit_within_limit{{{labels}}}")), 1);
    let r = ask(&mut c, request("internal", vec![desc(&[("azure", "x")])])).await;
    assert_eq!(remaining(&r), [99]);

    // Example 6: user-a is in shadow mode: never refused, breaches counted; user-b is limited
    // to 20/s.
    let a = || request("example6", vec![desc(&[("service", "auth-service"), ("user", "user-a")])]);
    for i in 0..15 {
        let r = ask(&mut c, a()).await;
        assert!(ok(&r), "shadow mode refused request {i}: {r:?}");
        assert_eq!(codes(&r), [Code::Ok]);
    }
    let b = || request("example6", vec![desc(&[("service", "auth-service"), ("user", "user-b")])]);
    for i in 0..20 {
        assert!(ok(&ask(&mut c, b()).await), "user-b request {i}");
    }
    assert_eq!(codes(&ask(&mut c, b()).await), [Code::OverLimit]);
    let labels = "domain=\"example6\",key1=\"service\",key2=\"user_user-a\"";
    assert_eq!(f.svc.metric(&format!("ratelimit_service_rate_limit_shadow_mode{{{labels}}}")), 5);
    assert_eq!(f.svc.metric(&format!("ratelimit_service_rate_limit_over_limit{{{labels}}}")), 5);
    assert_eq!(f.svc.metric(&format!("ratelimit_service_rate_limit_total_hits{{{labels}}}")), 15);

    // Example 7: with both descriptors, the replacing 10/s limit applies and the 5/s one is
    // not evaluated (nor consumed).
    let one = || desc(&[("key_1", "value_1"), ("user", "bkthomps")]);
    let two = || desc(&[("key_2", "value_2"), ("user", "bkthomps")]);
    for i in 0..10 {
        let r = ask(&mut c, request("example7", vec![one(), two()])).await;
        assert!(ok(&r), "request {i} with both descriptors: {r:?}");
        assert!(r.statuses[0].current_limit.is_none(), "the replaced limit is dropped");
        assert_eq!(remaining(&r)[1], 9 - i);
    }
    assert_eq!(r_code(&ask(&mut c, request("example7", vec![one(), two()])).await), Code::OverLimit);
    // The 5/s limit was never touched.
    let r = ask(&mut c, request("example7", vec![one()])).await;
    assert!(ok(&r));
    assert_eq!(remaining(&r), [4]);
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "specific_limit");
}

fn r_code(r: &redis_ratelimit_service::pb::RateLimitResponse) -> Code {
    Code::try_from(r.overall_code).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_8_to_11_metrics_wildcards_and_shared_thresholds() {
    let f = fixture();
    let mut c = f.svc.client().await;

    // Example 8: detailed_metric: the matched value is in the stats key; limits unchanged.
    for v in ["unspecified_value", "unspecified_value2"] {
        let r = ask(&mut c, request("example8", vec![desc(&[("key1", v)])])).await;
        assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 10);
    }
    let r = ask(&mut c, request("example8", vec![desc(&[("key1", "value1")])])).await;
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 20);
    for key in ["key1_unspecified_value", "key1_unspecified_value2", "key1_value1"] {
        let s = format!("ratelimit_service_rate_limit_total_hits{{domain=\"example8\",key1=\"{key}\"}}");
        assert_eq!(f.svc.metric(&s), 1, "{s}");
    }
    assert_eq!(f.svc.metric("ratelimit_service_rate_limit_total_hits{domain=\"example8\",key1=\"key1\"}"), 0);

    // Example 9: trailing, middle and multiple wildcards; each matching value has its own
    // threshold.
    for (k, v, limited) in [
        ("key1", "value1", true),
        ("key1", "valueXYZ", true),
        ("key1", "valu", false),
        ("path", "/api/123/action", true),
        ("path", "/api/user-id/action", true),
        ("path", "/api/123/other", false),
        ("route", "/api/v1/resource/123/action", true),
        ("route", "/api/v2/resource/456/action", true),
        ("route", "/api/v2/resource/456/other", false),
    ] {
        let r = ask(&mut c, request("example9", vec![desc(&[(k, v)])])).await;
        assert_eq!(r.statuses[0].current_limit.is_some(), limited, "{k}={v}: {r:?}");
        if limited {
            assert_eq!(remaining(&r), [19], "{k}={v} has its own threshold");
        }
    }

    // Example 10: value_to_metric puts the runtime values in the stats key.
    for (route, method, id) in [("api", "GET", "123"), ("web", "POST", "456")] {
        let r = ask(
            &mut c,
            request("example10", vec![desc(&[("route", route), ("http_method", method), ("subject_id", id)])]),
        )
        .await;
        assert_eq!(remaining(&r), [59]);
    }
    for (k1, k2) in [("route_api", "http_method_GET"), ("route_web", "http_method_POST")] {
        let s = format!(
            "ratelimit_service_rate_limit_total_hits{{domain=\"example10\",key1=\"{k1}\",key2=\"{k2}\",key3=\"subject_id\"}}"
        );
        assert_eq!(f.svc.metric(&s), 1, "{s}");
    }
    let r = ask(
        &mut c,
        request(
            "example10_wildcard",
            vec![desc(&[("user", "alice"), ("action", "readfile"), ("resource", "documents")])],
        ),
    )
    .await;
    assert_eq!(remaining(&r), [99]);
    assert_eq!(
        f.svc.metric("ratelimit_service_rate_limit_total_hits{domain=\"example10_wildcard\",key1=\"user_alice\",key2=\"action_readfile\",key3=\"resource\"}"),
        1
    );

    // Example 11: share_threshold: files/* share one threshold; files_no_share/* do not.
    for f_ in ["files/a.pdf", "files/b.csv"] {
        for _ in 0..5 {
            assert!(ok(&ask(&mut c, request("example11", vec![desc(&[("files", f_)])])).await));
        }
    }
    let r = ask(&mut c, request("example11", vec![desc(&[("files", "files/c.txt")])])).await;
    assert_eq!(codes(&r), [Code::OverLimit], "the shared threshold of 10 is reached");
    for _ in 0..10 {
        assert!(
            ok(&ask(&mut c, request("example11", vec![desc(&[("files_no_share", "files_no_share/a.pdf")])])).await)
        );
    }
    let r = ask(&mut c, request("example11", vec![desc(&[("files_no_share", "files_no_share/a.pdf")])])).await;
    assert_eq!(codes(&r), [Code::OverLimit]);
    let r = ask(&mut c, request("example11", vec![desc(&[("files_no_share", "files_no_share/b.csv")])])).await;
    assert!(ok(&r), "an isolated threshold");
    assert_eq!(remaining(&r), [9]);
    // share_threshold with value_to_metric: the stats key carries the wildcard pattern (as
    // envoyproxy/ratelimit's code and tests do: `route_api/*`; its README's prose says `api`).
    let r = ask(&mut c, request("example11_metrics", vec![desc(&[("route", "api/v1"), ("method", "GET")])])).await;
    assert_eq!(remaining(&r), [59]);
    let r = ask(&mut c, request("example11_metrics", vec![desc(&[("route", "api/v2"), ("method", "GET")])])).await;
    assert_eq!(remaining(&r), [58], "api/v1 and api/v2 share the threshold");
    assert_eq!(
        f.svc.metric("ratelimit_service_rate_limit_total_hits{domain=\"example11_metrics\",key1=\"route_api/*\",key2=\"method\"}"),
        2
    );
}
