//! The Rate Limit Quota Service (docs/quota-service.md) against the real service binary and a
//! real redis-server with the module, driven by a gRPC client that speaks to it as Envoy 1.40
//! does (reports of bucket usages, every bucket every period; the pushes read back). What
//! Envoy itself does with the pushes: tests/envoy_quota.rs.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::Server;
use redis_ratelimit_service::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use redis_ratelimit_service::pb::envoy::r#type::v3::TokenBucket;
use redis_ratelimit_service::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use redis_ratelimit_service::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use redis_ratelimit_service::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use redis_ratelimit_service::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use redis_ratelimit_service::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use redis_ratelimit_service::pb::Code;
use redis_ratelimit_service::quota::stream::receiver_stream;
use support::*;
use tokio::sync::mpsc;

const CONFIG: &str = "domain: edge
descriptors:
  - key: api
    value: public
    rate_limit: {requests_per_unit: 100, unit: second, algorithm: gcra, burst: 50}
  - key: hot
    rate_limit: {requests_per_unit: 1, unit: second, algorithm: gcra, burst: 2}
  - key: slow
    rate_limit: {requests_per_unit: 60, unit: minute, algorithm: gcra}
  - key: window
    rate_limit: {requests_per_unit: 30, unit: minute}
  - key: user
    descriptors:
      - key: path
        rate_limit: {requests_per_unit: 10, unit: second, algorithm: token_bucket}
  - key: vip
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {requests_per_unit: 0, unit: second}
  - key: trial
    shadow_mode: true
    rate_limit: {requests_per_unit: 3, unit: hour}
";

/// One bucket id.
fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId { bucket: entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
}

/// A client speaking to the service as Envoy does on one stream.
struct FakeEnvoy {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: tonic::Streaming<RateLimitQuotaResponse>,
    domain: String,
}

impl FakeEnvoy {
    async fn connect(svc: &ServiceProc, domain: &str) -> FakeEnvoy {
        let mut client =
            RateLimitQuotaServiceClient::connect(format!("http://{}", svc.grpc)).await.expect("grpc connect");
        let (tx, rx) = mpsc::channel(16);
        let rx =
            client.stream_rate_limit_quotas(receiver_stream(rx)).await.expect("StreamRateLimitQuotas").into_inner();
        FakeEnvoy { tx, rx, domain: domain.to_string() }
    }

    /// A report: (bucket, allowed, denied) per bucket.
    async fn report(&self, usages: &[(&BucketId, u64, u64)]) {
        let r = RateLimitQuotaUsageReports {
            domain: self.domain.clone(),
            bucket_quota_usages: usages
                .iter()
                .map(|(b, a, d)| BucketQuotaUsage {
                    bucket_id: Some((*b).clone()),
                    time_elapsed: Some(prost_types::Duration { seconds: 5, nanos: 0 }),
                    num_requests_allowed: *a,
                    num_requests_denied: *d,
                })
                .collect(),
        };
        self.tx.send(r).await.expect("the stream is open");
    }

    /// The next response within `within`; None when none came.
    async fn next(&mut self, within: Duration) -> Option<Result<RateLimitQuotaResponse, tonic::Status>> {
        match tokio::time::timeout(within, self.rx.message()).await {
            Err(_) => None,
            Ok(Ok(Some(r))) => Some(Ok(r)),
            Ok(Ok(None)) => Some(Err(tonic::Status::ok("end of stream"))),
            Ok(Err(e)) => Some(Err(e)),
        }
    }

    /// The next response's actions, which must come within 5 s.
    async fn actions(&mut self) -> Vec<BucketAction> {
        match self.next(Duration::from_secs(5)).await {
            Some(Ok(r)) => r.bucket_action,
            other => panic!("expected a response, got {other:?}"),
        }
    }
}

/// What an action does, for assertions.
#[derive(Debug, PartialEq, Eq)]
enum Push {
    Allow(i64),
    Deny(i64),
    /// max_tokens, tokens_per_fill, fill_interval seconds, TTL seconds.
    Bucket(u32, u32, i64, i64),
    Abandon,
}

