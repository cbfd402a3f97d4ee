//! The cost of one decision of each algorithm core, with no Redis: parse, key lookup, TTL,
//! replication and reply are all excluded (benches/server measures those, end to end).
//!
//!   cargo bench --bench core                        # full run (~20 s after the build)
//!   cargo bench --bench core -- --quick             # smoke run
//!   cargo bench --bench core -- sliding_log         # one group
//!
//! Every benchmark keeps a live state and a clock that advances on each call, so the decision
//! is made against a realistic stored state (never a fresh key) and the branch taken is the
//! steady one:
//!
//! * `decision/<algo>`: `check(Some(&state), &params, now, Request::new(1))` at a rate the
//!   limiter admits (buckets: 1,000,000 per second; windows: 2,000,000 per second; the clock
//!   advancing 1 µs per call); the returned state is stored back, as the module does after an
//!   admitted call.
//! * `sliding_log_at_limit/<limit>`: a log filled to its limit (window = limit µs, one entry
//!   per µs), then check + apply of the commit with the clock advancing 1 µs per call, so each
//!   call evicts exactly one entry and admits one: the client stays at its limit. Flat across
//!   10 / 1,000 / 100,000 means the per-call cost does not grow with the log.
//! * `sliding_log_limited/<limit>`: the same full log, the clock standing still: every call is
//!   refused and computes the exact retry_after (check only, nothing to apply).
//! * `encode_update/<algo>`: the replication payload of an admitted call (RL.SETSTATE bytes),
//!   which the module builds on every admitted call.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use redis_ratelimit_core::codec::State as Stored;
use redis_ratelimit_core::spec::Update;
use redis_ratelimit_core::{
    fixed, gcra, leaky, sliding, sliding_log, token_bucket, Nanos, Rate, Request, Window, NANOS_PER_SEC,
};

/// 2023-11-14T22:13:20Z, in ns: a realistic instant.
const T0: Nanos = Nanos::new(1_700_000_000 * NANOS_PER_SEC);
/// The clock's step between calls.
const STEP: Nanos = Nanos::from_micros(1);

fn rate() -> Rate {
    // 1,000,000 per second = one per µs: with the clock advancing 1 µs per call, every call
    // is admitted and the bucket stays at a steady level.
    Rate::new(1_000_000, Nanos::from_secs(1), 1_000_000).expect("valid rate")
}

fn window() -> Window {
    // Twice the call rate: the windows admit every call too (the sliding estimate never
    // reaches the limit), so all five measure the same admitted path.
    Window::new(2_000_000, Nanos::from_secs(1)).expect("valid window")
}

fn decisions(c: &mut Criterion) {
    let mut g = c.benchmark_group("decision");
    g.throughput(Throughput::Elements(1));
    let req = Request::new(1);

    macro_rules! bench_algo {
        ($name:literal, $module:ident, $params:expr) => {{
            let params = $params;
            // Start from the state a first admitted call leaves.
            let (_, first) = $module::check(None, &params, T0, req);
            let mut state = first.expect("first call is admitted");
            let mut now = T0;
            g.bench_function($name, |b| {
                b.iter(|| {
                    now += STEP;
                    let (d, new) = $module::check(Some(black_box(&state)), black_box(&params), now, req);
                    if let Some(s) = new {
                        state = s;
                    }
                    black_box(d)
                })
            });
        }};
    }

    bench_algo!("gcra", gcra, rate());
    bench_algo!("token_bucket", token_bucket, rate());
    bench_algo!("leaky", leaky, rate());
    bench_algo!("sliding", sliding, window());
    bench_algo!("fixed", fixed, window());
    g.finish();
}

/// A sliding log filled to `limit` entries, one per µs, window = `limit` µs; returns the log
/// and the instant of its newest entry.
fn full_log(limit: u64) -> (sliding_log::State, Window, Nanos) {
    let win = Window::new(limit, Nanos::from_micros(limit)).expect("valid window");
    let mut state = sliding_log::State::new(win);
    let req = Request::new(1);
    let mut now = T0;
    for i in 0..limit {
        if i > 0 {
            now += STEP;
        }
        let (d, commit) = sliding_log::check(Some(&state), &win, now, req);
        assert_eq!(d.allowed, 1, "filling the log: call {i} must be admitted");
        state.apply(&commit.expect("admitted call commits"));
    }
    assert_eq!(state.log.len() as u64, limit);
    assert_eq!(state.in_window(now), limit, "the log is at its limit");
    (state, win, now)
}

fn sliding_log_at_limit(c: &mut Criterion) {
    let mut g = c.benchmark_group("sliding_log_at_limit");
    g.throughput(Throughput::Elements(1));
    let req = Request::new(1);
    for limit in [10u64, 1_000, 100_000] {
        let (mut state, win, mut now) = full_log(limit);
        // One step on: the oldest entry is exactly one window old, so it leaves and the new
        // request takes its place.
        let (d, _) = sliding_log::check(Some(&state), &win, now + STEP, req);
        assert_eq!(d.allowed, 1, "steady state: one evicted, one admitted");
        g.bench_with_input(BenchmarkId::from_parameter(limit), &limit, |b, _| {
            b.iter(|| {
                now += STEP;
                let (d, commit) = sliding_log::check(Some(black_box(&state)), black_box(&win), now, req);
                if let Some(c) = commit {
                    state.apply(&c);
                }
                black_box(d)
            })
        });
        // Still at the limit, still the same size: the benchmark measured the steady state.
        assert_eq!(state.in_window(now), limit);
        assert_eq!(state.log.len() as u64, limit);
    }
    g.finish();
}

fn sliding_log_limited(c: &mut Criterion) {
    let mut g = c.benchmark_group("sliding_log_limited");
    g.throughput(Throughput::Elements(1));
    let req = Request::new(1);
    for limit in [10u64, 1_000, 100_000] {
        let (state, win, now) = full_log(limit);
        let (d, commit) = sliding_log::check(Some(&state), &win, now, req);
        assert!(d.allowed == 0 && commit.is_none() && d.retry_after.is_some(), "a full log refuses");
        g.bench_with_input(BenchmarkId::from_parameter(limit), &limit, |b, _| {
            b.iter(|| black_box(sliding_log::check(Some(black_box(&state)), black_box(&win), now, req)))
        });
    }
    g.finish();
}

fn encode_update(c: &mut Criterion) {
    let mut g = c.benchmark_group("encode_update");
    g.throughput(Throughput::Elements(1));
    let req = Request::new(1);
    let (_, s) = gcra::check(None, &rate(), T0, req);
    let gcra_update = Update::Replace(Stored::Gcra(s.expect("admitted")));
    let (_, commit) = sliding_log::check(None, &window(), T0, req);
    let log_update = Update::Log(commit.expect("admitted"));
    let mut buf = Vec::with_capacity(128);
    for (name, u) in [("gcra", &gcra_update), ("sliding_log_commit", &log_update)] {
        g.bench_function(name, |b| {
            b.iter(|| {
                buf.clear();
                black_box(u).encode_into(&mut buf);
                black_box(buf.len())
            })
        });
    }
    g.finish();
}

fn config() -> Criterion {
    // Short by default so that `make bench` stays within a few minutes; command-line flags
    // (--measurement-time, --warm-up-time, --quick) override these.
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30)
        .configure_from_args()
}

criterion_group! {
    name = benches;
    config = config();
    targets = decisions, sliding_log_at_limit, sliding_log_limited, encode_update
}
criterion_main!(benches);
