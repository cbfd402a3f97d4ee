//! The client against real redis-servers with the module (the root harness, tests/common):
//! typed calls (RESP2 and RESP3), reservations end to end, returns, the over-limit cache
//! (Redis calls counted with INFO commandstats), the breaker and each failure policy with the
//! server killed or frozen and brought back, shadow mode, and Redis Cluster.
//!
//! No timing assertions: every wait is a deadline on a condition.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::future::Future;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Cluster, Server};
use redis::aio::ConnectionManager;
use redis_ratelimit_client::commands::{self, Options};
use redis_ratelimit_client::{FailurePolicy, Limit, Limiter, LimiterConfig, MetricsSnapshot, Source};

const HOUR: Duration = Duration::from_secs(3600);

async fn manager(s: &Server) -> ConnectionManager {
    let client = redis::Client::open(s.url()).unwrap();
    ConnectionManager::new(client).await.unwrap()
}

async fn resp3(s: &Server) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(format!("{}?protocol=resp3", s.url())).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// Calls of `cmd` (lower case, e.g. `rl.gcra`) so far, from INFO commandstats.
fn calls(s: &Server, cmd: &str) -> u64 {
    let info = s.info("commandstats");
    let prefix = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix).map(|r| r.split(',').next().unwrap().parse().unwrap()))
        .unwrap_or(0)
}

/// Whether the server has RL.RETURN (issue 11, server side).
async fn has_return(conn: &mut ConnectionManager) -> bool {
    let v: redis::Value = redis::cmd("COMMAND").arg("INFO").arg("rl.return").query_async(conn).await.unwrap();
    matches!(v, redis::Value::Array(ref a) if a.first().is_some_and(|x| *x != redis::Value::Nil))
}

/// `served + returned + expired ≤ claimed` from the counters (held units make up the rest).
fn accounting(m: &MetricsSnapshot) {
    assert!(m.units_served + m.units_returned + m.units_expired <= m.units_claimed, "{m:?}");
    assert_eq!(
        m.requests,
        m.local_admits
            + m.redis_admits
            + m.redis_denials
            + m.over_limit_cache_hits
            + m.never_denials
            + m.fallback_admits
            + m.fallback_denials
            + m.fail_open_admits
            + m.fail_closed_denials,
        "{m:?}"
    );
}