fn push(a: &BucketAction) -> Push {
    match a.bucket_action.as_ref().expect("an action") {
        Kind::AbandonAction(_) => Push::Abandon,
        Kind::QuotaAssignmentAction(q) => {
            let ttl = q.assignment_time_to_live.expect("every assignment has a TTL");
            assert_eq!(ttl.nanos, 0, "whole seconds");
            match q.rate_limit_strategy.and_then(|s| s.strategy).expect("a strategy") {
                Strategy::BlanketRule(r) if r == BlanketRule::AllowAll as i32 => Push::Allow(ttl.seconds),
                Strategy::BlanketRule(_) => Push::Deny(ttl.seconds),
                Strategy::TokenBucket(TokenBucket { max_tokens, tokens_per_fill, fill_interval }) => {
                    let f = fill_interval.expect("fill_interval");
                    assert_eq!(f.nanos, 0, "whole seconds");
                    Push::Bucket(max_tokens, tokens_per_fill.expect("tokens_per_fill"), f.seconds, ttl.seconds)
                }
                other => panic!("unexpected strategy {other:?}"),
            }
        }
    }
}

/// The pushes by bucket (its `key=value,…` sorted), in order.
fn by_bucket(actions: &[BucketAction]) -> HashMap<String, Vec<Push>> {
    let mut out: HashMap<String, Vec<Push>> = HashMap::new();
    for a in actions {
        let mut kv: Vec<String> =
            a.bucket_id.as_ref().unwrap().bucket.iter().map(|(k, v)| format!("{k}={v}")).collect();
        kv.sort();
        out.entry(kv.join(",")).or_default().push(push(a));
    }
    out
}

/// Every `line` (`name{labels} value`) is in the service's /metrics.
fn assert_metrics(svc: &ServiceProc, lines: &[&str]) {
    let metrics = svc.http("GET", "/metrics", "").1;
    for line in lines {
        assert!(metrics.contains(&format!("{line}\n")), "{line} not in\n{metrics}");
    }
}

fn start(redis: &Server, config: &str, extra: &[&str]) -> (TempDir, ServiceProc) {
    let dir = TempDir::new("quota");
    dir.write("edge.yaml", config);
    let url = format!("127.0.0.1:{}", redis.port);
    let mut args = vec!["--redis-url", url.as_str()];
    args.extend_from_slice(extra);
    let svc = ServiceProc::start(dir.path(), &args);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    (dir, svc)
}

/// One service on a fresh redis-server with the module (its clock pinned at [`T0_S`] + 1 s when
/// `pinned`), a connection to Redis with its command stats reset, and a stream of the `edge`
/// domain.
struct Setup {
    redis: Server,
    con: redis::Connection,
    _dir: TempDir,
    svc: ServiceProc,
    envoy: FakeEnvoy,
}

async fn setup(pinned: bool, extra: &[&str]) -> Setup {
    let redis = Server::start();
    let mut con = redis.conn();
    if pinned {
        set_clock(&mut con, (T0_S + 1) * 1_000_000);
    }
    let (_dir, svc) = start(&redis, CONFIG, extra);
    reset_stats(&mut con);
    let envoy = FakeEnvoy::connect(&svc, "edge").await;
    Setup { redis, con, _dir, svc, envoy }
}

