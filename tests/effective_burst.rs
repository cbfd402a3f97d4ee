//! Effective-burst harness: replays request traces against the real module (debug clock) and
//! measures, exactly, the most requests any algorithm admitted in any 60 s window.
//!
//! Setup: every algorithm runs with limit 100 per 60 s (RL.GCRA, RL.TOKENBUCKET and RL.LEAKY with
//! BURST 100), one fresh key per (algorithm, trace). Times are µs relative to `BASE_US`, a
//! multiple of 60 s since the epoch, so the epoch-aligned windows of RL.FIXED and RL.SLIDING
//! start at base + 0 s, 60 s, 120 s, …
//!
//! * A burst of n requests is n requests at the *same* µs (one `RL.DEBUG CLOCK SET`, then the n
//!   calls, in one MULTI/EXEC so the server's real clock, which drives key TTLs, is frozen for
//!   the group and cannot expire a key half-way through a burst).
//! * Every admitted request's timestamp is recorded; the worst window is the largest number of
//!   admitted timestamps in any half-open window (t − 60 s, t], found with two pointers over the
//!   sorted timestamps (the maximum is always reached with t = some admitted timestamp).
//! * A "greedy" step at instant t sends requests until one is limited: a COST 0 peek (not
//!   counted as sent) reads `remaining` = r, then r + 1 requests go in one pipeline; if they
//!   were all admitted (`remaining` under-reported) it keeps sending until one is limited. The
//!   harness asserts `remaining` was exact and that at one instant the admitted calls are a
//!   prefix (a limited call changes nothing).
//!
//! Run the table: `cargo test --release --test effective_burst -- --ignored --nocapture print_table`

mod common;

use common::{LimiterReply, Opts, Server};
use std::time::Instant;

const LIMIT: u64 = 100;
const SEC: i64 = 1_000_000;
const MS: i64 = 1_000;
const WINDOW_US: i64 = 60 * SEC;
/// Emission interval of 100 per 60 s.
const INTERVAL_US: i64 = WINDOW_US / LIMIT as i64;
/// 2023-11-14T22:13:00Z, a multiple of 60 s (and of every shorter unit).
const BASE_US: i64 = 28_333_333 * WINDOW_US;
/// Largest pipeline (commands, CLOCK SETs included) sent as one MULTI/EXEC by `send`.
const CHUNK: usize = 2_000;
/// The command that prints the table (shown in its output and in docs/choosing.md).
const TABLE_COMMAND: &str = "cargo test --release --test effective_burst -- --ignored --nocapture print_table";

// ---------------------------------------------------------------------------------------------
// Algorithms

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Algo {
    /// Module command.
    cmd: &'static str,
    /// Units per 60 s (100 but for one extra row of the table).
    limit: u64,
    /// `BURST n` for the buckets (0: a window algorithm, no BURST).
    burst: u64,
}

const GCRA: Algo = Algo { cmd: "RL.GCRA", limit: 100, burst: 100 };
const TOKENBUCKET: Algo = Algo { cmd: "RL.TOKENBUCKET", limit: 100, burst: 100 };
const LEAKY: Algo = Algo { cmd: "RL.LEAKY", limit: 100, burst: 100 };
const SLIDING: Algo = Algo { cmd: "RL.SLIDING", limit: 100, burst: 0 };
const FIXED: Algo = Algo { cmd: "RL.FIXED", limit: 100, burst: 0 };
const SLIDINGLOG: Algo = Algo { cmd: "RL.SLIDINGLOG", limit: 100, burst: 0 };

const ALGOS: [Algo; 6] = [GCRA, TOKENBUCKET, LEAKY, SLIDING, FIXED, SLIDINGLOG];

/// Extra rows of the table: how BURST shapes the worst case. The same rate with smaller bursts,
/// and a bucket sized so that BURST + limit − 1 = 100: bursts of 20 and never more than 100 in
/// any 60 s.
const GCRA_B20: Algo = Algo { cmd: "RL.GCRA", limit: 100, burst: 20 };
const GCRA_B1: Algo = Algo { cmd: "RL.GCRA", limit: 100, burst: 1 };
const GCRA_81_B20: Algo = Algo { cmd: "RL.GCRA", limit: 81, burst: 20 };

impl Algo {
    fn call(&self, key: &str, cost: u64) -> redis::Cmd {
        let mut c = redis::cmd(self.cmd);
        c.arg(key).arg(self.limit).arg("60s");
        if self.burst > 0 {
            c.arg("BURST").arg(self.burst);
        }
        if cost != 1 {
            c.arg("COST").arg(cost);
        }
        c
    }

    /// The `limit` field of its replies.
    fn capacity(&self) -> u64 {
        if self.burst > 0 {
            self.burst
        } else {
            self.limit
        }
    }

