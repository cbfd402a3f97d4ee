//! The warm path against governor's keyed check, in the same run (issue 33's targets: ≤ 2× on
//! one hot key, ≤ 3× at 1,000 keys). `Limiter::check` of keys holding units (polled once: a
//! local decision never awaits; a check that must wait for Redis is finished on the runtime
//! and counted apart, `waited`), against `RateLimiter::keyed` `check_key` on the same keys, every
//! check admitted. Per check: the process's CPU time (CLOCK_PROCESS_CPUTIME_ID: other processes
//! do not count), one thread.
//!
//! Rounds alternate the order of the two (`WARM_ROUNDS`, default 9, `WARM_N` checks per side,
//! default 200,000); the figures are medians of the rounds' paired ratios (this VM's speed
//! jumps ~1.66× every few seconds). Prints a table and writes it to `target/bench-warm.md`.
//!
//! `cargo bench -p redis-ratelimit-client --bench warm` (needs the module: `make build`).

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::{Quota, RateLimiter};
use redis_ratelimit_client::{ConnectionConfig, Limit, Limiter, LimiterConfig};
use support::{cpu_now, drive, env, median};

/// Batches for 50 s of demand and leases of 100 s: every key keeps units for the whole run, so
/// that no measured check waits for Redis (those that do are counted).
fn warm_config() -> LimiterConfig {
    let huge = Limit::token_bucket(1_000_000_000_000, Duration::from_secs(1000))
        .unwrap()
        .with_burst(1_000_000_000_000)
        .unwrap();
    LimiterConfig::new(huge)
        .lease(Duration::from_secs(100))
        .horizon(Duration::from_secs(50))
        .max_batch(1_000_000)
        .timeout(Duration::from_secs(60))
}

fn main() {
    let n = env("WARM_N", 200_000).max(1000) as usize;
    let rounds = env("WARM_ROUNDS", 9).max(1) as usize;
    let server = common::Server::start_with(common::Opts { debug_clock: false, ..Default::default() });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let conn = rt.block_on(async {
        let conn = ConnectionConfig::single(&server.url()).connect().unwrap();
        conn.ready(tokio::time::Instant::now() + Duration::from_secs(5)).await.unwrap();
        conn
    });
    let _g = rt.enter();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let stamp = std::process::Command::new("bash")
        .arg(root.join("scripts/perf-doc.sh"))
        .arg("stamp")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_default();
    let mut out = String::from("# The warm path\n\n");
    out += stamp.trim_end();
    out += &format!(
        "\n- Command: `cargo bench -p redis-ratelimit-client --bench warm` (WARM_N={n}, WARM_ROUNDS={rounds}; \
         CPU time per check, one thread, every check admitted)\n\n"
    );
    out += "### `Limiter::check` of keys holding units against governor's keyed `check_key`\n\n";
    out += "| keys | driver ns/check (median) | governor ns/check (median) | driver ÷ governor (median of paired ratios) | range of the ratios | checks that waited for Redis | target |\n";
    out += "|---:|---:|---:|---:|---|---:|---|\n";
    for (width, target) in [(1usize, 2.0), (1000, 3.0)] {
        let ks: Vec<String> = (0..width).map(|i| format!("apikey:{i:08}")).collect();
        let limiter = Limiter::new(conn.clone(), warm_config()).unwrap();
        let gov = RateLimiter::keyed(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()));
        let mut waited = 0;
        // Warm: each key in a burst until it holds a batch (a cold key's first claims are
        // exact), then every claim of the warm-up answered.
        for k in &ks {
            for _ in 0..40 {
                drive(&rt, limiter.check(k, 1), &mut waited);
            }
            black_box(gov.check_key(k).is_ok());
        }
        rt.block_on(async {
            while limiter.metrics().claims_in_flight > 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        waited = 0;
        let run_limiter = |waited: &mut u64| {
            let t = cpu_now();
            for i in 0..n {
                black_box(drive(&rt, limiter.check(&ks[i % width], 1), waited).allowed);
            }
            (cpu_now() - t).as_nanos() as f64 / n as f64
        };
        let run_gov = || {
            let t = cpu_now();
            for i in 0..n {
                black_box(gov.check_key(&ks[i % width]).is_ok());
            }
            (cpu_now() - t).as_nanos() as f64 / n as f64
        };
        let (mut l, mut g, mut x) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..rounds {
            let (a, b) = if r % 2 == 0 {
                let a = run_limiter(&mut waited);
                (a, run_gov())
            } else {
                let b = run_gov();
                (run_limiter(&mut waited), b)
            };
            l.push(a);
            g.push(b);
            x.push(a / b);
        }
        let (lo, hi) = (x.iter().cloned().fold(f64::MAX, f64::min), x.iter().cloned().fold(0.0, f64::max));
        let ratio = median(x);
        let verdict = if ratio <= target { "met" } else { "**missed**" };
        out += &format!(
            "| {width} | {:.1} | {:.1} | {ratio:.2}× | {lo:.2}–{hi:.2}× | {waited} of {} | ≤ {target}× — {verdict} |\n",
            median(l),
            median(g),
            n * rounds
        );
    }
    println!("{out}");
    let path = root.join("target/bench-warm.md");
    if let Err(e) = std::fs::write(&path, &out) {
        eprintln!("{}: {e}", path.display());
    }
}