/// A lease is `[DENY_ALL, token bucket {granted, 1 per day}]` with a TTL of QUOTA_LEASE,
/// claimed from the key ShouldRateLimit uses for the same entries; it is replaced every
/// QUOTA_REFRESH with one claim each; the limit is shared with ShouldRateLimit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_claimed_then_pushed_and_replaced_on_the_service_clock() {
    let Setup { redis: _redis, mut con, _dir, svc, mut envoy } = setup(true, &[]).await;
    let b = bucket(&[("hot", "h")]);
    // The bucket's first report (Envoy sends it at once, counting the request that made it).
    envoy.report(&[(&b, 1, 0)]).await;
    let started = Instant::now();
    let first = by_bucket(&envoy.actions().await);
    // An even split of the rate over QUOTA_REFRESH (1/s × 500 ms, rounded up, + 1 = 2), at most
    // the burst (2).
    assert_eq!(first["hot=h"], vec![Push::Deny(1), Push::Bucket(2, 1, 86_400, 1)]);
    assert_eq!(command_calls_of(&mut con, "rl.gcra"), 1);
    // The clock is pinned: the bucket is empty, and ShouldRateLimit on the same descriptor sees it.
    let mut c = svc.client().await;
    let r = ask(&mut c, request("edge", vec![desc(&[("hot", "h")])])).await;
    assert!(!ok(&r), "the lease took the whole burst: {r:?}");
    // The next lease half a second later, with no report: nothing left, so DENY_ALL alone.
    let second = by_bucket(&envoy.actions().await);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(450) && waited < Duration::from_millis(1500), "{waited:?}");
    assert_eq!(second["hot=h"], vec![Push::Deny(1)]);
    // The clock moves 1 s: one unit refilled, the next lease takes it.
    advance_clock(&mut con, 1_000_000);
    let third = by_bucket(&envoy.actions().await);
    assert_eq!(third["hot=h"], vec![Push::Deny(1), Push::Bucket(1, 1, 86_400, 1)]);
    // One claim per lease, and ShouldRateLimit's check (RL.GCRA too).
    assert_eq!(command_calls_of(&mut con, "rl.gcra"), 4);
    assert_metrics(
        &svc,
        &[
            "ratelimit_service_quota_streams 1",
            "ratelimit_service_quota_buckets 1",
            "ratelimit_service_quota_assignments{kind=\"lease\"} 2",
            "ratelimit_service_quota_assignments{kind=\"deny\"} 1",
            "ratelimit_service_quota_units_granted 3",
        ],
    );
}

/// A bucket's entries are one descriptor whatever their order; the rule decides the push:
/// leases, or a static action (unknown, unlimited, zero, shadow mode) with QUOTA_STATIC_TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_are_descriptors_and_static_rules_get_static_actions() {
    let Setup { redis, mut con, _dir, svc, mut envoy } = setup(true, &[]).await;
    let (nested, vip, blocked, trial, unknown) = (
        bucket(&[("path", "/a"), ("user", "bob")]),
        bucket(&[("vip", "x")]),
        bucket(&[("blocked", "x")]),
        bucket(&[("trial", "t")]),
        bucket(&[("nobody", "x")]),
    );
    envoy.report(&[(&nested, 1, 0), (&vip, 3, 0), (&blocked, 0, 2), (&trial, 5, 0), (&unknown, 1, 0)]).await;
    let mut got = HashMap::new();
    while got.len() < 5 {
        got.extend(by_bucket(&envoy.actions().await));
    }
    assert_eq!(got["path=/a,user=bob"], vec![Push::Deny(1), Push::Bucket(6, 1, 86_400, 1)]);
    assert_eq!(got["vip=x"], vec![Push::Allow(60)]);
    assert_eq!(got["blocked=x"], vec![Push::Deny(60)]);
    assert_eq!(got["trial=t"], vec![Push::Allow(60)]);
    assert_eq!(got["nobody=x"], vec![Push::Allow(60)]);
    // user → path, as configured (the key ShouldRateLimit uses for the same descriptor).
    let info: redis::Value =
        redis::cmd("RL.INFO").arg("rls:token_bucket:edge|user=bob|path=/a").query(&mut con).unwrap();
    assert_ne!(info, redis::Value::Nil, "the nested bucket's key");
    // Shadow mode: the 5 admitted requests are charged afterwards (3 within the limit, 2 over).
    wait_until(Duration::from_secs(5), "the shadow-mode charge", || {
        svc.metric("ratelimit_service_rate_limit_shadow_mode{domain=\"edge\",key1=\"trial\"}") == 2
    });
    assert_metrics(
        &svc,
        &[
            "ratelimit_service_quota_unknown_buckets 1",
            "ratelimit_service_quota_assignments{kind=\"static\"} 4",
            "ratelimit_service_rate_limit_within_limit{domain=\"edge\",key1=\"vip\"} 3",
            "ratelimit_service_rate_limit_over_limit{domain=\"edge\",key1=\"blocked\"} 2",
        ],
    );
    // QUOTA_UNKNOWN_BUCKETS=deny.
    let (_dir2, deny) = start(&redis, CONFIG, &["--quota-unknown-buckets", "deny"]);
    let mut envoy = FakeEnvoy::connect(&deny, "edge").await;
    envoy.report(&[(&unknown, 1, 0)]).await;
    assert_eq!(by_bucket(&envoy.actions().await)["nobody=x"], vec![Push::Deny(60)]);
    // An unknown domain: every bucket unknown.
    let mut other = FakeEnvoy::connect(&deny, "elsewhere").await;
    other.report(&[(&vip, 1, 0)]).await;
    assert_eq!(by_bucket(&other.actions().await)["vip=x"], vec![Push::Deny(60)]);
}

