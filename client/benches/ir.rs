//! Instruction counts per check, for `valgrind --tool=callgrind` (stable where timings on a
//! shared machine are not): one process per case runs `IR_N` checks after a warm-up, and
//! `client/benches/ir.sh` runs each case at N and 2N checks and reports the difference ÷ N
//! (the warm-up, the server's start and the runtime's cancel out). The cases are those of
//! `local_path.rs`, with governor's keyed limiter measured the same way in the same run:
//!
//! * `limiter_1`, `limiter_1000`: `Limiter::check` of a key holding units (polled once; a check
//!   that must wait is finished on the runtime, the same future); `engine_*`: the sans-IO
//!   engine alone; `governor_*`: `RateLimiter::keyed` `check_key`.
//!
//! The cold path (a key never seen) is measured end to end, CPU per request and p99 at a fixed
//! rate against a direct `commands::check`, by `client/benches/cold.rs` (`make bench`).
//!
//! `bash client/benches/ir.sh` (needs valgrind and the module: `make build`).

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::{Quota, RateLimiter};
use redis_ratelimit_client::{ConnectionConfig, Decision, Engine, Limit, Limiter, LimiterConfig, Nanos, Step};
use support::{cpu_now, drive};

/// A limit no case reaches: every check is admitted.
fn huge() -> Limit {
    Limit::token_bucket(1_000_000_000_000, Duration::from_secs(1000)).unwrap().with_burst(1_000_000_000_000).unwrap()
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("apikey:{i:08}")).collect()
}

/// The configuration of the warm cases: batches for 50 s of demand, so that every key holds
/// units whatever the speed of the loop (under valgrind it runs ~50× slower), and a call
/// timeout valgrind never reaches.
fn warm_config() -> LimiterConfig {
    LimiterConfig::new(huge())
        .lease(Duration::from_secs(100))
        .horizon(Duration::from_secs(50))
        .max_batch(1_000_000)
        .timeout(Duration::from_secs(60))
}

struct Direct {
    engine: Engine<String>,
    now: u64,
}

impl Direct {
    fn new() -> Direct {
        Direct { engine: Engine::new(warm_config().engine_config().unwrap()), now: 1 }
    }

    fn check(&mut self, key: &str) -> bool {
        self.now += 100;
        let now = Nanos::new(self.now as i64);
        let grant = |units: u64| Decision::from_fields(units as i64, 1_000_000_000, 500_000_000, -1, 1, None);
        let mut step = self.engine.check(now, key, 1);
        loop {
            step = match step {
                Step::Done { outcome, refill } => {
                    if let Some(c) = refill {
                        let _ = self.engine.on_reply(now, &c, &grant(c.units()));
                    }
                    return outcome.allowed;
                }
                Step::Send(c) => self.engine.on_reply(now, &c, &grant(c.units())).unwrap(),
                Step::Wait(w) => self.engine.resume(now, key, w),
            }
        }
    }
}

/// Prints the CPU time per check of the measured loop (for `ir.sh cpu`).
fn report(case: &str, n: usize, cpu: Duration) {
    eprintln!("cpu {case} {:.1} ns/check", cpu.as_nanos() as f64 / n as f64);
}

/// `f(thread, i)` for i in 0..n on 2 threads at once: the process's CPU time and the wall time.
fn two_threads(n: usize, f: impl Fn(usize, usize) + Sync) -> (Duration, Duration) {
    let (t, start) = (cpu_now(), std::time::Instant::now());
    std::thread::scope(|s| {
        for t in 0..2 {
            let f = &f;
            s.spawn(move || (0..n).for_each(|i| f(t, i)));
        }
    });
    (cpu_now() - t, start.elapsed())
}

