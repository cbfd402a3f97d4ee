//! Fidelity: the client crate's tokio driver against a real redis-server with the module (the
//! root harness), several instances (one `Limiter` each, its own connection) sharing one key at
//! about twice its limit. Asserts the invariants, never timings:
//!
//! * per instance, units served + returned + expired ≤ units claimed (the client's counters);
//! * the most units admitted against claimed units in any window of length W (W = the period
//!   and W = period ÷ 10) ≤ c + r·(W + L), the bound docs/local-reservations.md proves.
//!
//! Real time cannot be read at the instant the client decides, so each admission is known only
//! to lie between the instant before the call and the instant after it. The count checked is of
//! admissions that certainly fell inside the window (both instants inside): never more than the
//! true count, so a failure is a real violation whatever the scheduling delays, and no slack is
//! needed. (It assumes the server's clock runs at the speed of this machine's monotonic clock:
//! they are the same machine.)
//! Short by default (1.5 s of traffic); RL_LONG=1 runs 10 s.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis_ratelimit_client::{Limit, Limiter, LimiterConfig, Source};
use redis_ratelimit_core::spec::Spec;
use redis_ratelimit_core::{Nanos, Rate, NANOS_PER_SEC};
use redis_ratelimit_sim::metrics::{bound, Lag};

const INSTANCES: usize = 8;
const LIMIT: u64 = 2_000;
const BURST: u64 = 200;
const LEASE: Duration = Duration::from_millis(200);

async fn instance(
    url: String,
    key: &'static str,
    t0: Instant,
    run: Duration,
) -> (Vec<(u64, u64)>, redis_ratelimit_client::MetricsSnapshot) {
    let conn = ConnectionManager::new(redis::Client::open(url).unwrap()).await.unwrap();
    let limit = Limit::gcra(LIMIT, Duration::from_secs(1)).unwrap().with_burst(BURST).unwrap();
    let config = LimiterConfig::new(limit).lease(LEASE).instances(INSTANCES as u64).timeout(Duration::from_secs(2));
    let limiter = Limiter::new(conn, config).unwrap();
    // About twice the limit in total: one request every 2 ms per instance, catching up after
    // any stall so the demand stays.
    let per_tick = (2 * LIMIT as usize * 2 / 1000).div_ceil(INSTANCES).max(1);
    let mut every = tokio::time::interval(Duration::from_millis(2));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut spans = Vec::new();
    let ns = |t: Instant| t.duration_since(t0).as_nanos() as u64;
    while t0.elapsed() < run {
        every.tick().await;
        for _ in 0..per_tick {
            let before = Instant::now();
            let o = limiter.check(key, 1).await;
            let after = Instant::now();
            if o.allowed && matches!(o.source, Source::Local | Source::Redis) {
                spans.push((ns(before), ns(after)));
            }
        }
    }
    let m = limiter.shutdown().await;
    (spans, m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_sharing_a_key_stay_within_the_bound() {
    let run = if std::env::var_os("RL_LONG").is_some() { Duration::from_secs(10) } else { Duration::from_millis(1500) };
    let server = common::Server::start_with(common::Opts { debug_clock: false, ..Default::default() });
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..INSTANCES).map(|_| tokio::spawn(instance(server.url(), "shared", t0, run))).collect();
    let mut spans = Vec::new();
    let (mut claimed, mut served, mut returned, mut expired, mut calls) = (0, 0, 0, 0, 0);
    for t in tasks {
        let (s, m) = t.await.unwrap();
        assert!(m.units_served + m.units_returned + m.units_expired <= m.units_claimed, "{m:?}");
        assert_eq!(m.units_served, s.len() as u64, "every enforced admission is a served unit: {m:?}");
        spans.extend(s);
        claimed += m.units_claimed;
        served += m.units_served;
        returned += m.units_returned;
        expired += m.units_expired;
        calls += m.redis_calls;
    }
    spans.sort_unstable();
    let spec = Spec::Gcra(Rate::new(LIMIT, Nanos::from_secs(1), BURST).unwrap());
    let lease = LEASE.as_nanos() as i64;
    let mut report = Vec::new();
    for w in [NANOS_PER_SEC, NANOS_PER_SEC / 10] {
        let got = common::certain_max_in_window(&spans, w as u64);
        let b = bound(&spec, w, Lag::Lease(lease));
        report.push(format!("W = {} ms: {got} (bound {b})", w / 1_000_000));
        assert!(got <= b, "{} admitted in a window of {w} ns > bound {b}", got);
    }
    eprintln!(
        "real server, {INSTANCES} instances, GCRA {LIMIT}/s burst {BURST}, L = {} ms, {} s: served {served} \
         (claimed {claimed}, returned {returned}, expired {expired}), Redis calls {calls} ({:.3} per served unit); max in {}",
        LEASE.as_millis(),
        run.as_secs_f64(),
        calls as f64 / served.max(1) as f64,
        report.join(", ")
    );
}

#[test]
fn certain_window_counts_only_spans_inside() {
    let spans = [(0, 5), (3, 20), (10, 12), (11, 11)];
    assert_eq!(common::certain_max_in_window(&spans, 5), 2);
    assert_eq!(common::certain_max_in_window(&spans, 1), 1);
    assert_eq!(common::certain_max_in_window(&spans, 10), 2);
    assert_eq!(common::certain_max_in_window(&spans, 20), 4);
}