/// A report showing no request since the previous one abandons the bucket and gives back the
/// leases that ended unused (RL.RETURN … AGE); the last lease, possibly in use, is kept counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_bucket_is_abandoned_and_its_unused_leases_given_back() {
    // The real clock: RL.RETURN credits `units − rate × AGE` against the bucket's history.
    let Setup { redis: _redis, mut con, _dir, svc, mut envoy } = setup(false, &[]).await;
    let b = bucket(&[("slow", "s")]);
    envoy.report(&[(&b, 1, 0)]).await;
    // 60 per minute: a lease of 1 + 1 units each 500 ms (life 1 s).
    let mut leases = 0;
    let until = Instant::now() + Duration::from_millis(2600);
    while Instant::now() < until {
        if let Some(Ok(r)) = envoy.next(until - Instant::now()).await {
            for p in by_bucket(&r.bucket_action).remove("slow=s").unwrap_or_default() {
                if let Push::Bucket(n, ..) = p {
                    assert_eq!(n, 2);
                    leases += 1;
                }
            }
        }
    }
    assert!((4..=7).contains(&leases), "{leases} leases in 2.6 s");
    envoy.report(&[(&b, 0, 0)]).await;
    let r = by_bucket(&envoy.actions().await);
    assert_eq!(r["slow=s"], vec![Push::Abandon]);
    // Leases replaced at least QUOTA_LEASE (1 s) before the idle report come back: 2.6 s of
    // leases every 500 ms, the last three or so kept.
    wait_until(Duration::from_secs(5), "RL.RETURN", || command_calls_of(&mut con, "rl.return") == 1);
    let returned = svc.metric("ratelimit_service_quota_units_returned");
    assert!(returned > 0, "credited {returned}");
    assert_eq!(svc.metric("ratelimit_service_quota_abandons"), 1);
    assert_eq!(svc.metric("ratelimit_service_quota_buckets"), 0);
    // No more leases for it.
    assert!(envoy.next(Duration::from_millis(1200)).await.is_none());
}

