//! The connection layer (`ConnectionConfig` / `Connection`) against real redis-server
//! processes, one server (issue 31.4–6, 35.6):
//!
//! * every call ends by its deadline, connecting included: 100 concurrent calls to a stalled
//!   Redis (SIGSTOP), on live connections and on a connection still being made, each end
//!   within the deadline plus 50 ms;
//! * a refused connection is known at once: calls fail fast instead of waiting for their
//!   deadline;
//! * connections are remade in the background: after a restart Redis answers within 0.5 s,
//!   also when no call came during the outage and after it (the first call after an idle
//!   restart is answered by Redis);
//! * `connect()` never waits for Redis: started while Redis is away, it answers once Redis is
//!   up, without a call having to fail first.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::Server;
use redis_ratelimit_client::connection::ErrorKind;
use redis_ratelimit_client::{Connection, ConnectionConfig};
use tokio::time::Instant;

const SLACK: Duration = Duration::from_millis(50);

fn signal(s: &Server, sig: &str) {
    assert!(std::process::Command::new("kill").arg(sig).arg(s.pid().unwrap().to_string()).status().unwrap().success());
}

fn ping() -> redis::Cmd {
    redis::cmd("PING")
}

/// `n` concurrent PINGs, each with `budget` to answer: how long each took, and its result.
async fn concurrent(conn: &Connection, n: usize, budget: Duration) -> Vec<(Duration, Result<redis::Value, ErrorKind>)> {
    let calls = (0..n).map(|_| {
        let conn = conn.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let r = conn.call(&ping(), t + budget).await.map_err(|e| e.kind());
            (t.elapsed(), r)
        })
    });
    let mut out = Vec::new();
    for c in calls {
        out.push(c.await.unwrap());
    }
    out
}

