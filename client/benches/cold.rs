//! The cold path end to end (issue 33): a key never seen, checked through `Limiter::check` (a
//! one-off claim: one round trip) against the same command sent directly with
//! `commands::check` under `tokio::time::timeout` (the limiter's 100 ms), as a service makes it,
//! against a real redis-server with the module. Both at one fixed request rate (`COLD_RATE`
//! per second, default 4,000), each request a task of its own on a one-worker runtime, keys
//! all new. Per request: the process's CPU time (every thread: the runtime's and the
//! connection's; not the server's) and the p99 latency.
//!
//! Rounds alternate the order of the two (`COLD_ROUNDS`, default 9, `COLD_N` requests each,
//! default 2,000); the figures are medians of the rounds' paired ratios (this VM's speed jumps
//! ~1.66× every few seconds: a ratio within one round cancels them). Prints a table and writes
//! it to `target/bench-cold.md`.
//!
//! `cargo bench -p redis-ratelimit-client --bench cold` (needs the module: `make build`).

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::future::Future;
use std::hint::black_box;
use std::time::{Duration, Instant};

use redis_ratelimit_client::commands::{self, Options};
use redis_ratelimit_client::{ConnectionConfig, Limit, Limiter, LimiterConfig};
use support::{cpu_now, env, median};

/// One side of a round.
#[derive(Clone, Copy, Debug)]
struct Run {
    /// CPU ns per request.
    cpu: f64,
    p50: Duration,
    p99: Duration,
}

/// `n` requests `f(i)`, one every `1/rate` s on average (tokio's 1 ms timer: a few per tick),
/// each a task of its own; CPU per request and the latency quantiles.
async fn paced<F, Fut>(n: usize, rate: u64, f: F) -> Run
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = bool> + Send + 'static,
{
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let cpu = cpu_now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        tick.tick().await;
        let call = f(i);
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            assert!(black_box(call.await), "a cold check must be admitted");
            t.elapsed()
        }));
    }
    let mut lat = Vec::with_capacity(n);
    for t in tasks {
        lat.push(t.await.unwrap());
    }
    let cpu = (cpu_now() - cpu).as_nanos() as f64 / n as f64;
    lat.sort();
    Run { cpu, p50: lat[n / 2], p99: lat[n * 99 / 100] }
}

fn main() {
    let rate = env("COLD_RATE", 4000).max(1);
    let n = env("COLD_N", 2000).max(100) as usize;
    let rounds = env("COLD_ROUNDS", 9).max(1) as usize;
    let server = common::Server::start_with(common::Opts { debug_clock: false, ..Default::default() });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let limit = Limit::token_bucket(1000, Duration::from_secs(60)).unwrap();
    let rows = rt.block_on(async {
        let conn = ConnectionConfig::single(&server.url()).connect().unwrap();
        conn.ready(tokio::time::Instant::now() + Duration::from_secs(5)).await.unwrap();
        let limiter = Limiter::new(conn.clone(), LimiterConfig::new(limit)).unwrap();
        let via_limiter = |round: usize| {
            let limiter = limiter.clone();
            move |i: usize| {
                let limiter = limiter.clone();
                async move { limiter.check(&format!("cold:l:{round}:{i}"), 1).await.allowed }
            }
        };
        let direct = |round: usize| {
            let conn = conn.clone();
            move |i: usize| {
                let mut conn = conn.clone();
                async move {
                    let key = format!("cold:d:{round}:{i}");
                    let call = commands::check(&mut conn, &key, &limit, Options::cost(1));
                    tokio::time::timeout(Duration::from_millis(100), call)
                        .await
                        .is_ok_and(|d| d.is_ok_and(|d| d.allowed > 0))
                }
            }
        };
        // Warm-up: connections, allocator, the limiter's shards.
        paced(n / 4, rate, via_limiter(usize::MAX)).await;
        paced(n / 4, rate, direct(usize::MAX)).await;
        let mut rows = Vec::new();
        for r in 0..rounds {
            let (l, d) = if r % 2 == 0 {
                let l = paced(n, rate, via_limiter(r)).await;
                (l, paced(n, rate, direct(r)).await)
            } else {
                let d = paced(n, rate, direct(r)).await;
                (paced(n, rate, via_limiter(r)).await, d)
            };
            rows.push((l, d));
        }
        let m = limiter.metrics();
        assert_eq!(m.redis_errors, 0, "{m:?}");
        rows
    });
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The stamp every report of docs/PERFORMANCE.md carries (scripts/perf-doc.sh).
    let stamp = std::process::Command::new("bash")
        .arg(root.join("scripts/perf-doc.sh"))
        .arg("stamp")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_default();
    let mut out = String::new();
    out += "# The cold path\n\n";
    out += stamp.trim_end();
    out += &format!(
        "\n- Command: `cargo bench -p redis-ratelimit-client --bench cold` (COLD_RATE={rate}, \
         COLD_N={n}, COLD_ROUNDS={rounds}; each request a task on a one-worker runtime, keys all new)\n\n"
    );
    out += "### `Limiter::check` of a new key against `commands::check` under a 100 ms timeout\n\n";
    out += "| round | limiter CPU ns/req | direct CPU ns/req | CPU × | limiter p50 µs | direct p50 µs | limiter p99 µs | direct p99 µs | p99 × |\n";
    out += "|---|---|---|---|---|---|---|---|---|\n";
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (mut cpu_x, mut p99_x) = (Vec::new(), Vec::new());
    for (r, (l, d)) in rows.iter().enumerate() {
        let (cx, px) = (l.cpu / d.cpu, us(l.p99) / us(d.p99));
        cpu_x.push(cx);
        p99_x.push(px);
        out += &format!(
            "| {r} | {:.0} | {:.0} | {cx:.3} | {:.0} | {:.0} | {:.0} | {:.0} | {px:.3} |\n",
            l.cpu,
            d.cpu,
            us(l.p50),
            us(d.p50),
            us(l.p99),
            us(d.p99)
        );
    }
    let (cx, px) = (median(cpu_x), median(p99_x));
    out += &format!("\nMedians of the paired ratios: CPU per request {cx:.3}×, p99 {px:.3}× the direct call.\n");
    println!("{out}");
    println!("cold: cpu_ratio {cx:.4} p99_ratio {px:.4}");
    let path = root.join("target/bench-cold.md");
    if let Err(e) = std::fs::write(&path, &out) {
        eprintln!("{}: {e}", path.display());
    }
}