/// The even split counts the bucket's holders on every replica (docs/quota-service.md, "The
/// holders, counted across the fleet"): two streams on one replica, one on another, a new
/// bucket (no periodic report: leases of the even split) of 100/s with a burst of 50 (a lease
/// every 500 ms). Each replica first splits by its own streams (the lone stream asks the whole
/// 50); once the holders are counted, every lease asks `⌈100/s × 500 ms ÷ 3⌉ + 1` = 18, so none
/// is granted more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_even_split_counts_the_holders_on_every_replica() {
    let redis = Server::start();
    let (_d1, svc1) = start(&redis, CONFIG, &[]);
    let (_d2, svc2) = start(&redis, CONFIG, &[]);
    let b = bucket(&[("api", "public")]);
    let mut envoys = [
        FakeEnvoy::connect(&svc1, "edge").await,
        FakeEnvoy::connect(&svc1, "edge").await,
        FakeEnvoy::connect(&svc2, "edge").await,
    ];
    for e in &envoys {
        e.report(&[(&b, 1, 0)]).await;
    }
    // The leases granted to each, read as they come, with when.
    let started = Instant::now();
    let mut granted: Vec<Vec<(Duration, u32)>> = vec![Vec::new(); envoys.len()];
    while started.elapsed() < Duration::from_millis(6500) {
        for (i, e) in envoys.iter_mut().enumerate() {
            if let Some(Ok(r)) = e.next(Duration::from_millis(20)).await {
                for p in by_bucket(&r.bucket_action).remove("api=public").unwrap_or_default() {
                    if let Push::Bucket(n, ..) = p {
                        granted[i].push((started.elapsed(), n));
                    }
                }
            }
        }
    }
    // Counted exactly once two of the counter's windows and a span have passed (4.5 s: the
    // module's sliding window weighs its previous window as if evenly filled, and all three
    // began at once, part way into one).
    for (i, g) in granted.iter().enumerate() {
        let late: Vec<u32> = g.iter().filter(|(t, _)| *t >= Duration::from_millis(4600)).map(|(_, n)| *n).collect();
        assert!(late.len() >= 2 && late.iter().all(|n| *n <= 18), "Envoy {i}: leases {g:?}");
    }
    assert!(svc2.metric("ratelimit_service_redis_calls{command=\"holders\"}") >= 6);
}

/// The service's Redis user needs only the module's commands on the service's keys: a user
/// granted `~rls:*` (CACHE_KEY_PREFIX) and, by name (Redis 7.0 has no ACL category for module
/// commands; where `@ratelimit` exists it grants them), RL.GCRA, RL.SLIDING and RL.RETURN and
/// nothing else, leases and counts the bucket's holders: the holder counter is under the
/// prefix and takes the module's own command. Without RL.SLIDING it still leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_user_with_only_the_modules_commands_leases_and_counts_holders() {
    let redis = Server::start();
    let mut con = redis.conn();
    let (_dir, svc) =
        leases_as_user(&redis, &mut con, "quota", &["+rl.gcra", "+rl.sliding", "+rl.return"], &[("api", "public")])
            .await;
    assert!(command_calls_of(&mut con, "rl.sliding") >= 2);
    let counter: bool = redis::cmd("EXISTS").arg("rls:gcra:edge|api=public|holders").query(&mut con).unwrap();
    assert!(counter, "no holder counter");
    assert_eq!(svc.metric("ratelimit_service_quota_holder_counts_failed"), 0);
    // Not granted INFO modules: the module probe cannot tell, and says so (once).
    svc.wait_log("Redis refused INFO modules", Duration::from_secs(5));
    assert_eq!(svc.log().matches("Redis refused INFO modules").count(), 1);
    // A user not granted RL.SLIDING: the holder count fails (NOPERM), never the lease.
    let entries = [("user", "u"), ("path", "p")];
    let (_dir, svc) = leases_as_user(&redis, &mut con, "noholders", &["+rl.tokenbucket", "+rl.return"], &entries).await;
    assert!(svc.metric("ratelimit_service_quota_holder_counts_failed") >= 2);
}

