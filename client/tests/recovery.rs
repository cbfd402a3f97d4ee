//! Recovery after Redis goes away and comes back (issue 19.1), with the README's setup: a
//! `Limiter` over the connection layer (`Connection`), traffic running throughout. Redis is
//! killed (SIGKILL) and restarted on the same port, or frozen (SIGSTOP) and resumed (SIGCONT),
//! for longer than the breaker's cool-down, under each failure policy. Asserted:
//!
//! * normal decisions (from units claimed: `Source::Redis` or `Source::Local`) resume within
//!   the breaker's cool-down plus 2 s of Redis answering again;
//! * during the outage the failure policy decides (never an enforced admission without units);
//! * the bound holds for enforced admissions over the whole run: the most admissions certainly
//!   inside any window of length W is at most c + r·(W + L) with the server's state kept (AOF,
//!   `appendfsync always`), and at most 2c + r·(W + L) across a restart that lost it (an empty
//!   dataset hands out a fresh bucket: docs/local-reservations.md).
//!
//! Timings are asserted only as upper bounds of seconds (the cool-down plus 2 s), never as
//! speeds.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "support/traffic.rs"]
mod traffic;

use std::time::{Duration, Instant};

use common::{Opts, Server};
use redis_ratelimit_client::{ConnectionConfig, FailurePolicy, Limit, Limiter, LimiterConfig, Source};
use traffic::{enforced, Traffic};

const COOL_DOWN: Duration = Duration::from_millis(500);
const OUTAGE: Duration = Duration::from_millis(1500);
const LEASE: Duration = Duration::from_millis(200);
const RATE: u64 = 200;
const BURST: u64 = 40;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    /// SIGKILL, restart on the same port; `keep_state`: AOF with `appendfsync always`.
    Kill { keep_state: bool },
    /// SIGSTOP, then SIGCONT.
    Freeze,
}

fn signal(s: &Server, sig: &str) {
    std::process::Command::new("kill").arg(sig).arg(s.pid().unwrap().to_string()).status().unwrap();
}

async fn outage(policy: FailurePolicy, fault: Fault) {
    let keep_state = fault != Fault::Kill { keep_state: false };
    let mut opts = Opts { debug_clock: false, ..Default::default() };
    if keep_state {
        opts.appendonly = true;
        opts.extra.push(("appendfsync".into(), "always".into()));
    }
    let mut server = Server::start_with(opts);
    let conn = ConnectionConfig::single(&server.url()).connect_timeout(Duration::from_millis(200)).connect().unwrap();
    conn.ready(tokio::time::Instant::now() + Duration::from_secs(5)).await.unwrap();
    let limit = Limit::gcra(RATE, Duration::from_secs(1)).unwrap().with_burst(BURST).unwrap();
    let config = LimiterConfig::new(limit)
        .lease(LEASE)
        .instances(2)
        .timeout(Duration::from_millis(200))
        .breaker(3, COOL_DOWN)
        .policy(policy);
    let limiter = Limiter::new(conn, config).unwrap();

    // Traffic at about twice the rate, from one task, until told to stop.
    let t0 = Instant::now();
    let traffic = Traffic::start(&limiter, "tenant", 2 * RATE, t0);
    let wait_normal = async |since: Instant, what: &str| {
        let limit = COOL_DOWN + Duration::from_secs(2);
        loop {
            if let Some(t) = traffic.enforced_after(since) {
                return t;
            }
            assert!(since.elapsed() < limit + Duration::from_secs(3), "{what}: no normal decision after {limit:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    wait_normal(t0, "start").await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The outage.
    let down = Instant::now();
    match fault {
        Fault::Kill { .. } => server.kill9(),
        Fault::Freeze => signal(&server, "-STOP"),
    }
    tokio::time::sleep(OUTAGE).await;
    // The server answers again from some instant between `back` and `up` (start_again returns
    // once it answers PING).
    let back = Instant::now();
    match fault {
        Fault::Kill { .. } => tokio::task::block_in_place(|| server.start_again()),
        Fault::Freeze => signal(&server, "-CONT"),
    }
    let up = Instant::now();
    let took = wait_normal(up, "recovery").await.duration_since(up);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = traffic.stop().await;
    let m = limiter.shutdown().await;

    eprintln!(
        "{policy:?} {fault:?}: normal decisions {took:?} after Redis answered again (cool-down {COOL_DOWN:?}); {m:?}"
    );
    assert!(took <= COOL_DOWN + Duration::from_secs(2), "{policy:?} {fault:?}: recovery took {took:?}");
    // The outage was decided by the policy (once the lease of what was held ran out), but for
    // refusals from the over-limit cache.
    let during: Vec<_> = seen
        .answers
        .iter()
        .filter(|(t, _, _)| *t > down + LEASE + Duration::from_millis(250) && *t < back)
        .map(|&(_, s, a)| (s, a))
        .collect();
    assert!(!during.is_empty());
    for (s, allowed) in &during {
        if *s == Source::Cache && !allowed {
            continue; // a pacing hold from before the outage: local knowledge, still true
        }
        match policy {
            FailurePolicy::FailClosed => assert!(!allowed && !enforced(*s), "{s:?} {allowed}"),
            FailurePolicy::FailOpen => assert!(*allowed && *s == Source::FailOpen, "{s:?} {allowed}"),
            _ => assert!(*s == Source::Fallback, "{s:?} {allowed}"),
        }
    }
    assert!(m.units_served + m.units_returned + m.units_expired <= m.units_claimed + m.units_refunded, "{m:?}");
    // The bound, for enforced admissions over the whole run.
    let extra = if keep_state { 0 } else { BURST };
    for w in [Duration::from_secs(1), Duration::from_millis(100)] {
        let (w_ns, l_ns) = (w.as_nanos() as u64, LEASE.as_nanos() as u64);
        let bound = BURST + extra + RATE * (w_ns + l_ns) / 1_000_000_000;
        let max = common::certain_max_in_window(&seen.spans, w_ns);
        assert!(max <= bound, "{policy:?} {fault:?}: {max} enforced admissions in {w:?} > {bound}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_recovers_after_a_restart() {
    outage(FailurePolicy::FailClosed, Fault::Kill { keep_state: true }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_recovers_after_a_restart() {
    outage(FailurePolicy::FailOpen, Fault::Kill { keep_state: true }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_share_recovers_after_a_restart() {
    outage(FailurePolicy::LocalShare, Fault::Kill { keep_state: true }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_recovers_after_a_freeze() {
    outage(FailurePolicy::FailClosed, Fault::Freeze).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_recovers_after_a_freeze() {
    outage(FailurePolicy::FailOpen, Fault::Freeze).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_share_recovers_after_a_freeze() {
    outage(FailurePolicy::LocalShare, Fault::Freeze).await;
}

/// A restart that loses the dataset hands out a fresh bucket: at most one capacity more in any
/// window than the bound (docs/local-reservations.md, "a server that loses its state").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_state_costs_at_most_one_capacity() {
    outage(FailurePolicy::FailClosed, Fault::Kill { keep_state: false }).await;
}