    /// How the command is called, for the table.
    fn spelled(&self) -> String {
        match self.burst {
            0 => format!("{} k {} 60s", self.cmd, self.limit),
            b => format!("{} k {} 60s BURST {b}", self.cmd, self.limit),
        }
    }

    fn short(&self) -> String {
        let name = self.cmd.trim_start_matches("RL.").to_ascii_lowercase();
        match (self.limit, self.burst) {
            (100, 0 | 100) => name,
            (100, b) => format!("{name}-b{b}"),
            (l, b) => format!("{name}-{l}-b{b}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Replies and the trace runner

/// A reply of `algo`'s command: its field count (delay_ms for RL.LEAKY only) and its limit checked.
fn parse_reply(v: &[i64], algo: Algo) -> LimiterReply {
    let r = LimiterReply::from_ints(v).unwrap_or_else(|e| panic!("{} reply: {e}", algo.cmd));
    assert_eq!(r.delay_ms.is_some(), algo.cmd == "RL.LEAKY", "{} reply {v:?}", algo.cmd);
    assert_eq!(r.limit, algo.capacity() as i64, "{} reply {v:?}: limit", algo.cmd);
    r
}

/// Everything one (algorithm, trace) replay produced.
#[derive(Clone, Debug, Default)]
struct Counted {
    /// Limiter calls with COST 1.
    sent: u64,
    /// µs (relative to BASE_US) of every admitted request, in admission order.
    admitted: Vec<i64>,
    /// RL.LEAKY: (arrival µs, delay_ms) of every admitted request, in admission order.
    departures: Vec<(i64, i64)>,
    /// Commands sent, CLOCK SETs and peeks included (MULTI/EXEC not counted).
    commands: u64,
    round_trips: u64,
    /// Greedy steps where the peek's `remaining` differed from what was then admitted.
    remaining_mismatches: u64,
    elapsed_ms: f64,
}

struct Runner<'a> {
    con: &'a mut redis::Connection,
    algo: Algo,
    key: String,
    out: Counted,
}

impl Runner<'_> {
    /// Sends groups of (instant µs relative to base, n requests with COST `cost`), each group
    /// preceded by its CLOCK SET, in as few MULTI/EXEC round trips as `CHUNK` allows. Returns
    /// the replies, group by group.
    fn send_cost(&mut self, groups: &[(i64, u32)], cost: u64) -> Vec<Vec<LimiterReply>> {
        let mut all = Vec::with_capacity(groups.len());
        let mut start = 0;
        while start < groups.len() {
            let mut end = start;
            let mut size = 0usize;
            while end < groups.len() && (end == start || size + 1 + groups[end].1 as usize <= CHUNK) {
                size += 1 + groups[end].1 as usize;
                end += 1;
            }
            let mut p = redis::pipe();
            p.atomic();
            for &(at, n) in &groups[start..end] {
                p.cmd("RL.DEBUG").arg("CLOCK").arg("SET").arg(BASE_US + at).ignore();
                for _ in 0..n {
                    p.add_command(self.algo.call(&self.key, cost));
                }
            }
            let raw: Vec<Vec<i64>> =
                p.query(self.con).unwrap_or_else(|e| panic!("{} pipeline failed: {e}", self.algo.cmd));
            self.out.commands += size as u64;
            self.out.round_trips += 1;
            let mut it = raw.iter();
            for &(at, n) in &groups[start..end] {
                let replies: Vec<LimiterReply> =
                    (0..n).map(|_| parse_reply(it.next().expect("reply count"), self.algo)).collect();
                if cost > 0 {
                    self.record(at, &replies);
                }
                all.push(replies);
            }
            start = end;
        }
        all
    }

    fn send(&mut self, groups: &[(i64, u32)]) -> Vec<Vec<LimiterReply>> {
        self.send_cost(groups, 1)
    }

    fn record(&mut self, at: i64, replies: &[LimiterReply]) {
        self.out.sent += replies.len() as u64;
        // At one instant a limited call changes nothing, so the admitted calls are a prefix.
        let admitted = replies.iter().take_while(|r| r.allowed > 0).count();
        assert!(
            replies[admitted..].iter().all(|r| r.allowed == 0),
            "{} at base+{at} µs: an admission after a limited call at the same instant: {replies:?}",
            self.algo.cmd
        );
        for r in &replies[..admitted] {
            assert_eq!(r.allowed, 1);
            self.out.admitted.push(at);
            if let Some(d) = r.delay_ms {
                assert!(d >= 0, "RL.LEAKY admitted with delay {d}");
                self.out.departures.push((at, d));
            }
        }
        for r in &replies[admitted..] {
            if let Some(d) = r.delay_ms {
                assert_eq!(d, -1, "RL.LEAKY limited reply with delay {d}");
            }
        }
    }

    /// Send until one request is limited, at instant `at`; returns the limited reply.
    fn greedy(&mut self, at: i64) -> LimiterReply {
        let r = self.send_cost(&[(at, 1)], 0)[0][0].remaining;
        assert!(r >= 0);
        let mut batch = r as u32 + 1;
        let mut admitted = 0i64;
        loop {
            let replies = self.send(&[(at, batch)]).pop().unwrap();
            admitted += replies.iter().filter(|x| x.allowed > 0).count() as i64;
            if let Some(lim) = replies.iter().find(|x| x.allowed == 0) {
                if admitted != r {
                    self.out.remaining_mismatches += 1;
                }
                return *lim;
            }
            batch = 1;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Traces

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trace {
    /// The seeds' trace: 100 at 59.0 s, 100 at 60.1 s.
    Boundary,
    /// Greedy at the last µs of window 0 (59.999999 s), then follow retry_after: probe with one
    /// request 1 µs before the promised instant, go greedy at the promised instant, repeat
    /// until 180 s.
    EdgeRetry,
    /// 100 at 59.999999 s, then one request every 50 ms from 60.0 s to 120.0 s.
    EdgeTrickle,
    /// Greedy every 100 ms from 30.0 s to 150.0 s.
    Greedy100ms,
    /// Greedy at 10.0 s (drains a bucket), then greedy every 600 ms (the refill interval) for 120 s.
    RefillRate,
    /// One request every 200 ms (5/s, 3× the rate) for 120 s.
    Steady3x,
    /// 150 at 45 s, 90 s, …, 270 s (idle 45 s, burst 150, six times).
    Sawtooth,
}

const TRACES: [Trace; 7] = [
    Trace::Boundary,
    Trace::EdgeRetry,
    Trace::EdgeTrickle,
    Trace::Greedy100ms,
    Trace::RefillRate,
    Trace::Steady3x,
    Trace::Sawtooth,
];

impl Trace {
    fn name(self) -> &'static str {
        match self {
            Trace::Boundary => "boundary",
            Trace::EdgeRetry => "edge-burst+retry",
            Trace::EdgeTrickle => "edge-burst+trickle",
            Trace::Greedy100ms => "greedy-100ms",
            Trace::RefillRate => "drain+refill-rate",
            Trace::Steady3x => "steady-3x",
            Trace::Sawtooth => "sawtooth",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Trace::Boundary => "100 at 59.0 s, 100 at 60.1 s (the article's trace)",
            Trace::EdgeRetry => {
                "greedy at 59.999999 s (last µs of window 0); then repeatedly: 1 request 1 µs before \
                 now+retry_after, greedy at now+retry_after; until 180 s"
            }
            Trace::EdgeTrickle => "100 at 59.999999 s, then 1 request every 50 ms from 60.0 s to 120.0 s",
            Trace::Greedy100ms => "greedy (send until limited) every 100 ms from 30.0 s to 150.0 s",
            Trace::RefillRate => "greedy at 10.0 s (drain), then greedy every 600 ms for 120 s",
            Trace::Steady3x => "1 request every 200 ms (5/s = 3x the rate) for 120 s",
            Trace::Sawtooth => "150 at once at 45 s, 90 s, ..., 270 s (idle 45 s, burst 150, x6)",
        }
    }

    fn run(self, r: &mut Runner) {
        match self {
            Trace::Boundary => {
                r.send(&[(59 * SEC, 100), (60 * SEC + 100 * MS, 100)]);
            }
            Trace::EdgeRetry => {
                let end = 180 * SEC;
                let mut t = 60 * SEC - 1;
                loop {
                    let lim = r.greedy(t);
                    assert!(lim.retry_after_ms > 0, "{}: limited with retry_after {}", r.algo.cmd, lim.retry_after_ms);
                    let next = t + lim.retry_after_ms * MS;
                    if next > end {
                        break;
                    }
                    r.send(&[(next - 1, 1)]);
                    t = next;
                }
            }
            Trace::EdgeTrickle => {
                let mut g = vec![(60 * SEC - 1, 100)];
                g.extend((0..=1200).map(|k| (60 * SEC + k * 50 * MS, 1)));
                r.send(&g);
            }
            Trace::Greedy100ms => {
                for k in 0..=1200 {
                    r.greedy(30 * SEC + k * 100 * MS);
                }
            }
            Trace::RefillRate => {
                for k in 0..=200 {
                    r.greedy(10 * SEC + k * INTERVAL_US);
                }
            }
            Trace::Steady3x => {
                let g: Vec<(i64, u32)> = (0..600).map(|k| (k * 200 * MS, 1)).collect();
                r.send(&g);
            }
            Trace::Sawtooth => {
                let g: Vec<(i64, u32)> = (1..=6).map(|k| (k * 45 * SEC, 150)).collect();
                r.send(&g);
            }
        }
    }
}

fn replay(con: &mut redis::Connection, algo: Algo, trace: Trace) -> Counted {
    let key = format!("eb:{}:{}", algo.short(), trace.name());
    let _: i64 = redis::cmd("DEL").arg(&key).query(con).unwrap();
    let started = Instant::now();
    let mut r = Runner { con, algo, key, out: Counted::default() };
    trace.run(&mut r);
    let mut out = r.out;
    out.elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    out
}

// ---------------------------------------------------------------------------------------------
// Measurements

/// The most timestamps in any half-open window (t − 60 s, t], and the t (µs) where it is
/// reached first. Two pointers over the sorted timestamps.
fn worst_window(ts: &[i64]) -> (u64, i64) {
    let mut v = ts.to_vec();
    v.sort_unstable();
    let (mut best, mut at, mut i) = (0usize, 0i64, 0usize);
    for j in 0..v.len() {
        while v[i] <= v[j] - WINDOW_US {
            i += 1;
        }
        if j + 1 - i > best {
            best = j + 1 - i;
            at = v[j];
        }
    }
    (best as u64, at)
}

/// Brute force over every candidate right edge, to check `worst_window`.
fn worst_window_brute(ts: &[i64]) -> u64 {
    ts.iter().map(|&t| ts.iter().filter(|&&x| x > t - WINDOW_US && x <= t).count() as u64).max().unwrap_or(0)
}

/// Admitted per epoch-aligned 60 s window (the fixed window's own promise).
fn max_per_aligned_window(ts: &[i64]) -> u64 {
    let mut counts = std::collections::BTreeMap::new();
    for &t in ts {
        *counts.entry((BASE_US + t).div_euclid(WINDOW_US)).or_insert(0u64) += 1;
    }
    counts.values().copied().max().unwrap_or(0)
}

struct Row {
    algo: Algo,
    trace: Trace,
    out: Counted,
    worst: u64,
    worst_at: i64,
}

fn run_matrix(algos: &[Algo], traces: &[Trace]) -> Vec<Row> {
    let server = Server::start();
    let mut con = server.conn();
    let mut rows = Vec::new();
    for &trace in traces {
        for &algo in algos {
            let out = replay(&mut con, algo, trace);
            assert_eq!(
                out.remaining_mismatches,
                0,
                "{} on {}: a peek's `remaining` differed from what was then admitted at the same instant",
                algo.cmd,
                trace.name()
            );
            let (worst, worst_at) = worst_window(&out.admitted);
            rows.push(Row { algo, trace, out, worst, worst_at });
        }
    }
    rows
}

fn fmt_s(us: i64) -> String {
    format!("{}.{:06}", us.div_euclid(SEC), us.rem_euclid(SEC))
}

// ---------------------------------------------------------------------------------------------
// Assertions

#[test]
fn worst_window_is_half_open_and_exact() {
    assert_eq!(worst_window(&[]), (0, 0));
    // An admission exactly 60 s older than t is outside (t − 60 s, t].
    assert_eq!(worst_window(&[0, WINDOW_US]).0, 1);
    assert_eq!(worst_window(&[0, WINDOW_US - 1]).0, 2);
    assert_eq!(worst_window(&[5, 5, 5, WINDOW_US + 4, WINDOW_US + 5]).0, 4);
    // Against brute force on a pseudo-random multiset.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut ts = Vec::new();
    for _ in 0..600 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ts.push((x % 200) as i64 * SEC / 2 + (x >> 40) as i64 % 3);
    }
    assert_eq!(worst_window(&ts).0, worst_window_brute(&ts));
}

#[test]
fn slidinglog_never_exceeds_the_limit() {
    for row in run_matrix(&[SLIDINGLOG], &TRACES) {
        assert!(
            row.worst <= LIMIT,
            "RL.SLIDINGLOG admitted {} in the 60 s window ending at base+{} s on trace {} ({})",
            row.worst,
            fmt_s(row.worst_at),
            row.trace.name(),
            row.trace.describe()
        );
        assert_eq!(row.worst, worst_window_brute(&row.out.admitted));
    }
}

#[test]
fn fixed_window_doubles_at_the_boundary() {
    let rows = run_matrix(&[FIXED], &TRACES);
    for row in &rows {
        // Its own promise: at most 100 per epoch-aligned window; hence at most 200 in any 60 s.
        assert!(max_per_aligned_window(&row.out.admitted) <= LIMIT, "{}", row.trace.name());
        assert!(row.worst <= 2 * LIMIT, "{}: {}", row.trace.name(), row.worst);
    }
    let boundary = rows.iter().find(|r| r.trace == Trace::Boundary).unwrap();
    assert_eq!(boundary.out.admitted.len(), 200);
    assert!(boundary.worst >= 199, "RL.FIXED boundary worst {}", boundary.worst);
    // Both bursts (1.1 s apart) land in one 60 s window.
    assert_eq!(boundary.worst, 200);
}

#[test]
fn buckets_stay_within_burst_plus_rate() {
    let rows = run_matrix(&[GCRA, TOKENBUCKET, LEAKY, GCRA_B20, GCRA_B1, GCRA_81_B20], &TRACES);
    for row in &rows {
        // BURST + rate × 60 s.
        assert!(
            row.worst <= 200,
            "{} admitted {} in the 60 s window ending at base+{} s on trace {}",
            row.algo.cmd,
            row.worst,
            fmt_s(row.worst_at),
            row.trace.name()
        );
        // Tight for a half-open window: BURST + ⌈60 s / interval⌉ − 1 = BURST + limit − 1.
        let tight = row.algo.burst + row.algo.limit - 1;
        assert!(row.worst <= tight, "{} {}: {}", row.algo.short(), row.trace.name(), row.worst);
    }
    // GCRA, token bucket and leaky bucket share one admission model: same admissions.
    for &trace in &TRACES {
        let get = |a: Algo| &rows.iter().find(|r| r.algo == a && r.trace == trace).unwrap().out.admitted;
        assert_eq!(get(GCRA), get(TOKENBUCKET), "gcra vs tokenbucket on {}", trace.name());
        assert_eq!(get(GCRA), get(LEAKY), "gcra vs leaky on {}", trace.name());
    }
    // The edge-burst adversary reaches the tight bound. So 81 per 60 s with BURST 20 never
    // admits more than 100 in any 60 s, and BURST 1 makes 100 per 60 s exact (no burst at all).
    for row in rows.iter().filter(|r| r.trace == Trace::EdgeRetry) {
        assert_eq!(row.worst, row.algo.burst + row.algo.limit - 1, "{}", row.algo.short());
    }
}

#[test]
fn sliding_counter_stays_below_twice_the_limit() {
    let rows = run_matrix(&[SLIDING], &TRACES);
    for row in &rows {
        // prev × (60 − e)/60 + curr ≤ 100 with e < 60 s: a 60 s window holds < 2 × limit.
        assert!(row.worst < 2 * LIMIT, "{}: {}", row.trace.name(), row.worst);
    }
    let get = |t: Trace| rows.iter().find(|r| r.trace == t).unwrap().worst;
    // On the article's trace the weighted previous window (100 × 59.9/60) leaves no room at 60.1 s.
    assert_eq!(get(Trace::Boundary), 100);
    // A burst in the last µs of a window, then requests as soon as they fit: 100 + 99.
    assert_eq!(get(Trace::EdgeRetry), 199);
    assert_eq!(get(Trace::EdgeTrickle), 199);
}

/// Departure = arrival + delay_ms. Queued requests (delay > 0) leave exactly one interval
/// after the previous one; a request into an empty queue leaves on arrival, at least one
/// interval after the previous one. With arrivals off the ms grid, delay_ms is rounded up, so
/// allow < 1 ms.
fn departure_times(deps: &[(i64, i64)]) -> Vec<i64> {
    deps.iter().map(|&(a, d)| a + d * MS).collect()
}

fn check_departures(deps: &[(i64, i64)], what: &str) {
    for w in deps.windows(2) {
        let ((a0, d0), (a1, d1)) = (w[0], w[1]);
        let (dep0, dep1) = (a0 + d0 * MS, a1 + d1 * MS);
        let gap = dep1 - dep0;
        let exact = a0 % MS == 0 && a1 % MS == 0;
        let tol = if exact { 0 } else { MS - 1 };
        if d1 > 0 {
            assert!(
                (gap - INTERVAL_US).abs() <= tol,
                "{what}: queued departures {} and {} are {gap} µs apart",
                fmt_s(dep0),
                fmt_s(dep1)
            );
        } else {
            assert!(gap >= INTERVAL_US - tol, "{what}: departures {gap} µs apart");
        }
    }
}

#[test]
fn leaky_delays_space_departures_one_interval_apart() {
    let server = Server::start();
    let mut con = server.conn();
    let mut r = Runner { con: &mut con, algo: LEAKY, key: "leaky:burst".into(), out: Counted::default() };
    // 101 at one instant into an empty bucket: delays 0, 600, …, 59400 ms, then limited.
    let t0 = 59 * SEC;
    let replies = r.send(&[(t0, 101)]).pop().unwrap();
    let delays: Vec<i64> = replies.iter().map(|x| x.delay_ms.unwrap()).collect();
    let expected: Vec<i64> = (0..100).map(|k| k * 600).chain([-1]).collect();
    assert_eq!(delays, expected);
    assert_eq!(replies[100].allowed, 0);
    // Departures exactly 600 ms apart.
    let deps: Vec<i64> = r.out.departures.iter().map(|&(a, d)| a + d * MS).collect();
    assert!(deps.windows(2).all(|w| w[1] - w[0] == INTERVAL_US), "{deps:?}");
    // One interval later one more fits and queues right behind the last: leaves at t0 + 60 s.
    let next = r.send(&[(t0 + INTERVAL_US, 2)]).pop().unwrap();
    assert_eq!((next[0].allowed, next[0].delay_ms), (1, Some(59_400)));
    assert_eq!((next[1].allowed, next[1].delay_ms), (0, Some(-1)));
    check_departures(&r.out.departures, "burst");
    assert_eq!(*r.out.departures.last().unwrap(), (t0 + INTERVAL_US, 59_400));
    // And on every trace.
    drop(r);
    drop(con);
    for row in run_matrix(&[LEAKY], &TRACES) {
        assert_eq!(row.out.departures.len(), row.out.admitted.len());
        check_departures(&row.out.departures, row.trace.name());
        // Whatever was admitted, the downstream never sees more than 100 in any 60 s.
        let (worst, at) = worst_window(&departure_times(&row.out.departures));
        assert!(worst <= LIMIT, "{}: {worst} departures in the 60 s ending at base+{}", row.trace.name(), fmt_s(at));
    }
}

// ---------------------------------------------------------------------------------------------
// Memory

struct MemRow {
    algo: Algo,
    /// MEMORY USAGE after 1, 100 distinct-µs and 100 same-µs admitted requests.
    mem: [i64; 3],
    /// Bytes of the module's own encoding (the value inside DUMP) after 1 and 100 distinct-µs
    /// requests.
    encoded: [usize; 2],
}

/// A server whose DUMP payloads are not LZF-compressed, so the module's encoding can be read
/// out of them.
fn memory_server() -> Server {
    Server::start_with(Opts { extra: vec![("rdbcompression".into(), "no".into())], ..Opts::default() })
}

/// RDB length encoding (6/14/32/64-bit forms; a compressed or integer-encoded string panics).
fn rdb_len(b: &[u8], pos: &mut usize) -> usize {
    let x = b[*pos];
    *pos += 1;
    let be = |pos: &mut usize, n: usize| {
        let v = b[*pos..*pos + n].iter().fold(0u64, |acc, &y| acc << 8 | y as u64);
        *pos += n;
        v as usize
    };
    match x >> 6 {
        0 => (x & 0x3f) as usize,
        1 => ((x & 0x3f) as usize) << 8 | be(pos, 1),
        2 if x == 0x80 => be(pos, 4),
        2 if x == 0x81 => be(pos, 8),
        _ => panic!("unexpected RDB length byte {x:#x} (compressed DUMP?)"),
    }
}

/// Length of the module value's encoding inside a DUMP payload:
/// type 7 (module, v2) | module id | opcode 5 (string) | len | bytes | EOF | RDB version (2) | CRC (8).
fn encoded_len(dump: &[u8]) -> usize {
    assert_eq!(dump[0], 7, "not a module value");
    let mut pos = 1;
    rdb_len(dump, &mut pos); // module type id
    assert_eq!(rdb_len(dump, &mut pos), 5, "module opcode STRING");
    let len = rdb_len(dump, &mut pos);
    assert_eq!(pos + len + 1 + 2 + 8, dump.len(), "DUMP layout");
    len
}

/// MEMORY USAGE (SAMPLES 0) and encoded size per algorithm, on keys whose names all have the
/// same length (use a `memory_server`).
fn memory_report(con: &mut redis::Connection) -> Vec<MemRow> {
    let mut rows = Vec::new();
    for (i, &algo) in ALGOS.iter().enumerate() {
        let mut measure = |variant: &str, groups: &[(i64, u32)]| -> (i64, usize) {
            let key = format!("mem:{i}:{variant}");
            let mut r = Runner { con: &mut *con, algo, key: key.clone(), out: Counted::default() };
            let replies = r.send(groups);
            assert!(replies.iter().flatten().all(|x| x.allowed == 1), "{} {variant}", algo.cmd);
            let mem: i64 = redis::cmd("MEMORY").arg("USAGE").arg(&key).arg("SAMPLES").arg(0).query(con).unwrap();
            let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query(con).unwrap();
            (mem, encoded_len(&dump))
        };
        let one = measure("a", &[(0, 1)]);
        let distinct: Vec<(i64, u32)> = (0..100).map(|k| (k, 1)).collect();
        let hundred = measure("b", &distinct);
        let same = measure("c", &[(0, 100)]);
        rows.push(MemRow { algo, mem: [one.0, hundred.0, same.0], encoded: [one.1, hundred.1] });
    }
    rows
}

fn used_memory(con: &mut redis::Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query(con).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

/// What `n` keys holding one admitted request each really cost the server: the growth of
/// INFO used_memory divided by `n` (key, value, main and expires dict entries and tables,
/// allocator size classes). FLUSHALLs the server.
fn used_memory_per_key(con: &mut redis::Connection, algo: Algo, n: usize) -> f64 {
    let fill = |con: &mut redis::Connection, prefix: &str| {
        let _: () = redis::cmd("RL.DEBUG").arg("CLOCK").arg("SET").arg(BASE_US).query(con).unwrap();
        for chunk in (0..n).collect::<Vec<_>>().chunks(CHUNK) {
            let mut p = redis::pipe();
            for i in chunk {
                p.add_command(algo.call(&format!("{prefix}{i:08}"), 1)).ignore();
            }
            let _: () = p.query(con).unwrap();
        }
    };
    // Warm up (client buffers, allocator), then measure from an empty keyspace.
    fill(con, "w:");
    let _: () = redis::cmd("FLUSHALL").arg("SYNC").query(con).unwrap();
    let before = used_memory(con);
    fill(con, "m:");
    let dbsize: usize = redis::cmd("DBSIZE").query(con).unwrap();
    assert_eq!(dbsize, n);
    let after = used_memory(con);
    let _: () = redis::cmd("FLUSHALL").arg("SYNC").query(con).unwrap();
    (after - before) as f64 / n as f64
}

#[test]
fn memory_per_key_is_constant_but_for_the_sliding_log() {
    let server = memory_server();
    let mut con = server.conn();
    let rows = memory_report(&mut con);
    for row in &rows {
        if row.algo == SLIDINGLOG {
            // 100 entries 1 µs apart cost about 1 byte each in memory (the varint of the gap,
            // core/src/sliding_log.rs), the encoding exactly 8 each; 100 requests in one µs
            // share one entry.
            assert!(row.mem[1] - row.mem[0] >= 99, "{:?}", row.mem);
            assert!(row.mem[1] - row.mem[0] <= 2 * 99, "{:?}", row.mem);
            assert_eq!(row.encoded, [34 + 8, 34 + 100 * 8]);
            assert_eq!(row.mem[2], row.mem[0]);
        } else {
            // O(1): the count of requests does not change the size.
            assert_eq!(row.mem[0], row.mem[1], "{}", row.algo.cmd);
            assert_eq!(row.mem[0], row.mem[2], "{}", row.algo.cmd);
            assert_eq!(row.encoded[0], row.encoded[1], "{}", row.algo.cmd);
            // core/src/codec.rs: version + tag, then the fields.
            let expected = match row.algo {
                GCRA | LEAKY => 2 + 24 + 16,    // limit, period, burst; tat (i128)
                TOKENBUCKET => 2 + 24 + 16 + 8, // limit, period, burst; tokens (i128), last
                SLIDING => 2 + 16 + 8 + 8 + 8,  // limit, window; index, prev, curr
                _ => 2 + 16 + 8 + 8,            // fixed: limit, window; index, count
            };
            assert_eq!(row.encoded[0], expected, "{}", row.algo.cmd);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The table (on demand)

/// `git describe` of the tree the module was built from, noting uncommitted changes in src/.
fn source_version() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        None => "unknown (not a git checkout)".into(),
        Some(head) => {
            let dirty = git(&["status", "--porcelain", "--", "src", "Cargo.toml"]).is_some_and(|s| !s.is_empty());
            format!("commit {head}{}", if dirty { " + uncommitted changes in src/" } else { "" })
        }
    }
}

#[test]
#[ignore = "prints the effective-burst table; run with --ignored --nocapture print_table"]
fn print_table() {
    let started = Instant::now();
    let table_algos = [GCRA, TOKENBUCKET, LEAKY, SLIDING, FIXED, SLIDINGLOG, GCRA_B20, GCRA_B1, GCRA_81_B20];
    let rows = run_matrix(&table_algos, &TRACES);
    let replay_ms = started.elapsed().as_secs_f64() * 1e3;

    println!("\nEffective burst: limit 100 per 60 s, worst count of admitted requests in any 60 s window (t-60s, t].");
    println!("Produced by: {TABLE_COMMAND}");
    println!("Module source: {}", source_version());
    println!(
        "Times are seconds after an epoch-aligned base (a multiple of 60 s); a burst is n requests at the same µs.\n"
    );
    println!("Traces:");
    for t in TRACES {
        println!("  {:<20} {}", t.name(), t.describe());
    }
    println!("Algorithms:");
    for a in table_algos {
        println!("  {:<12} {}", a.short(), a.spelled());
    }
    println!();
    println!(
        "| {:<11} | {:<18} | {:>5} | {:>8} | {:>10} | {:>13} | {:>13} | {:>5} | {:>6} |",
        "algorithm", "trace", "sent", "admitted", "worst 60 s", "over promise", "worst ends at", "cmds", "ms"
    );
    println!(
        "|{:-<13}|{:-<20}|{:->7}|{:->10}|{:->12}|{:->15}|{:->15}|{:->7}|{:->8}|",
        ":", ":", ":", ":", ":", ":", ":", ":", ":"
    );
    let (mut cmds, mut rtts) = (0u64, 0u64);
    for t in TRACES {
        for row in rows.iter().filter(|r| r.trace == t) {
            let over = row.worst as i64 - LIMIT as i64;
            let over_s = format!("{over:+} ({:+.0}%)", over as f64 * 100.0 / LIMIT as f64);
            println!(
                "| {:<11} | {:<18} | {:>5} | {:>8} | {:>10} | {:>13} | {:>13} | {:>5} | {:>6.1} |",
                row.algo.short(),
                t.name(),
                row.out.sent,
                row.out.admitted.len(),
                row.worst,
                over_s,
                fmt_s(row.worst_at),
                row.out.commands,
                row.out.elapsed_ms
            );
            cmds += row.out.commands;
            rtts += row.out.round_trips;
        }
    }
    println!("\nWorst per algorithm over all traces:");
    for a in table_algos {
        let worst = rows.iter().filter(|r| r.algo == a).map(|r| r.worst).max().unwrap();
        let on: Vec<&str> = rows.iter().filter(|r| r.algo == a && r.worst == worst).map(|r| r.trace.name()).collect();
        println!("  {:<12} {:>3} ({:+}%)  on {}", a.short(), worst, worst as i64 - LIMIT as i64, on.join(", "));
    }
    println!("\nRL.LEAKY as the downstream sees it (departure = arrival + delay_ms):");
    println!(
        "| {:<18} | {:>8} | {:>18} | {:>22} | {:>13} |",
        "trace", "admitted", "worst 60 s arrivals", "worst 60 s departures", "max delay_ms"
    );
    println!("|{:-<20}|{:->10}|{:->20}|{:->24}|{:->15}|", ":", ":", ":", ":", ":");
    for row in rows.iter().filter(|r| r.algo == LEAKY) {
        let deps = departure_times(&row.out.departures);
        println!(
            "| {:<18} | {:>8} | {:>18} | {:>22} | {:>13} |",
            row.trace.name(),
            row.out.admitted.len(),
            row.worst,
            worst_window(&deps).0,
            row.out.departures.iter().map(|d| d.1).max().unwrap_or(0)
        );
    }

    println!(
        "\nReplay: {} rows, {cmds} commands in {rtts} round trips, {replay_ms:.0} ms (server start included).",
        rows.len()
    );

    // Memory per key.
    let server = memory_server();
    let mut con = server.conn();
    let version: String = redis::cmd("INFO").arg("server").query::<String>(&mut con).unwrap();
    let version = version.lines().find_map(|l| l.strip_prefix("redis_version:")).unwrap_or("?").trim().to_string();
    let mem = memory_report(&mut con);
    println!(
        "\nMemory per key (redis {version}; MEMORY USAGE key SAMPLES 0, key names of 7 bytes; \
         size_of::<State>() = {} bytes + heap):",
        std::mem::size_of::<redis_ratelimit_core::codec::State>()
    );
    println!(
        "| {:<11} | {:>14} | {:>20} | {:>18} | {:>13} | {:>14} |",
        "algorithm", "after 1 req", "after 100 (100 µs)", "after 100 (1 µs)", "encoded 1 req", "encoded 100 µs"
    );
    println!("|{:-<13}|{:->16}|{:->22}|{:->20}|{:->15}|{:->16}|", ":", ":", ":", ":", ":", ":");
    for m in &mem {
        println!(
            "| {:<11} | {:>14} | {:>20} | {:>18} | {:>13} | {:>14} |",
            m.algo.short(),
            m.mem[0],
            m.mem[1],
            m.mem[2],
            m.encoded[0],
            m.encoded[1]
        );
    }
    println!("\nServer memory per key (INFO used_memory growth / 5000 keys, one admitted request each: key name of 10 bytes,");
    println!("value, main and expires dict entries and tables, allocator size classes):");
    used_memory_per_key(&mut con, GCRA, 5_000); // a first pass reads high: discard it
    for a in ALGOS {
        println!("  {:<12} {:>6.1} bytes", a.short(), used_memory_per_key(&mut con, a, 5_000));
    }
    println!("\nTotal: {:.0} ms.", started.elapsed().as_secs_f64() * 1e3);
}