/// docs/service.md's Redis user ("The Redis user"), as written, for this server (`+@ratelimit`
/// where the server has the category, the command names on Redis 7.0 and 7.2), is the
/// service's only user: ShouldRateLimit decides one descriptor (`RL.FIXED`), several (`RL.MULTI`)
/// and a shadow-mode one beside an enforced one (the script), the quota service leases and
/// counts the bucket's holders, /healthcheck is healthy, and Redis refused nothing the service
/// sent (ACL LOG: only redis-rs's ignored `CLIENT SETINFO`). The same user reaches nothing
/// outside `rls:*` and no other command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_redis_user_is_all_the_service_needs_and_reaches_nothing_else() {
    let redis = Server::start();
    let mut con = redis.conn();
    let acl = doc_redis_user(redis.version().has_module_acl_category(), None);
    redis::cmd("ACL").arg(&acl).query::<()>(&mut con).unwrap_or_else(|e| panic!("{acl:?}: {e}"));
    let user = acl[1].as_str();
    let pw = acl.iter().find_map(|a| a.strip_prefix('>')).expect("a password");
    redis::cmd("ACL").arg("LOG").arg("RESET").query::<()>(&mut con).unwrap();
    reset_stats(&mut con);

    // The quota service: two leases, and the holder counter charged.
    let (_dir, svc) = leases_with_auth(&redis, &format!("{user}:{pw}"), &[("api", "public")]).await;
    let counter: bool = redis::cmd("EXISTS").arg("rls:gcra:edge|api=public|holders").query(&mut con).unwrap();
    assert!(counter, "no holder counter");
    assert_eq!(svc.metric("ratelimit_service_quota_holder_counts_failed"), 0);

    // ShouldRateLimit: one descriptor, two (one RL.MULTI), a shadow-mode one beside an
    // enforced one (the script).
    let mut c = svc.client().await;
    let one = ask(&mut c, request("edge", vec![desc(&[("window", "w1")])])).await;
    assert_eq!((codes(&one), remaining(&one)), (vec![Code::Ok], vec![29]), "{one:?}");
    let two =
        ask(&mut c, request("edge", vec![desc(&[("window", "w2")]), desc(&[("user", "u"), ("path", "p")])])).await;
    assert_eq!((codes(&two), remaining(&two)), (vec![Code::Ok, Code::Ok], vec![29, 9]), "{two:?}");
    let shadow = ask(&mut c, request("edge", vec![desc(&[("trial", "t")]), desc(&[("window", "w3")])])).await;
    assert_eq!((codes(&shadow), remaining(&shadow)), (vec![Code::Ok, Code::Ok], vec![2, 29]), "{shadow:?}");
    for cmd in ["rl.fixed", "rl.multi", "rl.gcra", "rl.sliding"] {
        assert!(command_calls_of(&mut con, cmd) >= 1, "{cmd} never ran");
    }
    assert!(command_calls_of(&mut con, "evalsha") + command_calls_of(&mut con, "eval") >= 1, "the script never ran");
    for key in ["rls:fixed:edge|window=w1", "rls:fixed:edge|window=w2", "rls:fixed:edge|trial=t"] {
        let exists: bool = redis::cmd("EXISTS").arg(key).query(&mut con).unwrap();
        assert!(exists, "{key}: not written");
    }
    assert_eq!(svc.metric("ratelimit_service_redis_invalid_requests"), 0);

    // Healthy, and the module probe (INFO modules, at start) was not refused: Redis refused
    // none of the service's commands but redis-rs's CLIENT SETINFO (7.2+; ignored).
    let (status, body) = svc.http("GET", "/healthcheck", "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        acl_log(&mut con),
        Vec::<(String, String)>::new(),
        "Redis refused these (reason, object) to the service"
    );

    // Nothing else: other keys, other commands, other INFO sections.
    let client = redis::Client::open(format!("redis://{user}:{pw}@127.0.0.1:{}/", redis.port)).unwrap();
    let mut as_user = client.get_connection().unwrap();
    let denied: [&[&str]; 8] = [
        &["GET", "other"],
        &["SET", "other", "1"],
        &["DEL", "other"],
        &["GET", "rls:fixed:edge|window=w1"],
        &["RL.GCRA", "other", "10", "1s"],
        &["FLUSHALL"],
        &["CONFIG", "GET", "maxmemory"],
        &["INFO", "keyspace"],
    ];
    for args in denied {
        let r: redis::RedisResult<redis::Value> = redis::cmd(args[0]).arg(&args[1..]).query(&mut as_user);
        assert!(matches!(&r, Err(e) if e.code() == Some("NOPERM")), "{args:?} as {user}: {r:?}");
    }
    let script_outside: redis::RedisResult<redis::Value> =
        redis::cmd("EVAL").arg("return redis.call('SET', KEYS[1], '1')").arg(1).arg("rls:x").query(&mut as_user);
    assert!(script_outside.is_err(), "a script ran SET as {user}: {script_outside:?}");
    let n: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    let other: bool = redis::cmd("EXISTS").arg("other").query(&mut con).unwrap();
    assert!(n > 0 && !other, "the refused commands wrote");
}