fn main() {
    let case = std::env::var("IR_CASE").unwrap_or_else(|_| "engine_1".into());
    let n: usize = std::env::var("IR_N").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let width: usize = case.rsplit('_').next().and_then(|w| w.parse().ok()).unwrap_or(1);
    let ks = keys(width);
    let mut pending = 0u64;
    match case.as_str() {
        c if c.starts_with("engine_") => {
            let mut e = Direct::new();
            for _ in 0..20 {
                for k in &ks {
                    e.check(k);
                }
            }
            let t = cpu_now();
            for i in 0..n {
                black_box(e.check(&ks[i % width]));
            }
            report(c, n, cpu_now() - t);
        }
        c if c.starts_with("governor_") => {
            let gov = RateLimiter::keyed(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()));
            for _ in 0..20 {
                for k in &ks {
                    black_box(gov.check_key(k).is_ok());
                }
            }
            let t = cpu_now();
            for i in 0..n {
                black_box(gov.check_key(&ks[i % width]).is_ok());
            }
            report(c, n, cpu_now() - t);
        }
        c if c.starts_with("threads_governor_") => {
            let gov = RateLimiter::keyed(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()));
            let (t, wall) = two_threads(n, |t, i| {
                black_box(gov.check_key(&ks[(i + t * 7) % width]).is_ok());
            });
            report(c, n * 2, t);
            eprintln!("wall {c} {:.1} ns/check/thread", wall.as_nanos() as f64 / n as f64);
        }
        c => {
            let server = common::Server::start_with(common::Opts { debug_clock: false, ..Default::default() });
            // One thread: background claims and replies run only when a check waits (inside
            // `block_on`), so that N and 2N checks differ by exactly the checks (valgrind runs
            // one thread at a time and would otherwise starve the runtime's worker). IR_MT=1: one
            // worker thread, so background refills complete (their cost is counted too).
            let rt = if std::env::var("IR_MT").is_ok() {
                tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
            } else {
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
            };
            let conn = rt.block_on(async {
                let conn = ConnectionConfig::single(&server.url()).connect().unwrap();
                conn.ready(tokio::time::Instant::now() + Duration::from_secs(5)).await.unwrap();
                conn
            });
            let _g = rt.enter();
            match c {
                "limiter_1" | "limiter_1000" => {
                    let l = Limiter::new(conn, warm_config()).unwrap();
                    // Warm: each key in a burst, until it holds a batch for more than the
                    // measured checks (a cold key's first claims are exact), so that the
                    // measured ones never wait for a refill.
                    for k in &ks {
                        for _ in 0..40 {
                            drive(&rt, l.check(k, 1), &mut pending);
                        }
                    }
                    // Every claim of the warm-up answered before the measured checks.
                    rt.block_on(async {
                        while l.metrics().claims_in_flight > 0 {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    });
                    pending = 0;
                    let t = cpu_now();
                    for i in 0..n {
                        black_box(drive(&rt, l.check(&ks[i % width], 1), &mut pending));
                    }
                    report(c, n, cpu_now() - t);
                    let m = l.metrics();
                    let nonzero: Vec<String> =
                        m.fields().into_iter().filter(|f| f.1 > 0).map(|(k, v)| format!("{k} {v}")).collect();
                    eprintln!("{c}: {n} checks, {pending} waited; {}", nonzero.join(", "));
                }
                "threads_limiter_1" | "threads_limiter_1000" => {
                    let l = Limiter::new(conn, warm_config()).unwrap();
                    for k in &ks {
                        for _ in 0..40 {
                            drive(&rt, l.check(k, 1), &mut pending);
                        }
                    }
                    let (t, wall) = two_threads(n, |t, i| {
                        let _g = rt.enter();
                        let mut pending = 0;
                        black_box(drive(&rt, l.check(&ks[(i + t * 7) % width], 1), &mut pending));
                    });
                    report(c, n * 2, t);
                    eprintln!("wall {c} {:.1} ns/check/thread", wall.as_nanos() as f64 / n as f64);
                }
                other => panic!("unknown IR_CASE {other}"),
            }
        }
    }
}