async fn until(what: &str, deadline: Duration, mut f: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !f().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn typed_calls<C: redis::aio::ConnectionLike>(conn: &mut C, i: usize) {
    let p = Duration::from_secs(1);
    let k = |n: &str| format!("{n}:{i}");
    let d = commands::gcra(conn, &k("g"), 10, p, Some(20), Options::default()).await.unwrap();
    assert_eq!((d.allowed, d.limit, d.remaining, d.retry_after), (1, 20, 19, None));
    let d = commands::token_bucket(conn, &k("t"), 10, p, None, Options::claim(15)).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (10, 0));
    let d = commands::token_bucket(conn, &k("t"), 10, p, None, Options::cost(1)).await.unwrap();
    assert!(!d.admitted() && d.retry_after.is_some());
    assert!(d.headers().contains_key("retry-after"));
    let d = commands::leaky(conn, &k("l"), 10, p, None, Options::default()).await.unwrap();
    assert_eq!(d.delay, Some(Duration::ZERO));
    // The second request leaves one interval (100 ms) after the first: its delay is that slot
    // less the real time that passed between the two calls.
    let d = commands::leaky(conn, &k("l"), 10, p, None, Options::default()).await.unwrap();
    let delay = d.delay.expect("RL.LEAKY replies a delay");
    assert!(delay <= Duration::from_millis(100) && delay > Duration::from_millis(50), "delay {delay:?}");
    let d = commands::sliding(conn, &k("s"), 5, HOUR, (), Options::cost(2).dry_run()).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (2, 3));
    let d = commands::fixed(conn, &k("f"), 5, HOUR, (), Options::cost(6)).await.unwrap();
    assert!(d.never());
    let d = commands::sliding_log(conn, &k("sl"), 5, HOUR, (), Options::default()).await.unwrap();
    assert_eq!(d.remaining, 4);
    let tag = format!("{{t{i}}}");
    let (a, b) = (format!("{tag}:a"), format!("{tag}:b"));
    let m = commands::multi(
        conn,
        &[(&a, Limit::gcra(2, p).unwrap()), (&b, Limit::sliding(3, HOUR).unwrap())],
        Options::default(),
    )
    .await
    .unwrap();
    assert!(m.admitted() && m.limits.len() == 2);
    assert_eq!(m.binding().unwrap().limit, 2);
    let info = commands::info(conn, &k("g")).await.unwrap().unwrap();
    assert!(info.iter().any(|(f, v)| f == "algorithm" && redis::from_redis_value_ref::<String>(v).unwrap() == "gcra"));
    assert!(commands::info(conn, "missing").await.unwrap().is_none());
    assert!(commands::reset(conn, &k("g")).await.unwrap());
    assert!(!commands::reset(conn, &k("g")).await.unwrap());
    let t = commands::throttle(conn, &k("cl"), 2, 1, 2, None).await.unwrap();
    assert!(!t.limited && t.limit == 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_calls_resp2_and_resp3() {
    let s = Server::start();
    let mut c2 = manager(&s).await;
    let mut c3 = resp3(&s).await;
    typed_calls(&mut c2, 0).await;
    typed_calls(&mut c3, 1).await;
    if has_return(&mut c2).await {
        let d = commands::gcra(&mut c2, "ret", 1, HOUR, Some(10), Options::claim(10)).await.unwrap();
        assert_eq!(d.allowed, 10);
        // 1 per hour: an age of 5 ms deducts a fraction of a unit.
        let credited = commands::give_back(&mut c2, "ret", 4, Some(Duration::from_millis(5))).await.unwrap();
        assert!((3..=4).contains(&credited), "{credited}");
        assert_eq!(commands::give_back(&mut c2, "nothing-here", 4, None).await.unwrap(), 0);
        assert!(commands::give_back(&mut c2, "{t0}:a", 0, None).await.is_err());
        assert!(commands::give_back(&mut c2, "sl:0", 1, None).await.is_err(), "the sliding log refuses");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_serve_locally_within_the_limit() {
    let s = Server::start();
    let conn = manager(&s).await;
    // 1000 per second, bucket of 1000: a hot loop of 3000 checks.
    let limit = Limit::token_bucket(1000, Duration::from_secs(1)).unwrap();
    let limiter = Limiter::new(conn, LimiterConfig::new(limit).timeout(Duration::from_secs(5))).unwrap();
    let t0 = Instant::now();
    let mut admitted = 0u64;
    for _ in 0..3000 {
        if limiter.check("hot", 1).await.allowed {
            admitted += 1;
        }
    }
    let elapsed = t0.elapsed();
    let m = limiter.shutdown().await;
    accounting(&m);
    // Never more than the bucket plus its refill over the run (one instance: all leases claimed).
    let bound = 1000 + (elapsed.as_secs_f64() * 1000.0).ceil() as u64;
    assert!(admitted <= bound, "{admitted} admitted > {bound}");
    assert!(admitted >= 1000, "{admitted}");
    let redis_calls = calls(&s, "rl.tokenbucket") + calls(&s, "rl.return");
    assert_eq!(redis_calls, m.redis_calls - m.returns + calls(&s, "rl.return"));
    assert!(redis_calls * 4 < 3000, "{redis_calls} Redis calls for 3000 checks: {m:?}");
    assert!(m.local_admits > m.redis_admits, "{m:?}");
}

/// A caller that goes away while its request's claim is out (a client disconnect, a handler's
/// own timeout) leaves nothing in flight, and the key's next request is decided normally (by
/// its units or its own claim). The rest of the request is a task of its own: its claim
/// finishes and its reply lands in the accounting, a one-off claim (a key not remembered) as a
/// remembered key's, and the request is counted as decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_gone_mid_claim_leaves_no_claim_in_flight() {
    let s = Server::start();
    for sightings in [65_536, 0] {
        let limit = Limit::token_bucket(1000, Duration::from_secs(1)).unwrap();
        // Redis frozen while the request is polled, so that its claim cannot be answered yet;
        // a first poll decided at once (an immediate connection error on a loaded machine)
        // tests nothing: a fresh limiter and key again, a few times.
        let mut found = None;
        for attempt in 0..5 {
            let limiter = Limiter::new(
                manager(&s).await,
                LimiterConfig::new(limit).sightings(sightings).timeout(Duration::from_secs(5)),
            )
            .unwrap();
            let key = format!("gone:{sightings}:{attempt}");
            freeze(&s, true);
            let pending = {
                let mut check = Box::pin(limiter.check(&key, 1));
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                // Polled once: its claim is out; then the caller drops it.
                check.as_mut().poll(&mut cx).is_pending()
            };
            freeze(&s, false);
            if pending {
                found = Some((limiter, key));
                break;
            }
        }
        let (limiter, key) = found.expect("a cold key's first poll waits for its claim");
        until("the dropped request's claim to finish", Duration::from_secs(5), async || {
            limiter.metrics().claims_in_flight == 0
        })
        .await;
        let m = limiter.metrics();
        let one_off = sightings > 0;
        assert_eq!((m.claims, m.one_off_claims), (1, one_off as u64), "{m:?}");
        assert_eq!((m.units_claimed, m.redis_admits, m.redis_errors), (1, 1, 0), "{m:?}");
        let o = limiter.check(&key, 1).await;
        assert!(o.allowed && o.source == Source::Redis, "{o:?}");
        let m = limiter.shutdown().await;
        accounting(&m);
    }
}

/// A half-open breaker's probe that is a one-off claim (a key not remembered), dropped by its
/// caller before the reply, is not lost: its claim finishes in its own task, and its reply,
/// Redis being back, closes the breaker (a lost probe would leave every later request on the
/// failure policy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_one_off_probe_does_not_keep_the_breaker_half_open() {
    let s = Server::start();
    let cfg = LimiterConfig::new(Limit::token_bucket(1000, Duration::from_secs(1)).unwrap())
        .timeout(Duration::from_millis(300))
        .breaker(1, Duration::from_millis(200));
    let limiter = Limiter::new(manager(&s).await, cfg).unwrap();
    assert_eq!(limiter.check("warm", 1).await.source, Source::Redis);
    freeze(&s, true);
    // A one-off claim times out: the breaker opens.
    let o = limiter.check("a", 1).await;
    assert_eq!((o.allowed, o.source), (false, Source::FailClosed), "{o:?}");
    assert_eq!(limiter.metrics().breaker_state, 1);
    tokio::time::sleep(Duration::from_millis(250)).await;
    // Past the cool-down a new key's one-off claim is the probe; its caller drops it unanswered.
    let probing = {
        let mut check = Box::pin(limiter.check("b", 1));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        check.as_mut().poll(&mut cx).is_pending()
    };
    assert!(probing, "the probe waits for frozen Redis");
    assert_eq!(limiter.metrics().claims_in_flight, 1);
    freeze(&s, false);
    until("the probe's reply", Duration::from_secs(5), async || limiter.metrics().claims_in_flight == 0).await;
    let o = limiter.check("c", 1).await;
    assert_eq!((o.allowed, o.source), (true, Source::Redis), "{o:?}");
    assert_eq!(limiter.metrics().breaker_state, 0);
    accounting(&limiter.shutdown().await);
}

/// Concurrent checks (and some peeks) of new and returning keys, a third of their callers
/// going away at a random moment (their own timeouts, as a gateway's): every claim finishes or
/// is given up (nothing left in flight) and every check is counted once, decided or abandoned
/// (a peek is not a request, dropped or not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_dropped_at_random_leave_nothing_in_flight_and_every_request_counted() {
    let s = Server::start();
    let cfg =
        LimiterConfig::new(Limit::token_bucket(1000, Duration::from_secs(1)).unwrap()).timeout(Duration::from_secs(2));
    let limiter = Limiter::new(manager(&s).await, cfg).unwrap();
    let mut rng = common::Rng::new(7);
    let (mut tasks, mut checks) = (Vec::new(), 0);
    for _ in 0..3000 {
        let l = limiter.clone();
        let key = format!("k{}", rng.below(400));
        let cut = rng.chance(33).then(|| Duration::from_micros(rng.below(3000)));
        let peek = rng.chance(10);
        checks += u64::from(!peek);
        tasks.push(tokio::spawn(async move {
            let call = async {
                match peek {
                    true => l.peek(&key, 1).await,
                    false => l.check(&key, 1).await,
                }
            };
            match cut {
                Some(d) => drop(tokio::time::timeout(d, call).await),
                None => drop(call.await),
            }
        }));
        if rng.chance(5) {
            tokio::task::yield_now().await;
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    until("the claims in flight", Duration::from_secs(10), async || limiter.metrics().claims_in_flight == 0).await;
    let m = limiter.shutdown().await;
    eprintln!("{m:?}");
    assert_eq!(m.requests, checks, "{m:?}");
    accounting(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_units_go_back_on_shutdown_and_when_idle() {
    let s = Server::start();
    let mut conn = manager(&s).await;
    if !has_return(&mut conn).await {
        eprintln!("RL.RETURN not in this module build: skipped");
        return;
    }
    // Refill negligible (10 per hour), burst 1000: what the server holds is exact.
    let limit = Limit::gcra(10, HOUR).unwrap().with_burst(1000).unwrap();
    let available = async |conn: &mut ConnectionManager, key: &str| -> i64 {
        let info = commands::info(conn, key).await.unwrap().unwrap();
        redis::from_redis_value_ref(&info.iter().find(|(f, _)| f == "available").unwrap().1).unwrap()
    };
    let limiter = Limiter::new(
        conn.clone(),
        LimiterConfig::new(limit).lease(Duration::from_secs(30)).timeout(Duration::from_secs(5)),
    )
    .unwrap();
    for _ in 0..200 {
        assert!(limiter.check("k", 1).await.allowed);
    }
    let m = limiter.shutdown().await;
    assert!(m.units_claimed > 200, "the hot loop batched: {m:?}");
    // Everything unused goes back; the server deducts the refill of the units' age (AGE includes
    // the 5 s timeout: a unit or so per lease at 10 per hour).
    assert_eq!(m.units_returned + m.units_expired, m.units_claimed - 200, "{m:?}");
    assert!(m.units_credited > 0 && m.units_credited <= m.units_returned, "{m:?}");
    let expected = 1000 - m.units_claimed as i64 + m.units_credited as i64;
    assert!((available(&mut conn, "k").await - expected).abs() <= 1, "{m:?}");

    // Idle: the housekeeping gives the units back by itself.
    let cfg = LimiterConfig::new(limit)
        .lease(Duration::from_secs(30))
        .timeout(Duration::from_secs(5))
        .idle_return(Duration::from_millis(200));
    let limiter = Limiter::new(conn.clone(), cfg).unwrap();
    for _ in 0..200 {
        assert!(limiter.check("idle", 1).await.allowed);
    }
    until("idle units returned", Duration::from_secs(10), async || limiter.metrics().units_credited > 0).await;
    let m = limiter.metrics();
    let expected = 1000 - m.units_claimed as i64 + m.units_credited as i64;
    assert!((available(&mut conn, "idle").await - expected).abs() <= 1, "{m:?}");
    drop(limiter);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_limit_cache_answers_without_redis() {
    let s = Server::start();
    let conn = manager(&s).await;
    let limiter =
        Limiter::new(conn, LimiterConfig::new(Limit::gcra(5, HOUR).unwrap()).timeout(Duration::from_secs(5))).unwrap();
    let mut outcomes = Vec::new();
    for _ in 0..105 {
        outcomes.push(limiter.check("abuser", 1).await);
    }
    assert_eq!(outcomes.iter().filter(|o| o.allowed).count(), 5);
    let cached = outcomes.iter().filter(|o| o.source == Source::Cache).count();
    assert_eq!(cached, 99, "one denial from Redis, then the cache");
    let last = outcomes.last().unwrap();
    let retry = last.retry_after().unwrap();
    assert!(retry > Duration::ZERO && retry <= Duration::from_secs(720), "{retry:?}");
    assert!(last.headers().contains_key("retry-after"));
    assert_eq!(calls(&s, "rl.gcra"), 6, "5 admitted + 1 denied, then no call");
    // Cost above the capacity: refused locally, for good.
    let never = limiter.check("abuser", 6).await;
    assert!(!never.allowed && never.retry_after().is_none());
    assert_eq!(calls(&s, "rl.gcra"), 6);
    accounting(&limiter.metrics());
}

/// Stops `s` answering (SIGSTOP) or resumes it (SIGCONT).
fn freeze(s: &Server, on: bool) {
    let sig = if on { "-STOP" } else { "-CONT" };
    Command::new("kill").arg(sig).arg(s.pid().unwrap().to_string()).status().unwrap();
}

async fn outage_then_recovery(policy: FailurePolicy, frozen: bool) -> (Vec<Source>, Vec<bool>, MetricsSnapshot) {
    let mut s = Server::start();
    let conn = manager(&s).await;
    let cfg = LimiterConfig::new(Limit::gcra(1000, Duration::from_secs(1)).unwrap())
        .timeout(Duration::from_millis(300))
        .breaker(3, Duration::from_millis(300))
        .policy(policy)
        .batching(false);
    let limiter = Limiter::new(conn, cfg).unwrap();
    assert_eq!(limiter.check("k", 1).await.source, Source::Redis);
    if frozen {
        freeze(&s, true);
    } else {
        s.kill9();
    }
    let mut sources = Vec::new();
    let mut allowed = Vec::new();
    for _ in 0..20 {
        let o = limiter.check("k", 1).await;
        sources.push(o.source);
        allowed.push(o.allowed);
    }
    // The counters of the outage alone.
    let during = limiter.metrics();
    assert!(during.breaker_opens >= 1, "{during:?}");
    // 3 failures open it; further errors only from half-open probes.
    assert!(during.redis_errors <= 3 + 20, "{during:?}");
    if frozen {
        freeze(&s, false);
    } else {
        s.start_again();
    }
    until("recovery", Duration::from_secs(60), async || {
        matches!(limiter.check("k", 1).await.source, Source::Redis | Source::Local)
    })
    .await;
    accounting(&limiter.metrics());
    (sources, allowed, during)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_refuses_while_redis_is_down_and_recovers() {
    let (sources, allowed, m) = outage_then_recovery(FailurePolicy::FailClosed, false).await;
    assert!(sources.iter().all(|s| *s == Source::FailClosed), "{sources:?}");
    assert!(allowed.iter().all(|a| !a));
    assert_eq!(m.fail_closed_denials, 20);
    assert_eq!(m.fail_open_admits + m.fallback_admits, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_when_redis_stops_answering() {
    let (sources, allowed, m) = outage_then_recovery(FailurePolicy::FailClosed, true).await;
    assert!(sources.iter().all(|s| *s == Source::FailClosed), "{sources:?}");
    assert!(allowed.iter().all(|a| !a));
    // Timeouts open the breaker: most requests never waited for one.
    assert!(m.redis_errors < 20, "{m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_admits_while_redis_is_down() {
    let (sources, allowed, m) = outage_then_recovery(FailurePolicy::FailOpen, false).await;
    assert!(sources.iter().all(|s| *s == Source::FailOpen), "{sources:?}");
    assert!(allowed.iter().all(|a| *a));
    assert_eq!(m.fail_open_admits, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_fallback_enforces_its_own_limit() {
    let (sources, allowed, m) = outage_then_recovery(FailurePolicy::local(5, HOUR, 5), false).await;
    assert!(sources.iter().all(|s| *s == Source::Fallback), "{sources:?}");
    assert_eq!(allowed.iter().filter(|a| **a).count(), 5, "{allowed:?}");
    assert_eq!((m.fallback_admits, m.fallback_denials), (5, 15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_lets_everything_through_and_counts() {
    let s = Server::start();
    let conn = manager(&s).await;
    let limiter = Limiter::new(
        conn,
        LimiterConfig::new(Limit::gcra(3, HOUR).unwrap()).shadow(true).timeout(Duration::from_secs(5)),
    )
    .unwrap();
    let mut would_block = 0;
    for _ in 0..10 {
        let o = limiter.check("shadow", 1).await;
        assert!(o.allowed);
        if !o.enforced {
            would_block += 1;
        }
    }
    assert_eq!(would_block, 7);
    assert_eq!(limiter.metrics().shadow_would_blocks, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_over_resp3() {
    let s = Server::start();
    let limiter = Limiter::new(
        resp3(&s).await,
        LimiterConfig::new(Limit::sliding(50, HOUR).unwrap()).timeout(Duration::from_secs(5)),
    )
    .unwrap();
    let mut admitted = 0;
    for _ in 0..80 {
        admitted += limiter.check("r3", 1).await.allowed as u64;
    }
    assert_eq!(admitted, 50);
    accounting(&limiter.shutdown().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_share_one_claim_per_key() {
    let s = Server::start();
    let conn = manager(&s).await;
    let limiter =
        Limiter::new(conn, LimiterConfig::new(Limit::token_bucket(100, HOUR).unwrap()).timeout(Duration::from_secs(5)))
            .unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let l = limiter.clone();
            tokio::spawn(async move {
                let mut n = 0;
                for _ in 0..50 {
                    n += l.check("shared", 1).await.allowed as u64;
                }
                n
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    let m = limiter.shutdown().await;
    assert_eq!(admitted, 100, "{m:?}");
    accounting(&m);
    assert!(m.claims <= m.requests, "{m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_typed_calls_and_limiter() {
    let cluster = Cluster::start(3, 0);
    let urls: Vec<String> = cluster.nodes.iter().map(|n| n.url()).collect();
    let client = redis::cluster::ClusterClient::new(urls).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let m = commands::multi(
        &mut conn,
        &[("{u1}:ip", Limit::gcra(2, HOUR).unwrap()), ("{u1}:user", Limit::fixed(3, HOUR).unwrap())],
        Options::default(),
    )
    .await
    .unwrap();
    assert!(m.admitted());
    let limiter =
        Limiter::new(conn, LimiterConfig::new(Limit::token_bucket(10, HOUR).unwrap()).timeout(Duration::from_secs(5)))
            .unwrap();
    for key in ["a", "b", "c", "d", "e", "f"] {
        let mut admitted = 0;
        for _ in 0..15 {
            admitted += limiter.check(key, 1).await.allowed as u64;
        }
        assert_eq!(admitted, 10, "key {key}");
    }
    accounting(&limiter.shutdown().await);
}