/// A service whose Redis user is `user`, granted `~rls:*` and `commands` only: a bucket of
/// `entries` gets two leases with units, and no claim fails.
async fn leases_as_user(
    redis: &Server,
    con: &mut redis::Connection,
    user: &str,
    commands: &[&str],
    entries: &[(&str, &str)],
) -> (TempDir, ServiceProc) {
    let mut acl = vec!["SETUSER", user, "on", ">pw", "resetkeys", "~rls:*", "-@all"];
    acl.extend_from_slice(commands);
    redis::cmd("ACL").arg(&acl).query::<()>(con).unwrap();
    leases_with_auth(redis, &format!("{user}:pw"), entries).await
}

/// A service authenticating with `auth` (`user:password`): a bucket of `entries` gets two
/// leases with units, and no claim fails.
async fn leases_with_auth(redis: &Server, auth: &str, entries: &[(&str, &str)]) -> (TempDir, ServiceProc) {
    let user = auth.split(':').next().unwrap_or(auth);
    let (dir, svc) = start(redis, CONFIG, &["--redis-auth", auth]);
    let mut envoy = FakeEnvoy::connect(&svc, "edge").await;
    let b = bucket(entries);
    envoy.report(&[(&b, 1, 0)]).await;
    let mut sorted: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
    sorted.sort();
    for _ in 0..2 {
        let pushed = by_bucket(&envoy.actions().await);
        assert!(
            matches!(pushed[&sorted.join(",")].as_slice(), [Push::Deny(1), Push::Bucket(n, 1, 86_400, 1)] if *n > 0),
            "{user}: {pushed:?}"
        );
    }
    assert_eq!(svc.metric("ratelimit_service_quota_claims_failed"), 0, "{user}");
    (dir, svc)
}

/// Redis down: each domain's failure mode decides what the leases become, until it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_pushes_the_failure_mode() {
    let mut redis = Server::start();
    let dir = TempDir::new("quota-modes");
    for m in FAILURE_MODES {
        dir.write(
            &format!("{m}.yaml"),
            &format!(
                "domain: q_{m}\nfailure_mode: {m}\ndescriptors:\n  - key: k\n    rate_limit: {{requests_per_unit: 1000, unit: second, algorithm: gcra, burst: 100}}\n"
            ),
        );
    }
    let url = format!("127.0.0.1:{}", redis.port);
    let svc = ServiceProc::start(dir.path(), &["--redis-url", &url, "--instances", "2", "--redis-timeout", "50ms"]);
    svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
    redis.kill9();
    let b = bucket(&[("k", "v")]);
    let mut seen = HashMap::new();
    for m in FAILURE_MODES {
        let mut envoy = FakeEnvoy::connect(&svc, &format!("q_{m}")).await;
        envoy.report(&[(&b, 1, 0)]).await;
        let pushed = match envoy.next(Duration::from_secs(2)).await {
            Some(Ok(r)) => by_bucket(&r.bucket_action).remove("k=v").unwrap(),
            None => Vec::new(),
            Some(Err(e)) => panic!("{m}: {e}"),
        };
        seen.insert(m, pushed);
    }
    assert_eq!(seen["closed"], vec![Push::Deny(1)]);
    assert_eq!(seen["open"], vec![Push::Allow(1)]);
    // 1000/s burst 100 ÷ (1 Envoy × INSTANCES 2): 500 per second, 50.
    assert_eq!(seen["local"], vec![Push::Bucket(50, 500, 1, 1)]);
    // `error`: nothing; Envoy's own configuration decides when the lease it has runs out.
    assert_eq!(seen["error"], Vec::<Push>::new());
    assert!(svc.metric("ratelimit_service_quota_claims_failed") >= 3);
    // Back: leases again.
    redis.start_again();
    let mut envoy = FakeEnvoy::connect(&svc, "q_closed").await;
    envoy.report(&[(&b, 1, 0)]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = by_bucket(&envoy.actions().await);
        if matches!(r.get("k=v").map(|v| v.as_slice()), Some([Push::Deny(1), Push::Bucket(..)])) {
            break;
        }
        assert!(Instant::now() < deadline, "no lease after Redis came back: {r:?}");
    }
}

