//! Properties of the multi-limit check (`check_all`) against a real redis-server with the
//! module: random sequences of requests, each checked against a per-IP and a per-user limit
//! (the user limit tighter, so both refuse at times), with random costs.
//!
//! * a refused request takes nothing from any limit: units served minus units refunded is
//!   unchanged on every limiter;
//! * a refused request's local units serve the next request: every limit that admitted it
//!   before another refused answers a peek for the same cost from local units;
//! * the request is admitted exactly when every limit admitted, and `refused_by` names a limit
//!   that refused;
//! * each limit's bound: per key, the units admitted never exceed the capacity plus the refill
//!   over the run plus one lease (`c + r·(W + L)`, W the run's length).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use redis_ratelimit_client::{check_all, Connection, ConnectionConfig, Limit, Limiter, LimiterConfig, Source};

/// One per test, stopped with it (never in a `static`: its `Drop` would never run, and the
/// server outlived the test process).
fn server() -> common::Server {
    common::Server::start_with(common::Opts { debug_clock: false, ..Default::default() })
}

const HOUR: Duration = Duration::from_secs(3600);

#[derive(Clone, Debug)]
struct Req {
    ip: u8,
    user: u8,
    cost: u64,
}

fn req() -> impl Strategy<Value = Req> {
    (0u8..3, 0u8..3, 1u64..4).prop_map(|(ip, user, cost)| Req { ip, user, cost })
}

/// Refunds checked (a limit admitted, another refused): the fixed case asserts some happened.
static REFUNDS_SEEN: AtomicU64 = AtomicU64::new(0);

fn run(server: &common::Server, reqs: Vec<Req>, instances: u64) {
    static CASE: AtomicU64 = AtomicU64::new(0);
    let case = CASE.fetch_add(1, Ordering::Relaxed);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let conn = ConnectionConfig::single(&server.url()).connect().unwrap();
        conn.ready(tokio::time::Instant::now() + Duration::from_secs(5)).await.unwrap();
        let ip_limit = Limit::token_bucket(30, HOUR).unwrap().with_burst(12).unwrap();
        let user_limit = Limit::gcra(6, HOUR).unwrap().with_burst(6).unwrap();
        let cfg = |l| LimiterConfig::new(l).instances(instances).timeout(Duration::from_secs(2));
        let ip = Limiter::new(conn.clone(), cfg(ip_limit)).unwrap();
        let user = Limiter::new(conn, cfg(user_limit)).unwrap();
        let t0 = Instant::now();
        let mut admitted = std::collections::HashMap::<String, u64>::new();
        for r in &reqs {
            let (ip_key, user_key) = (format!("c{case}:ip{}", r.ip), format!("c{case}:user{}", r.user));
            let taken = |l: &Limiter<Connection>| {
                let m = l.metrics();
                m.units_served - m.units_refunded
            };
            let before = [taken(&ip), taken(&user)];
            let all = check_all(&[(&ip, &ip_key), (&user, &user_key)], r.cost).await;
            let each: Vec<bool> = all.outcomes.iter().map(|o| o.is_some_and(|o| o.allowed)).collect();
            assert_eq!(all.allowed, each.iter().all(|a| *a), "{all:?}");
            if all.allowed {
                for k in [&ip_key, &user_key] {
                    *admitted.entry(k.clone()).or_default() += r.cost;
                }
                continue;
            }
            let by = all.refused_by.expect("a refusal names its limit");
            assert!(all.outcomes[by].is_some_and(|o| !o.allowed), "{all:?}");
            // Nothing taken from any limit.
            assert_eq!([taken(&ip), taken(&user)], before, "{all:?}");
            // What a limit admitted before another refused serves the next request locally.
            for (i, (l, k)) in [(&ip, &ip_key), (&user, &user_key)].into_iter().enumerate() {
                if let Some(o) = all.outcomes[i].filter(|o| o.allowed && o.enforced) {
                    let p = l.peek(k, r.cost).await;
                    assert!(p.allowed && p.source == Source::Local, "{o:?} then {p:?}");
                    REFUNDS_SEEN.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let elapsed = t0.elapsed();
        ip.shutdown().await;
        user.shutdown().await;
        // Each limit's bound, per key: c + r·(W + L) (L = 1 s, the default).
        for (k, n) in &admitted {
            let l = if k.contains(":ip") { ip_limit } else { user_limit };
            let w = elapsed + Duration::from_secs(1);
            let bound = l.capacity() + (w.as_secs_f64() * l.limit() as f64 / l.period().as_secs_f64()).ceil() as u64;
            assert!(*n <= bound, "{k}: {n} admitted > {bound}");
        }
    });
}

/// A `proptest!` written out, so that one server serves every case.
#[test]
fn a_refused_request_takes_nothing_and_each_bound_holds() {
    let server = server();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: std::env::var("RL_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).map_or(24, |n: u32| n / 16),
        source_file: Some(file!()),
        ..ProptestConfig::default()
    });
    let cases = (prop::collection::vec(req(), 1..60), 1u64..3);
    if let Err(e) = runner.run(&cases, |(reqs, instances)| {
        run(&server, reqs, instances);
        Ok(())
    }) {
        panic!("{e}");
    }
}

/// One user from many IPs: the user limit refuses after its burst while the IP limits admit,
/// and what they admitted goes back.
#[test]
fn the_second_limit_refusing_gives_the_first_its_units_back() {
    let reqs: Vec<Req> = (0..20).map(|i| Req { ip: (i % 3) as u8, user: 0, cost: 1 }).collect();
    let before = REFUNDS_SEEN.load(Ordering::Relaxed);
    run(&server(), reqs, 1);
    assert!(REFUNDS_SEEN.load(Ordering::Relaxed) > before, "no request was refused by the user limit alone");
}
