//! Many remembered keys (issue 19): memory per key, memory after they are forgotten, and
//! housekeeping CPU, for 1,000 to 1,000,000 keys, on the sans-IO engine the driver shards: one
//! engine, and the same keys split over 64 engines as the driver's default 64 shards split them.
//!
//! Each key is checked once (a cold key: an exact claim, granted, served), as per-IP limits
//! see most keys; it is then remembered, holding nothing, until forgotten 2 L after its request
//! (L = 1 s). Memory is the heap in use (a counting allocator: bytes allocated minus freed;
//! per key: above the empty engines, whose own cost is shown apart),
//! and the resident set from /proc/self/statm. Housekeeping runs as the driver runs it: sleep
//! until `poll_timeout`, then `handle_timeout`; its CPU (CLOCK_PROCESS_CPUTIME_ID) is reported
//! for the idle window before any key is due (per second of that window) and for the
//! forgetting of every key (per key).
//!
//! `cargo bench -p redis-ratelimit-client --bench keys` (prints a table; not a criterion run:
//! one pass per size).

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};
use std::time::Duration;

use compact_str::CompactString;
use redis_ratelimit_client::engine::Shared;
use redis_ratelimit_client::{Decision, Engine, EngineConfig, Limit, Nanos, Step};
use support::cpu_now;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counter only records
// sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Relaxed);
        // SAFETY: the caller's layout contract is passed on as is.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Relaxed);
        // SAFETY: `p` was allocated by `System` with `l` (alloc above).
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Relaxed);
        // SAFETY: as dealloc and alloc.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn rss() -> isize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: isize = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

/// `n` keys over `shards` engines sharing one state, each key on the shard the driver picks.
fn run(n: usize, shards: usize) {
    let config = EngineConfig::new(Limit::token_bucket(100, Duration::from_secs(60)).unwrap());
    let (heap0, rss0) = (LIVE.load(Relaxed), rss());
    let shared = Shared::new(config);
    let mut es: Vec<Engine<CompactString>> = (0..shards).map(|_| Engine::with_shared(shared.clone())).collect();
    // What the engines cost before any key (the wheel's slots): not per key.
    let heap_empty = LIVE.load(Relaxed);
    let mut now = Nanos::from_secs(1);
    let spread = Nanos::from_millis(500) / n as u64; // every key within half a second
    let reply = Decision::from_fields(1, 100, 99, -1, 600, None);
    for i in 0..n {
        now += spread.max(Nanos::new(1));
        let key = format!("ip:10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
        let hash = shared.hash(key.as_str());
        // The driver's shard of a hash (client/src/limiter.rs).
        let e = &mut es[(((hash >> 32) as u128 * shards as u128) >> 32) as usize];
        match e.check_hashed(now, hash, key.as_str(), 1) {
            Step::Send(c) => {
                let s = e.on_reply(now, &c, &reply);
                assert!(matches!(s, Some(Step::Done { outcome, .. }) if outcome.allowed));
            }
            s => panic!("{s:?}"),
        }
    }
    let (heap1, rss1) = (LIVE.load(Relaxed), rss());
    assert_eq!(es.iter().map(Engine::len).sum::<usize>(), n);
    // Housekeeping as the driver runs it: the shard with the earliest deadline, until `until`.
    let mut wakes = 0u64;
    let mut housekeep = |es: &mut Vec<Engine<CompactString>>, until: Option<Nanos>| loop {
        let next = es.iter().enumerate().filter_map(|(k, e)| e.poll_timeout().map(|t| (t, k))).min();
        match next {
            Some((t, k)) if until.is_none_or(|u| t < u) => {
                es[k].handle_timeout(t);
                wakes += 1;
            }
            _ => break,
        }
    };
    // Idle: from the last request to the first deadline (2 L after the first request).
    let idle_end = Nanos::from_secs(1) + Nanos::from_secs(2);
    let idle = idle_end - now;
    let t0 = cpu_now();
    housekeep(&mut es, Some(idle_end));
    let idle_cpu = cpu_now() - t0;
    // Then every key is forgotten, at its deadline.
    let t1 = cpu_now();
    housekeep(&mut es, None);
    let forget_cpu = cpu_now() - t1;
    assert!(es.iter().all(Engine::is_empty));
    let heap2 = LIVE.load(Relaxed);
    let rss_kept = rss();
    // glibc keeps freed memory in its arenas until asked: the engine frees, the allocator
    // decides when the resident set shrinks.
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    let rss2 = rss();
    drop(es);
    println!(
        "| {n} | {shards} | {:.0} B | {:.0} kB | {:.1} MiB | {:+} B | {:+.1} MiB ({:+.1} MiB before malloc_trim) | {:.4} % ({:?} over {:?} idle, {} wakes) | {:.0} ns |",
        (heap1 - heap_empty) as f64 / n as f64,
        (heap_empty - heap0) as f64 / 1000.0,
        (rss1 - rss0) as f64 / (1 << 20) as f64,
        heap2 - heap_empty,
        (rss2 - rss0) as f64 / (1 << 20) as f64,
        (rss_kept - rss0) as f64 / (1 << 20) as f64,
        100.0 * idle_cpu.as_secs_f64() / Duration::from(idle).as_secs_f64(),
        idle_cpu,
        Duration::from(idle),
        wakes,
        forget_cpu.as_nanos() as f64 / n as f64,
    );
}

fn main() {
    // `cargo bench` passes --bench; nothing to parse.
    println!("| keys | engines | heap per key | empty engines | RSS growth | heap after forgetting (vs empty) | RSS after | idle housekeeping CPU (of a core) | forgetting, per key |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    // One engine (as the simulator), and the driver's default 64 shards.
    for shards in [1, 64] {
        for n in [1_000, 10_000, 100_000, 1_000_000] {
            run(n, shards);
        }
    }
}