/// At most QUOTA_MAX_BUCKETS buckets are tracked; a bucket past it gets its failure mode's
/// action (here `closed`: DENY_ALL, for QUOTA_STATIC_TTL), and a place once one is free.
/// A report over QUOTA_MAX_REPORT_BYTES ends the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_is_bounded() {
    let redis = Server::start();
    let config = format!("{CONFIG}failure_mode: closed\n");
    let (_dir, svc) = start(&redis, &config, &["--quota-max-buckets", "2", "--quota-max-report-bytes", "100000"]);
    let mut envoy = FakeEnvoy::connect(&svc, "edge").await;
    let users: Vec<BucketId> = (0..3).map(|i| bucket(&[("user", &format!("u{i}")), ("path", "/")])).collect();
    envoy.report(&[(&users[0], 1, 0), (&users[1], 1, 0), (&users[2], 1, 0)]).await;
    let mut got = HashMap::new();
    while got.len() < 3 {
        got.extend(by_bucket(&envoy.actions().await));
    }
    assert_eq!(got["path=/,user=u2"], vec![Push::Deny(60)], "{got:?}");
    assert_eq!(svc.metric("ratelimit_service_quota_buckets"), 2);
    assert_eq!(svc.metric("ratelimit_service_quota_buckets_refused"), 1);
    // u0 goes idle: abandoned; u2's next report gets its place.
    envoy.report(&[(&users[0], 0, 0), (&users[1], 1, 0), (&users[2], 1, 0)]).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got: HashMap<String, Vec<Push>> = HashMap::new();
    while !got.contains_key("path=/,user=u2") {
        for (k, v) in by_bucket(&envoy.actions().await) {
            got.entry(k).or_default().extend(v);
        }
        assert!(Instant::now() < deadline, "{got:?}");
    }
    assert_eq!(got["path=/,user=u0"], vec![Push::Abandon]);
    assert!(matches!(got["path=/,user=u2"].as_slice(), [Push::Deny(1), Push::Bucket(..)]), "{got:?}");
    // A report of 10,000 buckets (over 100,000 bytes): the stream ends; the service lives on.
    let many: Vec<BucketId> = (0..10_000).map(|i| bucket(&[("user", &format!("flood{i}")), ("path", "/")])).collect();
    let usages: Vec<(&BucketId, u64, u64)> = many.iter().map(|b| (b, 1, 0)).collect();
    envoy.report(&usages).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match envoy.next(Duration::from_secs(5)).await {
            Some(Ok(_)) => assert!(Instant::now() < deadline, "the stream did not end"),
            Some(Err(e)) => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
                break;
            }
            None => panic!("the stream neither answered nor ended"),
        }
    }
    assert!(svc.log().contains("quota stream of domain 'edge' ended"), "{}", svc.log());
    assert!(svc.metric("ratelimit_service_quota_buckets") <= 2);
    let mut again = FakeEnvoy::connect(&svc, "edge").await;
    again.report(&[(&bucket(&[("vip", "x")]), 1, 0)]).await;
    assert_eq!(by_bucket(&again.actions().await)["vip=x"], vec![Push::Allow(60)]);
}

/// At SIGTERM the quota streams end (UNAVAILABLE: Envoy keeps its leases until their TTL and
/// reconnects elsewhere), so the graceful stop does not wait for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_end_at_shutdown() {
    let Setup { redis: _redis, con: _, _dir, mut svc, mut envoy } = setup(false, &[]).await;
    envoy.report(&[(&bucket(&[("api", "public")]), 1, 0)]).await;
    envoy.actions().await;
    svc.signal("-TERM");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match envoy.next(Duration::from_secs(5)).await {
            Some(Ok(_)) => assert!(Instant::now() < deadline),
            Some(Err(e)) => {
                assert_eq!(e.code(), tonic::Code::Unavailable, "{e}");
                break;
            }
            None => panic!("the stream did not end at SIGTERM"),
        }
    }
    assert!(svc.wait_exit(Duration::from_secs(5)).success());
}
