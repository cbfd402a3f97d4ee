//! The client's local path against governor's keyed limiter, in the same run (issue 19):
//!
//! * `one_key/*`, `keys_1000/*`: one check of a key that holds units, single thread: the
//!   tokio driver (`Limiter::check`, polled once: a local decision never awaits; a check that
//!   must wait is finished on the runtime, the same future), the sans-IO engine alone, and
//!   governor's `RateLimiter::keyed` `check_key`, all with limits far above the load (every
//!   check admitted). The driver batches for 5 s of demand (`horizon`, lease 10 s): a closed
//!   benchmark loop makes each key's demand depend on the loop's own speed, and with the
//!   default 100 ms a cold start at 1,000 keys stays in a slow equilibrium (small batches, so
//!   keys run dry while their refill is out, so checks wait, so the loop and each key's
//!   demand stay slow) that open-loop traffic, whose rate does not depend on the latency,
//!   leaves within a time constant of the demand estimate (1 s);
//! * `threads_2/*`: the same from 2 threads at once (time per check per thread).
//!
//! The cold path (a key never seen): `cold.rs`.
//!
//! `cargo bench -p redis-ratelimit-client --bench local_path` (needs the module built:
//! `make build`).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use governor::{Quota, RateLimiter};
use redis_ratelimit_client::{
    Connection, ConnectionConfig, Decision, Engine, EngineConfig, Limit, Limiter, LimiterConfig, Nanos, Step,
};

/// A limit no benchmark reaches: every check is admitted.
fn huge() -> Limit {
    Limit::token_bucket(1_000_000_000, Duration::from_secs(1)).unwrap().with_burst(1_000_000_000).unwrap()
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("apikey:{i:08}")).collect()
}

/// An engine whose claims are answered at once with everything asked (sans IO: no Redis).
struct Instant_ {
    engine: Engine<String>,
    now: u64,
}

impl Instant_ {
    fn new() -> Instant_ {
        let mut c = EngineConfig::new(huge());
        c.lease.max_batch = 100_000;
        Instant_ { engine: Engine::new(c), now: 1 }
    }

    fn check(&mut self, key: &str) -> bool {
        self.now += 100;
        let now = Nanos::new(self.now as i64);
        let mut step = self.engine.check(now, key, 1);
        loop {
            step = match step {
                Step::Done { outcome, refill } => {
                    if let Some(c) = refill {
                        let d = Decision::from_fields(c.units() as i64, 1_000_000_000, 500_000_000, -1, 1, None);
                        let _ = self.engine.on_reply(now, &c, &d);
                    }
                    return outcome.allowed;
                }
                Step::Send(c) => {
                    let d = Decision::from_fields(c.units() as i64, 1_000_000_000, 500_000_000, -1, 1, None);
                    self.engine.on_reply(now, &c, &d).unwrap()
                }
                Step::Wait(w) => self.engine.resume(now, key, w),
            }
        }
    }
}

struct Fixture {
    _server: common::Server,
    rt: tokio::runtime::Runtime,
    limiter: Limiter<Connection>,
}

fn fixture() -> Fixture {
    let server = common::Server::start_with(common::Opts { debug_clock: false, ..Default::default() });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let conn = rt.block_on(async {
        let conn = ConnectionConfig::single(&server.url()).connect().unwrap();
        conn.ready(tokio::time::Instant::now() + Duration::from_secs(5)).await.unwrap();
        conn
    });
    let limiter = {
        let _g = rt.enter();
        let config = LimiterConfig::new(huge())
            .lease(Duration::from_secs(10))
            .horizon(Duration::from_secs(5))
            .max_batch(1_000_000)
            .timeout(Duration::from_secs(1));
        Limiter::new(conn, config).unwrap()
    };
    Fixture { _server: server, rt, limiter }
}

/// One driver check polled once (a local decision is ready at once); a check that must wait
/// for Redis is finished on the runtime (the same future: dropping it would hand its claim to a
/// task and make the retry a second request).
fn limiter_check(f: &Fixture, key: &str) -> bool {
    let mut check = pin!(f.limiter.check(key, 1));
    match check.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(o) => o.allowed,
        Poll::Pending => f.rt.block_on(check).allowed,
    }
}

/// Every key holds a batch: each in a burst (a cold key's first claims are exact, the next
/// ones sized from its demand), then until no claim is in flight.
fn warm(f: &Fixture, ks: &[String]) {
    for k in ks {
        for _ in 0..40 {
            limiter_check(f, k);
        }
    }
    f.rt.block_on(async {
        while f.limiter.metrics().claims_in_flight > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
}

fn single_thread(c: &mut Criterion) {
    let f = fixture();
    let _g = f.rt.enter();
    for n in [1usize, 1000] {
        let ks = keys(n);
        let name = if n == 1 { "one_key" } else { "keys_1000" };
        let mut g = c.benchmark_group(name);
        warm(&f, &ks);
        let mut i = 0;
        g.bench_function(BenchmarkId::new("limiter", n), |b| {
            b.iter(|| {
                i = (i + 1) % n;
                black_box(limiter_check(&f, &ks[i]))
            })
        });
        let mut e = Instant_::new();
        g.bench_function(BenchmarkId::new("engine", n), |b| {
            b.iter(|| {
                i = (i + 1) % n;
                black_box(e.check(&ks[i]))
            })
        });
        let gov = RateLimiter::keyed(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()));
        g.bench_function(BenchmarkId::new("governor", n), |b| {
            b.iter(|| {
                i = (i + 1) % n;
                black_box(gov.check_key(&ks[i]).is_ok())
            })
        });
        g.finish();
    }
}

fn two_threads(c: &mut Criterion) {
    let f = Arc::new(fixture());
    let ks = Arc::new(keys(1000));
    let gov = Arc::new(RateLimiter::keyed(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap())));
    let mut g = c.benchmark_group("threads_2");
    for n in [1usize, 1000] {
        // Warmed right before each width, as in `single_thread`: keys left idle through the
        // one-key case would have given their units back (idle return) and start cold.
        {
            let _g = f.rt.enter();
            warm(&f, &ks[..n]);
        }
        let run = |which: &'static str, iters: u64| -> Duration {
            let start = Instant::now();
            let hs: Vec<_> = (0..2u64)
                .map(|t| {
                    let (f, ks, gov) = (f.clone(), ks.clone(), gov.clone());
                    std::thread::spawn(move || {
                        let _g = f.rt.enter();
                        let mut e = Instant_::new();
                        for i in 0..iters {
                            let k = &ks[((i + t * 7) % n as u64) as usize];
                            match which {
                                "limiter" => black_box(limiter_check(&f, k)),
                                "governor" => black_box(gov.check_key(k).is_ok()),
                                _ => black_box(e.check(k)),
                            };
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            start.elapsed()
        };
        for which in ["limiter", "governor"] {
            g.bench_function(BenchmarkId::new(which, n), |b| b.iter_custom(|iters| run(which, iters)));
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = single_thread, two_threads
}
criterion_main!(benches);