/// Calls PING every 5 ms until Redis answers; the time it took.
async fn until_answered(conn: &Connection, limit: Duration) -> Duration {
    let t = Instant::now();
    loop {
        if conn.call(&ping(), Instant::now() + Duration::from_millis(100)).await.is_ok() {
            return t.elapsed();
        }
        assert!(t.elapsed() < limit, "no answer from Redis within {limit:?}: {}", conn.status());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_ends_by_its_deadline_while_redis_is_stalled() {
    let server = Server::start();
    let budget = Duration::from_millis(100);
    let live = ConnectionConfig::single(&server.url()).pool_size(4).connect().unwrap();
    live.ready(Instant::now() + Duration::from_secs(5)).await.unwrap();
    signal(&server, "-STOP");
    // Connections already live: the calls are sent and never answered.
    let on_live = concurrent(&live, 100, budget).await;
    // A connection made while Redis is stalled: the kernel accepts, the handshake is never
    // answered, so the calls wait for a connection until their deadline.
    let fresh =
        ConnectionConfig::single(&server.url()).pool_size(4).connect_timeout(Duration::from_secs(2)).connect().unwrap();
    let on_fresh = concurrent(&fresh, 100, budget).await;
    signal(&server, "-CONT");
    for (what, results) in [("live", &on_live), ("connecting", &on_fresh)] {
        let worst = results.iter().map(|r| r.0).max().unwrap();
        assert!(worst <= budget + SLACK, "{what}: a call took {worst:?} (deadline {budget:?})");
        for (_, r) in results.iter() {
            assert_eq!(r, &Err(ErrorKind::Timeout), "{what}");
        }
    }
    // Resumed: both answer (the live connections were never dropped; the fresh one completes
    // its handshake).
    until_answered(&live, Duration::from_secs(2)).await;
    until_answered(&fresh, Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_fail_fast() {
    let mut server = Server::start();
    server.kill9();
    let conn = ConnectionConfig::single(&server.url()).pool_size(4).connect().unwrap();
    // Not one call waits for its deadline (1 s): a refused connection is known at once.
    let results = concurrent(&conn, 100, Duration::from_secs(1)).await;
    let worst = results.iter().map(|r| r.0).max().unwrap();
    assert!(worst <= SLACK, "a call took {worst:?} against a refused port");
    for (_, r) in &results {
        assert_eq!(r, &Err(ErrorKind::Unavailable));
    }
    let status = conn.status().to_string();
    assert!(status.starts_with("unavailable:") && status.contains("refused"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_answers_within_half_a_second_of_a_restart() {
    let mut server = Server::start();
    let conn = ConnectionConfig::single(&server.url()).pool_size(4).connect().unwrap();
    conn.ready(Instant::now() + Duration::from_secs(5)).await.unwrap();
    for outage in [Duration::from_millis(300), Duration::from_secs(3)] {
        server.kill9();
        // Calls during the outage fail (fast) and change nothing.
        let t = Instant::now();
        while t.elapsed() < outage {
            assert!(conn.call(&ping(), Instant::now() + Duration::from_millis(100)).await.is_err());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // start_again returns once the server answers PING: it was accepting before that.
        server.start_again();
        let took = until_answered(&conn, Duration::from_secs(2)).await;
        assert!(
            took <= Duration::from_millis(500),
            "after a {outage:?} outage Redis answered the layer after {took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_answers_from_redis_after_a_restart() {
    let mut server = Server::start();
    let conn = ConnectionConfig::single(&server.url()).pool_size(4).connect().unwrap();
    conn.ready(Instant::now() + Duration::from_secs(5)).await.unwrap();
    for (outage, how) in [(Duration::from_secs(3), "SIGKILL"), (Duration::from_millis(200), "SIGTERM")] {
        // No call at all from here on until the one asserted.
        if how == "SIGKILL" {
            server.kill9();
            tokio::time::sleep(outage).await;
            server.start_again();
        } else {
            server.restart();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t = Instant::now();
        let r = conn.call(&ping(), t + Duration::from_millis(100)).await;
        assert!(r.is_ok(), "restart by {how}: the first call after it, 0.5 s later: {r:?} ({})", conn.status());
        // Every slot of the pool is back, not just one.
        for _ in 0..8 {
            conn.call(&ping(), Instant::now() + Duration::from_millis(100)).await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_never_waits_for_redis_and_answers_once_it_is_up() {
    let mut server = Server::start();
    server.kill9();
    let t = std::time::Instant::now();
    let conn = ConnectionConfig::single(&server.url()).pool_size(2).connect().unwrap();
    assert!(t.elapsed() < Duration::from_millis(20), "connect() waited {:?}", t.elapsed());
    // Away: calls fail at once, with the reason.
    let e = conn.call(&ping(), Instant::now() + Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(conn.ready(Instant::now() + Duration::from_millis(100)).await.is_err());
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.start_again();
    let took = until_answered(&conn, Duration::from_secs(2)).await;
    assert!(took <= Duration::from_millis(500), "Redis answered the layer {took:?} after it was up");
    assert!(conn.status().to_string().starts_with("connected to 127.0.0.1:"), "{}", conn.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_and_outages_are_told_apart_by_kind() {
    let server = Server::start();
    let conn = ConnectionConfig::single(&server.url()).connect().unwrap();
    let deadline = || Instant::now() + Duration::from_secs(2);
    let e = conn.call(&redis::cmd("NOSUCHCOMMAND"), deadline()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Reply, "{e}");
    assert!(!e.is_unavailable());
    let mut pipe = redis::pipe();
    pipe.cmd("SET").arg("k").arg("1").cmd("INCRBY").arg("k").arg(2);
    let v = conn.pipeline(&pipe, deadline()).await.unwrap();
    assert_eq!(v, vec![redis::Value::Okay, redis::Value::Int(3)]);
    // Configuration errors at connect(), naming the URL.
    let e = ConnectionConfig::single("redis://127.0.0.1:notaport").connect().err().unwrap();
    assert!(e.to_string().contains("127.0.0.1:notaport"), "{e}");
}
