//! Exact replies of every limiter command along scripted timelines (debug clock), RESP3
//! maps, TTLs, RL.INFO / RL.RESET, INFO counters and the `rl.limited` keyspace event.
//! The expectations come from docs (notes/semantics.md), computed by hand in the comments.

mod common;

use common::{
    clock_advance as advance, clock_set as clock, dump, exists, limiter, pexpiretime, pttl, rl_info, run,
    run_err as err, text, CellReply, LimiterReply, MultiReply, RlInfo, Server,
};
use redis::{Connection, Value};
use std::time::Duration;

/// A realistic instant (µs since the epoch); a multiple of 10 s.
const T0: i64 = 1_700_000_000_000_000;
const SEC: i64 = 1_000_000;
const MS: i64 = 1_000;
/// 100 Julian years in ms.
const CENTURY_MS: i64 = 36_525 * 86_400 * 1_000;

// ---------------------------------------------------------------- helpers

fn start() -> (Server, Connection) {
    let s = Server::start();
    let mut c = s.conn();
    clock(&mut c, T0);
    (s, c)
}

/// An integer-array reply (a limiter's, CL.THROTTLE's).
fn q(c: &mut Connection, line: &str) -> Vec<i64> {
    common::ints(run(c, line))
}

/// Runs `line` and asserts its integer reply.
#[track_caller]
fn check(c: &mut Connection, line: &str, expected: &[i64]) {
    let got = q(c, line);
    assert_eq!(got, expected, "reply of `{line}`");
}

/// Runs the lines in one MULTI/EXEC (Redis expires no key inside it: states with TTLs of a
/// few ms survive the whole timeline) and asserts each reply given (None: not checked).
#[track_caller]
fn check_atomic(c: &mut Connection, steps: &[(&str, Option<Vec<i64>>)]) {
    let mut p = redis::pipe();
    p.atomic();
    for (line, _) in steps {
        p.add_command(common::Args::cmd(*line));
    }
    let replies: Vec<Value> = p.query(c).unwrap_or_else(|e| panic!("MULTI/EXEC failed: {e}"));
    assert_eq!(replies.len(), steps.len());
    for (i, ((line, want), got)) in steps.iter().zip(replies).enumerate() {
        if let Some(want) = want {
            assert_eq!(&common::ints(got), want, "step {i}: reply of `{line}`");
        }
    }
}

fn key_type(c: &mut Connection, key: &str) -> String {
    redis::cmd("TYPE").arg(key).query(c).unwrap()
}

/// PTTL is the reply's reset_after_ms, minus the real time elapsed since the call (a loose
/// bound: other calls may have run in between; `q_pttl` checks it tightly).
/// The TTL covers reset_after_ms and, when the call extended it, at most half as much again
/// (TTLs grow in steps of 1.5 × reset_after; see docs/commands.md).
#[track_caller]
fn assert_pttl(c: &mut Connection, key: &str, reset_ms: i64) {
    let p = pttl(c, key);
    assert!(p <= ttl_step(reset_ms) && p >= reset_ms - 250, "PTTL of {key} is {p}, reset_after_ms was {reset_ms}");
}

/// The TTL an admitted call sets when the key's expiry falls short of its reset_after.
fn ttl_step(reset_ms: i64) -> i64 {
    let r = reset_ms.max(1);
    r + r / 2
}

/// Runs `line` and `PTTL key` back to back in one MULTI/EXEC: (reply, PTTL).
fn q_pttl(c: &mut Connection, line: &str, key: &str) -> (Value, i64) {
    redis::pipe().atomic().add_command(common::Args::cmd(line)).cmd("PTTL").arg(key).query(c).unwrap()
}

/// [`q_pttl`] of a limiter command.
fn q_pttl_limiter(c: &mut Connection, line: &str, key: &str) -> (LimiterReply, i64) {
    let (v, p) = q_pttl(c, line, key);
    (LimiterReply::of(&v), p)
}

/// The TTL after an admitted call is never shorter than its reset_after_ms and at most one
/// step (1.5 ×) longer (slack: a loaded machine may pause the server for a few ms between the
/// two commands; and PTTL inside MULTI may measure from the time EXEC started, which newer
/// servers cache, a millisecond or two before the module read the clock).
#[track_caller]
fn assert_covering_pttl(p: i64, reset_ms: i64, line: &str) {
    assert!(p <= ttl_step(reset_ms) + 5 && p >= reset_ms - 25, "`{line}`: PTTL {p}, reset_after_ms {reset_ms}");
}

/// A RESP3 limiter reply: a map whose keys are the reply's field names, in order.
fn resp3_limiter(v: Value) -> LimiterReply {
    assert!(matches!(v, Value::Map(_)), "expected a RESP3 map, got {v:?}");
    LimiterReply::of(&v)
}

/// Asserts RL.INFO's fields (names in order, values exactly), ttl_ms approximately.
#[track_caller]
fn assert_info(c: &mut Connection, key: &str, algorithm: &str, fields: &[(&str, i64)]) {
    // RL.INFO and PTTL back to back in one MULTI/EXEC, so ttl_ms can be compared tightly.
    let (info, p): (Value, i64) = redis::pipe().atomic().cmd("RL.INFO").arg(key).cmd("PTTL").arg(key).query(c).unwrap();
    let info = RlInfo::of(&info).unwrap_or_else(|| panic!("RL.INFO {key} is nil"));
    let mut want: Vec<&str> = vec!["algorithm"];
    want.extend(fields.iter().map(|(n, _)| *n));
    want.push("ttl_ms");
    assert_eq!(info.names(), want, "RL.INFO {key} field names");
    assert_eq!(info.algorithm(), algorithm, "RL.INFO {key} algorithm");
    for (name, v) in fields {
        assert_eq!(info.get(name), Some(&Value::Int(*v)), "RL.INFO {key} field {name}");
    }
    let Some(&Value::Int(ttl)) = info.get("ttl_ms") else { panic!("ttl_ms not an integer: {info:?}") };
    assert!((ttl - p).abs() <= 25, "RL.INFO {key} ttl_ms {ttl} vs PTTL {p}");
}

fn resp3_conn(s: &Server) -> Connection {
    let mut c = s.conn();
    let hello: Value = redis::cmd("HELLO").arg(3).query(&mut c).unwrap();
    let Value::Map(m) = hello else { panic!("HELLO 3 reply {hello:?}") };
    assert!(m.iter().any(|(k, v)| text(k) == "proto" && *v == Value::Int(3)), "HELLO 3: {m:?}");
    c
}

// ---------------------------------------------------------------- GCRA / token bucket

#[test]
fn gcra_and_tokenbucket_documented_example() {
    let (_s, mut c) = start();
    for cmd in ["RL.GCRA", "RL.TOKENBUCKET"] {
        clock(&mut c, T0);
        let k = format!("ex:{cmd}");
        let line = format!("{cmd} {k} 1 1s BURST 5");
        let cost6 = format!("{line} COST 6");
        check(&mut c, &cost6, &[0, 5, 5, -1, 0]);
        assert!(!exists(&mut c, &k), "{cmd}: a limited call on a fresh key must not create it");
        // One MULTI/EXEC: the first state's TTL is 1 s of real time, which must not matter.
        let mut steps: Vec<(&str, Option<Vec<i64>>)> =
            (1..=5).map(|i| (line.as_str(), Some(vec![1, 5, 5 - i, -1, 1000 * i]))).collect();
        steps.push((&line, Some(vec![0, 5, 0, 1000, 5000])));
        steps.push(("RL.DEBUG CLOCK ADVANCE 3000000", None));
        steps.push((&line, Some(vec![1, 5, 2, -1, 3000])));
        steps.push(("RL.DEBUG CLOCK ADVANCE 100000", None));
        steps.push((&line, Some(vec![1, 5, 1, -1, 3900])));
        check_atomic(&mut c, &steps);
        // The TTL covers the last reset_after (3.9 s); it was last extended for the 5 s one
        // (the debug clock moved, the server's real clock hardly did).
        let p = pttl(&mut c, &k);
        assert!(p >= 3900 - 250 && p <= ttl_step(5000), "{cmd}: PTTL {p}");
    }
}

#[test]
fn gcra_and_tokenbucket_identical_on_a_timeline() {
    let (_s, mut c) = start();
    // limit 3 per 10 s (interval 3333.33.. ms), BURST 4; a mixed timeline.
    let steps: &[(i64, &str)] = &[
        (0, "COST 2"),
        (0, "COST 3"),
        (0, "COST 2 PARTIAL"),
        (SEC, ""),
        (2_500 * MS, ""),
        (1, "COST 0"),
        (10 * SEC, "COST 4"),
        (20 * SEC, "COST 4"),
        (7, "COST 5"),
        (0, "COST 9 PARTIAL"),
        (3_333_333, ""),
        (1, ""),
    ];
    let mut a = Vec::new();
    let mut b = Vec::new();
    for (cmd, out) in [("RL.GCRA", &mut a), ("RL.TOKENBUCKET", &mut b)] {
        clock(&mut c, T0);
        for (dt, opts) in steps {
            advance(&mut c, *dt);
            out.push(q(&mut c, &format!("{cmd} tl:{cmd} 3 10s BURST 4 {opts}")));
        }
    }
    assert_eq!(a, b, "RL.GCRA and RL.TOKENBUCKET replies differ");
    // Spot checks: interval 3333.33.. ms.
    assert_eq!(a[0], vec![2, 4, 2, -1, 6667]);
    assert_eq!(a[1], vec![0, 4, 2, 3334, 6667]);
    assert_eq!(a[2], vec![2, 4, 0, -1, 13_334]);
}

#[test]
fn burst_sets_how_many_pass_at_once() {
    let (_s, mut c) = start();
    for cmd in ["RL.GCRA", "RL.TOKENBUCKET", "RL.LEAKY"] {
        clock(&mut c, T0);
        let leaky = cmd == "RL.LEAKY";
        let r = |v: &[i64], delay: i64| {
            let mut v = v.to_vec();
            if leaky {
                v.push(delay);
            }
            v
        };
        // BURST above the limit: 3 at once, then one per second.
        let line = format!("{cmd} b1:{cmd} 1 1s BURST 3");
        check_atomic(
            &mut c,
            &[
                (&line, Some(r(&[1, 3, 2, -1, 1000], 0))),
                (&line, Some(r(&[1, 3, 1, -1, 2000], 1000))),
                (&line, Some(r(&[1, 3, 0, -1, 3000], 2000))),
                (&line, Some(r(&[0, 3, 0, 1000, 3000], -1))),
            ],
        );
        // BURST below the limit: 10 per 10 s but only 2 at once.
        let line = format!("{cmd} b2:{cmd} 10 10s BURST 2");
        check(&mut c, &line, &r(&[1, 2, 1, -1, 1000], 0));
        check(&mut c, &line, &r(&[1, 2, 0, -1, 2000], 1000));
        check(&mut c, &line, &r(&[0, 2, 0, 1000, 2000], -1));
        // COST above BURST can never be admitted.
        check(&mut c, &format!("{cmd} b3:{cmd} 10 1s BURST 2 COST 3"), &r(&[0, 2, 2, -1, 0], -1));
        // The default BURST is the limit.
        check(&mut c, &format!("{cmd} b4:{cmd} 4 1s COST 4"), &r(&[4, 4, 0, -1, 1000], 0));
    }
}

// ---------------------------------------------------------------- leaky bucket

#[test]
fn leaky_delays_and_full_queue() {
    let (_s, mut c) = start();
    // (Intervals of seconds, not ms: the key's TTL runs on the real clock, and a state that
    // expires between two calls would make the timeline depend on the machine's speed.)
    // 10 per 10 s: interval 1 s; queue depth (BURST) 3.
    let line = "RL.LEAKY lq 10 10s BURST 3";
    check(&mut c, line, &[1, 3, 2, -1, 1000, 0]);
    check(&mut c, line, &[1, 3, 1, -1, 2000, 1000]);
    check(&mut c, line, &[1, 3, 0, -1, 3000, 2000]);
    check(&mut c, line, &[0, 3, 0, 1000, 3000, -1]);
    assert_pttl(&mut c, "lq", 3000);
    advance(&mut c, 1000 * MS);
    check(&mut c, line, &[1, 3, 0, -1, 3000, 2000]);
    check(&mut c, line, &[0, 3, 0, 1000, 3000, -1]);
    // The queue drains at T0+4 s; 1 ms before a slot frees up (T0+2 s) it is still full.
    advance(&mut c, 999 * MS);
    check(&mut c, line, &[0, 3, 0, 1, 2001, -1]);
    advance(&mut c, 2001 * MS);
    check(&mut c, line, &[1, 3, 2, -1, 1000, 0]);

    // An interval that is not a whole number of ms: 3 per 10 s → 3333.33.. ms, rounded up.
    clock(&mut c, T0);
    let line = "RL.LEAKY lr 3 10s";
    check(&mut c, line, &[1, 3, 2, -1, 3334, 0]);
    check(&mut c, line, &[1, 3, 1, -1, 6667, 3334]);
    check(&mut c, line, &[1, 3, 0, -1, 10_000, 6667]);
    check(&mut c, line, &[0, 3, 0, 3334, 10_000, -1]);

    // COST n waits behind what is queued; the delay is that of its first unit.
    clock(&mut c, T0);
    let line = "RL.LEAKY lc 10 10s BURST 5 COST 2";
    check(&mut c, line, &[2, 5, 3, -1, 2000, 0]);
    check(&mut c, line, &[2, 5, 1, -1, 4000, 2000]);
    check(&mut c, line, &[0, 5, 1, 1000, 4000, -1]);
    check(&mut c, &format!("{line} PARTIAL"), &[1, 5, 0, -1, 5000, 4000]);
    check(&mut c, &format!("{line} PARTIAL"), &[0, 5, 0, 1000, 5000, -1]);
}

// ---------------------------------------------------------------- sliding window counter

#[test]
fn sliding_documented_example() {
    let (_s, mut c) = start();
    let w = 60 * SEC;
    let cur = 1_700_000_040_000_000; // a multiple of 60 s
    assert_eq!(cur % w, 0);
    let prev = cur - w;
    let line = "RL.SLIDING sl 100 60s";
    // 80 requests in the previous window, from 30 s in, 100 ms apart.
    clock(&mut c, prev + 30 * SEC);
    for k in 1..=80 {
        // reset: end of the window after the current one (prev + 120 s).
        let reset = 90_000 - (k - 1) * 100;
        check(&mut c, line, &[1, 100, 100 - k, -1, reset]);
        advance(&mut c, 100 * MS);
    }
    // 30 in the current window, 10 s in: estimate = 80×50/60 + k, remaining = ⌊33.33 − k⌋.
    clock(&mut c, cur + 10 * SEC);
    for k in 1..=30 {
        check(&mut c, line, &[1, 100, 33 - k, -1, 110_000]);
    }
    // 15 s in: 80×45/60 + 30 = 90; admitted, remaining ⌊100 − 60 − 31⌋ = 9.
    clock(&mut c, cur + 15 * SEC);
    check(&mut c, line, &[1, 100, 9, -1, 105_000]);
    assert_info(
        &mut c,
        "sl",
        "sliding",
        &[
            ("limit", 100),
            ("window_us", w),
            ("window_start_us", cur),
            ("previous", 80),
            ("current", 31),
            ("estimate", 91),
        ],
    );
    for k in 1..=9 {
        check(&mut c, line, &[1, 100, 9 - k, -1, 105_000]);
    }
    // Full (60 + 40 = 100): one more fits when 80×(45 − t)/60 ≤ 59, i.e. after t = 0.75 s.
    check(&mut c, line, &[0, 100, 0, 750, 105_000]);
    check(&mut c, &format!("{line} COST 0"), &[0, 100, 0, -1, 105_000]);
    advance(&mut c, 750 * MS - 1);
    check(&mut c, line, &[0, 100, 0, 1, 104_251]);
    advance(&mut c, 1);
    check(&mut c, line, &[1, 100, 0, -1, 104_250]);
    assert_pttl(&mut c, "sl", 104_250);
}

#[test]
fn sliding_window_boundaries() {
    let (_s, mut c) = start();
    // limit 4 window 10 s (T0 is a window start).
    let line = "RL.SLIDING sw 4 10s";
    check(&mut c, &format!("{line} COST 4"), &[4, 4, 0, -1, 20_000]);
    check(&mut c, line, &[0, 4, 0, 10_000 + 2_500, 20_000]);
    // Next window start: prev 4 weighs 4×(10−e)/10; 1 more fits after e = 2.5 s.
    clock(&mut c, T0 + 10 * SEC);
    check(&mut c, line, &[0, 4, 0, 2_500, 10_000]);
    clock(&mut c, T0 + 12_500 * MS);
    check(&mut c, line, &[1, 4, 0, -1, 17_500]);
    // Two windows later nothing counts any more.
    clock(&mut c, T0 + 30 * SEC);
    check(&mut c, &format!("{line} COST 0"), &[0, 4, 4, -1, 0]);
    check(&mut c, &format!("{line} COST 5"), &[0, 4, 4, -1, 0]);
}

// ---------------------------------------------------------------- fixed window

#[test]
fn fixed_window_admits_the_limit_per_window_then_starts_from_zero() {
    let (_s, mut c) = start();
    // limit 3 window 10 s; T0 is a window start.
    clock(&mut c, T0 + 2 * SEC);
    let line = "RL.FIXED fx 3 10s";
    check(&mut c, line, &[1, 3, 2, -1, 8000]);
    check(&mut c, line, &[1, 3, 1, -1, 8000]);
    check(&mut c, line, &[1, 3, 0, -1, 8000]);
    assert_pttl(&mut c, "fx", 8000);
    clock(&mut c, T0 + 4 * SEC);
    for _ in 0..5 {
        check(&mut c, line, &[0, 3, 0, 6000, 6000]);
    }
    assert_info(&mut c, "fx", "fixed", &[("limit", 3), ("window_us", 10 * SEC), ("window_start_us", T0), ("count", 3)]);
    clock(&mut c, T0 + 10 * SEC - 500);
    check(&mut c, line, &[0, 3, 0, 1, 1]);
    // The next window starts from zero.
    clock(&mut c, T0 + 10 * SEC);
    check(&mut c, line, &[1, 3, 2, -1, 10_000]);
    check(&mut c, &format!("{line} COST 3"), &[0, 3, 2, 10_000, 10_000]);
    check(&mut c, &format!("{line} COST 4"), &[0, 3, 2, -1, 10_000]);
    check(&mut c, &format!("{line} COST 2"), &[2, 3, 0, -1, 10_000]);
}

#[test]
fn fixed_window_does_not_count_limited_calls() {
    let (_s, mut c) = start();
    // Limited calls are not counted: 1 admitted, COST 3 refused 5 times, 2 still fit.
    clock(&mut c, T0 + 20 * SEC);
    let line = "RL.FIXED fy 3 10s";
    check(&mut c, line, &[1, 3, 2, -1, 10_000]);
    for _ in 0..5 {
        check(&mut c, &format!("{line} COST 3"), &[0, 3, 2, 10_000, 10_000]);
    }
    check(&mut c, &format!("{line} COST 2"), &[2, 3, 0, -1, 10_000]);
    // A fresh key that is refused stays missing.
    check(&mut c, "RL.FIXED fz 3 10s COST 4", &[0, 3, 3, -1, 0]);
    assert!(!exists(&mut c, "fz"));
}

#[test]
fn fixed_window_partial_grants_what_is_left() {
    let (_s, mut c) = start();
    // limit 3 window 10 s, 5 s before the window's end.
    clock(&mut c, T0 + 35 * SEC);
    let line = "RL.FIXED fy 3 10s";
    check(&mut c, &format!("{line} COST 2"), &[2, 3, 1, -1, 5_000]);
    check(&mut c, &format!("{line} COST 2 PARTIAL"), &[1, 3, 0, -1, 5_000]);
    check(&mut c, &format!("{line} COST 2 PARTIAL"), &[0, 3, 0, 5_000, 5_000]);
}

// ---------------------------------------------------------------- sliding log

#[test]
fn sliding_log_exact_edges() {
    let (_s, mut c) = start();
    let line = "RL.SLIDINGLOG lg 3 10s";
    check(&mut c, line, &[1, 3, 2, -1, 10_000]);
    clock(&mut c, T0 + SEC);
    check(&mut c, line, &[1, 3, 1, -1, 10_000]);
    clock(&mut c, T0 + 2 * SEC);
    check(&mut c, line, &[1, 3, 0, -1, 10_000]);
    // Full: the entry at T0 leaves at T0+10 s; the newest (T0+2 s) at T0+12 s.
    clock(&mut c, T0 + 5 * SEC);
    check(&mut c, line, &[0, 3, 0, 5_000, 7_000]);
    clock(&mut c, T0 + 10 * SEC - 1);
    check(&mut c, line, &[0, 3, 0, 1, 2_001]);
    assert_info(
        &mut c,
        "lg",
        "slidinglog",
        &[
            ("limit", 3),
            ("window_us", 10 * SEC),
            ("entries", 3),
            ("units", 3),
            ("in_window", 3),
            ("oldest_us", T0),
            ("newest_us", T0 + 2 * SEC),
        ],
    );
    // Exactly one window after T0 that entry no longer counts.
    clock(&mut c, T0 + 10 * SEC);
    check(&mut c, &format!("{line} COST 0"), &[0, 3, 1, -1, 2_000]);
    check(&mut c, line, &[1, 3, 0, -1, 10_000]);
    assert_pttl(&mut c, "lg", 10_000);
    // COST 2 needs the T0+1 s and T0+2 s entries gone: 2 s; PARTIAL needs one: 1 s.
    check(&mut c, &format!("{line} COST 2"), &[0, 3, 0, 2_000, 10_000]);
    check(&mut c, &format!("{line} COST 2 PARTIAL"), &[0, 3, 0, 1_000, 10_000]);
    check(&mut c, &format!("{line} COST 4"), &[0, 3, 0, -1, 10_000]);
    clock(&mut c, T0 + 11 * SEC);
    check(&mut c, &format!("{line} COST 2 PARTIAL"), &[1, 3, 0, -1, 10_000]);
    clock(&mut c, T0 + 12 * SEC);
    check(&mut c, &format!("{line} COST 2 PARTIAL"), &[1, 3, 0, -1, 10_000]);
    // Entries at T0+10 s, T0+11 s, T0+12 s (1 each): 2 units free at T0+21 s.
    check(&mut c, &format!("{line} COST 2"), &[0, 3, 0, 9_000, 10_000]);
    clock(&mut c, T0 + 21 * SEC);
    check(&mut c, &format!("{line} COST 2"), &[2, 3, 0, -1, 10_000]);
}

// ---------------------------------------------------------------- COST 0, DRYRUN, PARTIAL

const ALGOS: [(&str, &str); 6] = [
    ("RL.GCRA", "gcra"),
    ("RL.TOKENBUCKET", "tokenbucket"),
    ("RL.LEAKY", "leaky"),
    ("RL.SLIDING", "sliding"),
    ("RL.FIXED", "fixed"),
    ("RL.SLIDINGLOG", "slidinglog"),
];

fn with_delay(cmd: &str, mut v: Vec<i64>, delay: i64) -> Vec<i64> {
    if cmd == "RL.LEAKY" {
        v.push(delay);
    }
    v
}

#[test]
fn peek_and_dryrun_write_nothing() {
    let (_s, mut c) = start();
    for (cmd, _) in ALGOS {
        // limit 5 per 10 s: interval 2 s for the rate-based ones; T0 is a window start.
        let k = format!("pk:{cmd}");
        let rate = matches!(cmd, "RL.GCRA" | "RL.TOKENBUCKET" | "RL.LEAKY");
        let line = format!("{cmd} {k} 5 10s");
        // A peek on a missing key.
        check(&mut c, &format!("{line} COST 0"), &with_delay(cmd, vec![0, 5, 5, -1, 0], -1));
        assert!(!exists(&mut c, &k), "{cmd}: COST 0 created the key");
        // DRYRUN on a missing key: the admitted reply, nothing stored.
        let dry_reset = if rate {
            4000
        } else if cmd == "RL.FIXED" {
            10_000
        } else if cmd == "RL.SLIDING" {
            20_000
        } else {
            10_000
        };
        check(&mut c, &format!("{line} COST 2 DRYRUN"), &with_delay(cmd, vec![2, 5, 3, -1, dry_reset], 0));
        assert!(!exists(&mut c, &k), "{cmd}: DRYRUN created the key");
        // Store a state, then peek / dry-run against it.
        check(&mut c, &format!("{line} COST 2"), &with_delay(cmd, vec![2, 5, 3, -1, dry_reset], 0));
        let before = dump(&mut c, &k).expect("key stored");
        let expiry_before = pexpiretime(&mut c, &k);
        check(&mut c, &format!("{line} COST 0"), &with_delay(cmd, vec![0, 5, 3, -1, dry_reset], -1));
        let dry = if rate { vec![3, 5, 0, -1, 10_000] } else { vec![3, 5, 0, -1, dry_reset] };
        check(&mut c, &format!("{line} DRYRUN COST 3"), &with_delay(cmd, dry, 4000));
        check(&mut c, &format!("{line} COST 9 DRYRUN"), &with_delay(cmd, vec![0, 5, 3, -1, dry_reset], -1));
        check(
            &mut c,
            &format!("{line} COST 4 DRYRUN PARTIAL"),
            &with_delay(cmd, vec![3, 5, 0, -1, if rate { 10_000 } else { dry_reset }], 4000),
        );
        assert_eq!(dump(&mut c, &k).as_ref(), Some(&before), "{cmd}: peek/DRYRUN changed the state");
        assert_eq!(pexpiretime(&mut c, &k), expiry_before, "{cmd}: peek/DRYRUN moved the expiry");
        // Still 3 left.
        check(&mut c, &format!("{line} COST 0"), &with_delay(cmd, vec![0, 5, 3, -1, dry_reset], -1));
        // PARTIAL grants the 3 that are left, then nothing until one unit is free.
        let full_reset = if rate { 10_000 } else { dry_reset };
        check(&mut c, &format!("{line} COST 5 PARTIAL"), &with_delay(cmd, vec![3, 5, 0, -1, full_reset], 4000));
        // One unit: rate-based after one interval (2 s); fixed at the window end; the log when
        // the T0 entry leaves (10 s); sliding when 5×(10−e)/10 + 1 ≤ 5 in the next window (e = 2 s).
        let retry_one = match cmd {
            "RL.GCRA" | "RL.TOKENBUCKET" | "RL.LEAKY" => 2000,
            "RL.SLIDING" => 12_000,
            _ => 10_000,
        };
        check(&mut c, &format!("{line} COST 5 PARTIAL"), &with_delay(cmd, vec![0, 5, 0, retry_one, full_reset], -1));
    }
}

#[test]
fn limited_calls_write_nothing() {
    let (_s, mut c) = start();
    for (cmd, _) in ALGOS {
        let k = format!("lim:{cmd}");
        let r = limiter(&mut c, &format!("{cmd} {k} 3 1h COST 3"));
        assert_eq!((r.allowed, r.limit, r.remaining), (3, 3, 0), "{cmd}");
        let state = dump(&mut c, &k);
        let at = pexpiretime(&mut c, &k);
        for (dt, opts) in [(0, ""), (SEC, "COST 2"), (0, "COST 5"), (MS, "PARTIAL COST 2"), (0, "COST 1 DRYRUN")] {
            advance(&mut c, dt);
            let r = limiter(&mut c, &format!("{cmd} {k} 3 1h {opts}"));
            assert_eq!((r.allowed, r.limit, r.remaining), (0, 3, 0), "{cmd} {opts}: {r:?}");
        }
        assert_eq!(dump(&mut c, &k), state, "{cmd}: a limited call changed the state");
        let at2 = pexpiretime(&mut c, &k);
        assert_eq!(at, at2, "{cmd}: a limited call moved the expiry");
        clock(&mut c, T0);
    }
}

// ---------------------------------------------------------------- parameter changes

#[test]
fn parameter_change_never_exceeds_new_capacity() {
    let (_s, mut c) = start();
    for (cmd, _) in ALGOS {
        clock(&mut c, T0);
        let k = format!("pc:{cmd}");
        let rate = matches!(cmd, "RL.GCRA" | "RL.TOKENBUCKET" | "RL.LEAKY");
        // 2 of 10 used.
        let r = limiter(&mut c, &format!("{cmd} {k} 10 10s COST 2"));
        assert_eq!((r.allowed, r.limit, r.remaining), (2, 10, 8), "{cmd}");
        // Now limit 3: at most 3 (GCRA, token bucket: the 8 tokens are capped at 3; the leaky
        // bucket keeps its 2 s of queue, 0.6 of the new 3.3 s interval, so 2 more fit; windows:
        // 3 − 2 = 1).
        let leaky = cmd == "RL.LEAKY";
        let r = limiter(&mut c, &format!("{cmd} {k} 3 10s COST 0"));
        let left = match (leaky, rate) {
            (true, _) => 2,
            (false, true) => 3,
            (false, false) => 1,
        };
        assert_eq!((r.allowed, r.limit, r.remaining), (0, 3, left), "{cmd} after lowering the limit: {r:?}");
        // Limit 1: windows have no room left at all; the leaky bucket's queue drains in 2 s.
        let r = limiter(&mut c, &format!("{cmd} {k} 1 10s"));
        if leaky {
            assert_eq!((r.allowed, r.limit, r.remaining, r.retry_after_ms), (0, 1, 0, 2000), "{cmd} limit 1: {r:?}");
        } else if rate {
            assert_eq!((r.allowed, r.limit, r.remaining, r.retry_after_ms), (1, 1, 0, -1), "{cmd} limit 1: {r:?}");
        } else {
            assert_eq!((r.allowed, r.limit, r.remaining), (0, 1, 0), "{cmd} limit 1: {r:?}");
        }
        // Whatever changes, remaining never exceeds the capacity.
        for (dt, params) in [
            (0, "50 10s"),
            (SEC, "2 1s"),
            (3 * SEC, "7 1m"),
            (0, "4 5s"),
            (700 * MS, "1 1h"),
            (0, "100 10s"),
            (11 * SEC, "6 10s"),
        ] {
            advance(&mut c, dt);
            let limit: i64 = params.split(' ').next().unwrap().parse().unwrap();
            for extra in ["COST 0", "", "COST 3 PARTIAL"] {
                let r = limiter(&mut c, &format!("{cmd} {k} {params} {extra}"));
                assert_eq!(r.limit, limit, "{cmd} {params} {extra}: {r:?}");
                assert!(
                    r.remaining >= 0 && r.remaining <= limit,
                    "{cmd} {params} {extra}: remaining {} above {limit}",
                    r.remaining
                );
                assert!(
                    r.allowed + r.remaining <= limit,
                    "{cmd} {params} {extra}: allowed+remaining above {limit}: {r:?}"
                );
            }
        }
    }
    // BURST lowered on a live bucket.
    clock(&mut c, T0);
    for cmd in ["RL.GCRA", "RL.TOKENBUCKET", "RL.LEAKY"] {
        let k = format!("pb:{cmd}");
        let r = limiter(&mut c, &format!("{cmd} {k} 10 10s BURST 20 COST 5"));
        assert_eq!((r.allowed, r.limit, r.remaining), (5, 20, 15));
        if cmd == "RL.LEAKY" {
            // The leaky bucket keeps its 5 s of queue, deeper than BURST 4 allows: nothing fits
            // until it has drained to 4 s, and 4 more only when it has drained.
            let r = limiter(&mut c, &format!("{cmd} {k} 10 10s BURST 4 COST 0"));
            assert_eq!((r.allowed, r.limit, r.remaining, r.retry_after_ms), (0, 4, 0, -1), "{cmd}");
            let r = limiter(&mut c, &format!("{cmd} {k} 10 10s BURST 4 COST 4"));
            assert_eq!((r.allowed, r.limit, r.remaining, r.retry_after_ms), (0, 4, 0, 5000), "{cmd}");
            let r = limiter(&mut c, &format!("{cmd} {k} 10 10s BURST 4"));
            assert_eq!((r.allowed, r.limit, r.remaining, r.retry_after_ms), (0, 4, 0, 2000), "{cmd}");
            advance(&mut c, 5 * SEC);
            let r = limiter(&mut c, &format!("{cmd} {k} 10 10s BURST 4 COST 4"));
            assert_eq!((r.allowed, r.limit, r.remaining, r.retry_after_ms), (4, 4, 0, -1), "{cmd} once drained");
            assert_eq!(r.delay_ms, Some(0), "{cmd} once drained");
            continue;
        }
        let r = limiter(&mut c, &format!("{cmd} {k} 10 10s BURST 4 COST 0"));
        assert_eq!((r.allowed, r.limit, r.remaining, r.retry_after_ms), (0, 4, 4, -1), "{cmd}");
        let r = limiter(&mut c, &format!("{cmd} {k} 10 10s BURST 4 COST 4"));
        assert_eq!((r.allowed, r.limit, r.remaining, r.retry_after_ms), (4, 4, 0, -1), "{cmd}");
        let r = limiter(&mut c, &format!("{cmd} {k} 10 10s BURST 4"));
        assert_eq!((r.allowed, r.limit, r.remaining, r.retry_after_ms), (0, 4, 0, 1000), "{cmd}");
    }
}

// ---------------------------------------------------------------- extreme rates

#[test]
fn a_billion_per_second_is_exact_to_the_unit() {
    let (_s, mut c) = start();
    let g = 1_000_000_000i64;
    // (Resets of 1 s: each timeline runs in one MULTI/EXEC, so the TTL cannot interfere.)
    for cmd in ["RL.GCRA", "RL.TOKENBUCKET", "RL.LEAKY"] {
        clock(&mut c, T0);
        let line = format!("{cmd} bn:{cmd} 1000000000 1s");
        let (c1e9, c1001, c1000) =
            (format!("{line} COST 1000000000"), format!("{line} COST 1001"), format!("{line} COST 1000"));
        check_atomic(
            &mut c,
            &[
                (&c1e9, Some(with_delay(cmd, vec![g, g, 0, -1, 1000], 0))),
                // Same µs: one more unit is 1 ns away, reported as 1 ms.
                (&line, Some(with_delay(cmd, vec![0, g, 0, 1, 1000], -1))),
                ("RL.DEBUG CLOCK ADVANCE 1", None),
                // 1 µs refills exactly 1000 units.
                (&c1001, Some(with_delay(cmd, vec![0, g, 1000, 1, 1000], -1))),
                (&c1000, Some(with_delay(cmd, vec![1000, g, 0, -1, 1000], 1000))),
                (&line, Some(with_delay(cmd, vec![0, g, 0, 1, 1000], -1))),
            ],
        );
        assert_pttl(&mut c, &format!("bn:{cmd}"), 1000);
    }
    // Windows: the whole limit in one µs, then nothing.
    clock(&mut c, T0);
    check_atomic(
        &mut c,
        &[
            ("RL.FIXED bn:f 1000000000 1s COST 1000000000", Some(vec![g, g, 0, -1, 1000])),
            ("RL.FIXED bn:f 1000000000 1s", Some(vec![0, g, 0, 1000, 1000])),
            ("RL.SLIDINGLOG bn:l 1000000000 1s COST 1000000000", Some(vec![g, g, 0, -1, 1000])),
            ("RL.SLIDINGLOG bn:l 1000000000 1s", Some(vec![0, g, 0, 1000, 1000])),
            ("RL.SLIDING bn:s 1000000000 1s COST 1000000000", Some(vec![g, g, 0, -1, 2000])),
            // Next window + 1 ns: 1e9 × (1 s − 1 ns)/1 s + 1 ≤ 1e9.
            ("RL.SLIDING bn:s 1000000000 1s", Some(vec![0, g, 0, 1001, 2000])),
        ],
    );
}

#[test]
fn one_per_century_waits_exactly_a_century() {
    let (_s, mut c) = start();
    for cmd in ["RL.GCRA", "RL.TOKENBUCKET", "RL.LEAKY", "RL.SLIDINGLOG"] {
        let k = format!("cy:{cmd}");
        let line = format!("{cmd} {k} 1 36525d");
        check(&mut c, &line, &with_delay(cmd, vec![1, 1, 0, -1, CENTURY_MS], 0));
        check(&mut c, &line, &with_delay(cmd, vec![0, 1, 0, CENTURY_MS, CENTURY_MS], -1));
        assert_pttl(&mut c, &k, CENTURY_MS);
        advance(&mut c, CENTURY_MS * MS - 1);
        check(&mut c, &line, &with_delay(cmd, vec![0, 1, 0, 1, 1], -1));
        advance(&mut c, 1);
        check(&mut c, &line, &with_delay(cmd, vec![1, 1, 0, -1, CENTURY_MS], 0));
        clock(&mut c, T0);
    }
    // Epoch-aligned 100-year windows: T0 lies in the first one, which ends at 36525 days.
    let to_end = CENTURY_MS - T0 / MS;
    check(&mut c, "RL.FIXED cy:f 1 36525d", &[1, 1, 0, -1, to_end]);
    check(&mut c, "RL.FIXED cy:f 1 36525d", &[0, 1, 0, to_end, to_end]);
    assert_pttl(&mut c, "cy:f", to_end);
    check(&mut c, "RL.SLIDING cy:s 1 36525d", &[1, 1, 0, -1, to_end + CENTURY_MS]);
    let r = limiter(&mut c, "RL.SLIDING cy:s 1 36525d");
    assert_eq!((r.allowed, r.limit, r.remaining), (0, 1, 0));
    assert_eq!(r.reset_after_ms, to_end + CENTURY_MS);
    assert!(r.retry_after_ms > to_end, "retry {} must reach into the next window", r.retry_after_ms);
    // Same expressed in other units.
    check(&mut c, "RL.GCRA cy:h 1 876600h", &[1, 1, 0, -1, CENTURY_MS]);
    check(&mut c, "RL.GCRA cy:h 1 3155760000s", &[0, 1, 0, CENTURY_MS, CENTURY_MS]);
}

// ---------------------------------------------------------------- CL.THROTTLE

#[test]
fn cl_throttle_reply_model() {
    let (_s, mut c) = start();
    // max_burst 4 → limit 5, 1 per 10 s.
    for i in 0..5 {
        check(&mut c, "CL.THROTTLE ct 4 1 10", &[0, 5, 4 - i, -1, 10 * (i + 1)]);
    }
    check(&mut c, "CL.THROTTLE ct 4 1 10", &[1, 5, 0, 10, 50]);
    assert_eq!(key_type(&mut c, "ct"), "ratelimit");
    assert_eq!(rl_info(&mut c, "ct").unwrap().algorithm(), "gcra");
    assert_pttl(&mut c, "ct", 50_000);
    // The same model as RL.GCRA key count period BURST max_burst+1 (and the same key type).
    clock(&mut c, T0);
    for _ in 0..5 {
        q(&mut c, "RL.GCRA ctg 1 10s BURST 5");
    }
    check(&mut c, "RL.GCRA ctg 1 10s BURST 5", &[0, 5, 0, 10_000, 50_000]);
    check(&mut c, "CL.THROTTLE ctg 4 1 10", &[1, 5, 0, 10, 50]);
    assert_eq!(dump(&mut c, "ct"), dump(&mut c, "ctg"), "CL.THROTTLE and RL.GCRA store the same state");
    // quantity 0 peeks; quantity above max_burst+1 can never pass (retry -1); neither writes.
    check(&mut c, "CL.THROTTLE ct 4 1 10 0", &[0, 5, 0, -1, 50]);
    check(&mut c, "CL.THROTTLE ctp 4 1 10 0", &[0, 5, 5, -1, 0]);
    check(&mut c, "CL.THROTTLE ctp 4 1 10 6", &[1, 5, 5, -1, 0]);
    assert!(!exists(&mut c, "ctp"));
    check(&mut c, "CL.THROTTLE ctp 4 1 10 5", &[0, 5, 0, -1, 50]);
    check(&mut c, "CL.THROTTLE ctp 4 1 10 3", &[1, 5, 0, 30, 50]);
}

#[test]
fn cl_throttle_second_rounding() {
    let (_s, mut c) = start();
    // One per 2 s: reset exactly 2.0 s → 2.
    check(&mut c, "CL.THROTTLE r2 0 1 2", &[0, 1, 0, -1, 2]);
    // One per 10 s; 6.1 s later the wait is 3.9 s → 4.
    check(&mut c, "CL.THROTTLE r 0 1 10", &[0, 1, 0, -1, 10]);
    clock(&mut c, T0 + 6_100 * MS);
    check(&mut c, "CL.THROTTLE r 0 1 10", &[1, 1, 0, 4, 4]);
    // 2.0005 s (less than a whole ms over) → 2.
    clock(&mut c, T0 + 7_999_500);
    check(&mut c, "CL.THROTTLE r 0 1 10", &[1, 1, 0, 2, 2]);
    // Exactly 2.0 s → 2.
    clock(&mut c, T0 + 8 * SEC);
    check(&mut c, "CL.THROTTLE r 0 1 10", &[1, 1, 0, 2, 2]);
    // 2.001 s → 3.
    clock(&mut c, T0 + 7_999 * MS);
    check(&mut c, "CL.THROTTLE r 0 1 10", &[1, 1, 0, 3, 3]);
    clock(&mut c, T0 + 10 * SEC);
    check(&mut c, "CL.THROTTLE r 0 1 10", &[0, 1, 0, -1, 10]);
}

#[test]
fn cl_throttle_high_rate_actually_limits() {
    let (_s, mut c) = start();
    // redis-cell never limits this (its interval rounds to 0): 8000/s, burst 2 → 125 µs apart.
    // The state lives for 1 ms of real time (its TTL): one MULTI/EXEC.
    let line = "CL.THROTTLE hr 1 8000 1";
    check_atomic(
        &mut c,
        &[
            (line, Some(vec![0, 2, 1, -1, 0])),
            (line, Some(vec![0, 2, 0, -1, 0])),
            (line, Some(vec![1, 2, 0, 0, 0])),
            (line, Some(vec![1, 2, 0, 0, 0])),
            ("RL.DEBUG CLOCK ADVANCE 124", None),
            (line, Some(vec![1, 2, 0, 0, 0])),
            ("RL.DEBUG CLOCK ADVANCE 1", None),
            (line, Some(vec![0, 2, 0, -1, 0])),
            (line, Some(vec![1, 2, 0, 0, 0])),
        ],
    );
}

#[test]
fn cl_throttle_takes_over_redis_cell_keys() {
    let (_s, mut c) = start();
    let now_ns = T0 as i128 * 1000;
    // redis-cell left an arrival time 3 s ahead: 1 per second, limit 5 → 2 tokens left.
    let cell = |key: &str, tat: i128| common::redis_cell_set(key, tat as i64, now_ns as i64).join(" ");
    run(&mut c, &cell("cell", now_ns + 3_000_000_000));
    // A peek does not take it over.
    check(&mut c, "CL.THROTTLE cell 4 1 1 0", &[0, 5, 2, -1, 3]);
    assert_eq!(key_type(&mut c, "cell"), "string");
    check(&mut c, "CL.THROTTLE cell 4 1 1", &[0, 5, 1, -1, 4]);
    assert_eq!(key_type(&mut c, "cell"), "ratelimit");
    assert_info(
        &mut c,
        "cell",
        "gcra",
        &[("limit", 1), ("period_us", SEC), ("burst", 5), ("tat_us", T0 + 4 * SEC), ("available", 1)],
    );
    assert_pttl(&mut c, "cell", 4000);
    check(&mut c, "CL.THROTTLE cell 4 1 1", &[0, 5, 0, -1, 5]);
    check(&mut c, "CL.THROTTLE cell 4 1 1", &[1, 5, 0, 1, 5]);

    // A full redis-cell key: limited, and the string is left as it was.
    let full = (now_ns + 5_000_000_000).to_string();
    run(&mut c, &cell("cellfull", now_ns + 5_000_000_000));
    check(&mut c, "CL.THROTTLE cellfull 4 1 1", &[1, 5, 0, 1, 5]);
    assert_eq!(key_type(&mut c, "cellfull"), "string");
    assert_eq!(redis::cmd("GET").arg("cellfull").query::<String>(&mut c).unwrap(), full);
    // An arrival time in the past (its TTL ending within the module's 60 s of it): a full bucket.
    run(&mut c, &format!("SET cellold {} PX 30000", now_ns - 20_000_000_000));
    check(&mut c, "CL.THROTTLE cellold 4 1 60", &[0, 5, 4, -1, 60]);
    assert_eq!(key_type(&mut c, "cellold"), "ratelimit");
    // A non-integer string is the wrong type, and stays untouched.
    for v in ["hello", "1.5", "", " 12"] {
        redis::cmd("SET").arg("cellbad").arg(v).query::<()>(&mut c).unwrap();
        let e = err(&mut c, "CL.THROTTLE cellbad 4 1 1");
        assert!(e.starts_with("WRONGTYPE"), "CL.THROTTLE on string {v:?}: {e}");
        assert_eq!(redis::cmd("GET").arg("cellbad").query::<String>(&mut c).unwrap(), v);
    }
}

// ---------------------------------------------------------------- RESP3

#[test]
fn resp3_replies_are_maps_of_the_resp2_fields() {
    let s = Server::start();
    let mut c2 = s.conn();
    clock(&mut c2, T0);
    let mut c = resp3_conn(&s);

    let v = run(&mut c, "RL.GCRA g3 5 10s");
    assert_eq!(resp3_limiter(v), [1, 5, 4, -1, 2000]);
    let v = run(&mut c, "RL.TOKENBUCKET t3 5 10s COST 5");
    assert_eq!(resp3_limiter(v), [5, 5, 0, -1, 10_000]);
    let v = run(&mut c, "RL.TOKENBUCKET t3 5 10s");
    assert_eq!(resp3_limiter(v), [0, 5, 0, 2000, 10_000]);
    let v = run(&mut c, "RL.SLIDING s3 5 10s");
    assert_eq!(resp3_limiter(v), [1, 5, 4, -1, 20_000]);
    let v = run(&mut c, "RL.FIXED f3 5 10s");
    assert_eq!(resp3_limiter(v), [1, 5, 4, -1, 10_000]);
    let v = run(&mut c, "RL.SLIDINGLOG l3 5 10s");
    assert_eq!(resp3_limiter(v), [1, 5, 4, -1, 10_000]);
    // RL.LEAKY: six keys.
    let line = "RL.LEAKY q3 5 10s BURST 2";
    assert_eq!(resp3_limiter(run(&mut c, line)), [1, 2, 1, -1, 2000, 0]);
    assert_eq!(resp3_limiter(run(&mut c, line)), [1, 2, 0, -1, 4000, 2000]);
    assert_eq!(resp3_limiter(run(&mut c, line)), [0, 2, 0, 2000, 4000, -1]);
    // The RESP2 connection sees the same values as a plain array.
    check(&mut c2, "RL.LEAKY q3 5 10s BURST 2 COST 0", &[0, 2, 0, -1, 4000, -1]);
    check(&mut c2, "RL.GCRA g3 5 10s", &[1, 5, 3, -1, 4000]);

    // RL.INFO: a map.
    let v = run(&mut c, "RL.INFO g3");
    assert!(matches!(v, Value::Map(_)), "RL.INFO under RESP3 is not a map");
    let info = RlInfo::of(&v).unwrap();
    assert_eq!(info.names(), ["algorithm", "limit", "period_us", "burst", "tat_us", "available", "ttl_ms"]);
    assert_eq!(info.algorithm(), "gcra");
    assert_eq!(info.int("limit"), 5);
    assert_eq!(info.int("period_us"), 10 * SEC);
    assert_eq!(info.int("burst"), 5);
    assert_eq!(info.int("tat_us"), T0 + 4 * SEC);
    assert_eq!(info.int("available"), 3);
    assert_eq!(run(&mut c, "RL.INFO nothing"), Value::Nil);
    // RESP2 RL.INFO: the same pairs as a flat array.
    let flat = run(&mut c2, "RL.INFO g3");
    assert!(matches!(flat, Value::Array(_)), "RL.INFO under RESP2 is not an array");
    let flat = RlInfo::of(&flat).unwrap();
    assert_eq!(flat.names(), info.names());
    for name in ["limit", "period_us", "burst", "tat_us", "available"] {
        assert_eq!(flat.get(name), info.get(name), "RL.INFO field {name} RESP2 vs RESP3");
    }

    // RL.MULTI: {allowed, retry_after_ms, limits: [map, map]}.
    let multi = "RL.MULTI 2 m:a m:b GCRA 1 10s LEAKY 2 10s";
    let m = resp3_multi(run(&mut c, multi));
    assert_eq!((m.allowed, m.retry_after_ms), (1, -1));
    assert_eq!(m.limits, [vec![1, 1, 0, -1, 10_000], vec![1, 2, 1, -1, 5_000, 0]]);
    // Refused by the GCRA limit: nothing consumed; each limit shows its own view.
    let m = resp3_multi(run(&mut c, multi));
    assert_eq!((m.allowed, m.retry_after_ms), (0, 10_000));
    assert_eq!(m.limits, [vec![0, 1, 0, 10_000, 10_000], vec![0, 2, 1, -1, 5_000, -1]]);
    // RESP2: [allowed, retry_after_ms, reply_1, reply_2].
    let m = resp2_multi(run(&mut c2, multi));
    assert_eq!((m.allowed, m.retry_after_ms), (0, 10_000));
    assert_eq!(m.limits, [vec![0, 1, 0, 10_000, 10_000], vec![0, 2, 1, -1, 5_000, -1]]);
}

/// A RESP3 RL.MULTI reply: a map `{allowed, retry_after_ms, limits: [map, …]}`.
fn resp3_multi(v: Value) -> MultiReply {
    let maps = match &v {
        Value::Map(m) => matches!(m.last(), Some((_, Value::Array(l))) if l.iter().all(|x| matches!(x, Value::Map(_)))),
        _ => false,
    };
    assert!(maps, "RL.MULTI under RESP3 is not a map of maps: {v:?}");
    MultiReply::of(&v)
}

/// A RESP2 RL.MULTI reply: `[allowed, retry_after_ms, reply_1, …]`, each reply an array.
fn resp2_multi(v: Value) -> MultiReply {
    let arrays = matches!(&v, Value::Array(a) if a.len() >= 3 && a[2..].iter().all(|x| matches!(x, Value::Array(_))));
    assert!(arrays, "RL.MULTI under RESP2 is not an array of arrays: {v:?}");
    MultiReply::of(&v)
}

#[test]
fn rl_multi_resp2_timeline() {
    let (_s, mut c) = start();
    let multi = "RL.MULTI 2 mm:a mm:b SLIDINGLOG 2 10s FIXED 3 10s";
    let m = resp2_multi(run(&mut c, multi));
    assert_eq!((m.allowed, m.retry_after_ms), (1, -1));
    assert_eq!(m.limits, [vec![1, 2, 1, -1, 10_000], vec![1, 3, 2, -1, 10_000]]);
    advance(&mut c, SEC);
    run(&mut c, multi);
    // Log full (T0, T0+1s); fixed at 2 of 3. Refused: retry is the log's (9 s).
    let m = resp2_multi(run(&mut c, multi));
    assert_eq!((m.allowed, m.retry_after_ms), (0, 9_000));
    assert_eq!(m.limits, [vec![0, 2, 0, 9_000, 10_000], vec![0, 3, 1, -1, 9_000]]);
    // Nothing was consumed on the fixed window.
    check(&mut c, "RL.FIXED mm:b 3 10s COST 0", &[0, 3, 1, -1, 9_000]);
    // A cost no limit can ever grant: retry -1.
    let m = resp2_multi(run(&mut c, "RL.MULTI 2 mm:a mm:b SLIDINGLOG 2 10s FIXED 3 10s COST 3"));
    assert_eq!((m.allowed, m.retry_after_ms), (0, -1));
    // PARTIAL: the least any limit grants.
    clock(&mut c, T0 + 10 * SEC);
    let m = resp2_multi(run(&mut c, "RL.MULTI 2 mm:a mm:b SLIDINGLOG 2 10s FIXED 3 10s COST 3 PARTIAL"));
    assert_eq!((m.allowed, m.retry_after_ms), (1, -1));
    assert_eq!(m.limits, [vec![1, 2, 0, -1, 10_000], vec![1, 3, 2, -1, 10_000]]);
}

// ---------------------------------------------------------------- TTLs

#[test]
fn pttl_covers_reset_after() {
    let (_s, mut c) = start();
    clock(&mut c, T0 + 2 * SEC);
    for (line, key, reset) in [
        ("RL.GCRA tt:g 2 10s", "tt:g", 5_000),
        ("RL.TOKENBUCKET tt:t 3 9s COST 2", "tt:t", 6_000),
        ("RL.LEAKY tt:l 4 10s COST 3", "tt:l", 7_500),
        ("RL.SLIDING tt:s 5 10s", "tt:s", 18_000),
        ("RL.FIXED tt:f 5 10s", "tt:f", 8_000),
        ("RL.SLIDINGLOG tt:w 5 10s", "tt:w", 10_000),
        ("CL.THROTTLE tt:c 2 1 30", "tt:c", 30_000),
    ] {
        let (v, p) = q_pttl(&mut c, line, key);
        if key == "tt:c" {
            assert_eq!(CellReply::of(&v), [0, 3, 2, -1, 30], "{line}");
        } else {
            let r = LimiterReply::of(&v);
            assert!(r.allowed >= 1 && r.retry_after_ms == -1, "{line} not admitted: {r:?}");
            assert_eq!(r.reset_after_ms, reset, "{line}: {r:?}");
        }
        assert_covering_pttl(p, reset, line);
    }
    // A second admitted call moves the TTL with the reply.
    advance(&mut c, 1_500 * MS);
    let (r, p) = q_pttl_limiter(&mut c, "RL.SLIDINGLOG tt:w 5 10s", "tt:w");
    assert_eq!(r, vec![1, 5, 3, -1, 10_000]);
    assert_covering_pttl(p, 10_000, "RL.SLIDINGLOG tt:w 5 10s");
    // (TTLs are on the server's real clock: the first call set 15 s, which still covers this
    // call's 10 s, so the expiry was left alone.)
    assert!(p > 14_000, "RL.SLIDINGLOG's second call moved an expiry that covered it: PTTL {p}");
    // A key made persistent by hand gets a covering TTL back on its next admitted call.
    run(&mut c, "PERSIST tt:w");
    let (r, p) = q_pttl_limiter(&mut c, "RL.SLIDINGLOG tt:w 5 10s", "tt:w");
    assert_eq!(r, vec![1, 5, 2, -1, 10_000]);
    assert_covering_pttl(p, 10_000, "RL.SLIDINGLOG tt:w 5 10s after PERSIST");
    let (r, p) = q_pttl_limiter(&mut c, "RL.GCRA tt:g 2 10s", "tt:g");
    assert_eq!(r, vec![1, 2, 0, -1, 8_500]);
    assert_covering_pttl(p, 8_500, "RL.GCRA tt:g 2 10s");
    // Sub-ms remainders round up: 3 per 10 s → 3333.33.. ms.
    let (r, p) = q_pttl_limiter(&mut c, "RL.LEAKY tt:r 3 10s", "tt:r");
    assert_eq!(r, vec![1, 3, 2, -1, 3_334, 0]);
    assert_covering_pttl(p, 3_334, "RL.LEAKY tt:r 3 10s");
    // A limited call leaves the expiry alone.
    let before = pexpiretime(&mut c, "tt:g");
    let r = q(&mut c, "RL.GCRA tt:g 2 10s");
    assert_eq!(r, vec![0, 2, 0, 3_500, 8_500]);
    assert_eq!(pexpiretime(&mut c, "tt:g"), before);
    // Once the TTL passes (real clock) the key is gone: a sub-second reset.
    let r = q(&mut c, "RL.GCRA tt:short 10 1s");
    assert_eq!(r, vec![1, 10, 9, -1, 100]);
    std::thread::sleep(Duration::from_millis(250));
    assert!(!exists(&mut c, "tt:short"), "key outlived its reset_after");
}

// ---------------------------------------------------------------- RL.INFO / RL.RESET

#[test]
fn rl_info_reports_each_algorithms_state() {
    let (_s, mut c) = start();
    assert_eq!(rl_info(&mut c, "none"), None);

    q(&mut c, "RL.GCRA i:g 2 10s");
    assert_info(
        &mut c,
        "i:g",
        "gcra",
        &[("limit", 2), ("period_us", 10 * SEC), ("burst", 2), ("tat_us", T0 + 5 * SEC), ("available", 1)],
    );
    q(&mut c, "RL.LEAKY i:l 2 10s BURST 3 COST 2");
    assert_info(
        &mut c,
        "i:l",
        "leaky",
        &[("limit", 2), ("period_us", 10 * SEC), ("burst", 3), ("tat_us", T0 + 10 * SEC), ("available", 1)],
    );
    q(&mut c, "RL.TOKENBUCKET i:t 2 10s");
    let tb = |avail| {
        [("limit", 2), ("period_us", 10 * SEC), ("burst", 2), ("tokens", 1), ("last_us", T0), ("available", avail)]
    };
    assert_info(&mut c, "i:t", "tokenbucket", &tb(1));
    q(&mut c, "RL.SLIDING i:s 10 10s COST 3");
    assert_info(
        &mut c,
        "i:s",
        "sliding",
        &[
            ("limit", 10),
            ("window_us", 10 * SEC),
            ("window_start_us", T0),
            ("previous", 0),
            ("current", 3),
            ("estimate", 3),
        ],
    );
    q(&mut c, "RL.FIXED i:f 5 10s COST 2");
    assert_info(
        &mut c,
        "i:f",
        "fixed",
        &[("limit", 5), ("window_us", 10 * SEC), ("window_start_us", T0), ("count", 2)],
    );
    q(&mut c, "RL.SLIDINGLOG i:w 5 10s COST 2");
    advance(&mut c, SEC);
    q(&mut c, "RL.SLIDINGLOG i:w 5 10s");
    let log = |in_window| {
        [
            ("limit", 5),
            ("window_us", 10 * SEC),
            ("entries", 2),
            ("units", 3),
            ("in_window", in_window),
            ("oldest_us", T0),
            ("newest_us", T0 + SEC),
        ]
    };
    assert_info(&mut c, "i:w", "slidinglog", &log(3));

    // Derived fields follow the clock (T0 + 5 s now).
    advance(&mut c, 4 * SEC);
    assert_info(&mut c, "i:t", "tokenbucket", &tb(2));
    assert_info(
        &mut c,
        "i:g",
        "gcra",
        &[("limit", 2), ("period_us", 10 * SEC), ("burst", 2), ("tat_us", T0 + 5 * SEC), ("available", 2)],
    );
    // Sliding estimate at T0+15 s: stored window still T0, 3 × 5/10 = 1.5 → 2.
    advance(&mut c, 10 * SEC);
    assert_info(
        &mut c,
        "i:s",
        "sliding",
        &[
            ("limit", 10),
            ("window_us", 10 * SEC),
            ("window_start_us", T0),
            ("previous", 0),
            ("current", 3),
            ("estimate", 2),
        ],
    );
    // Sliding log at T0+15 s: the COST 2 entry (T0) left the window, the T0+1 s one too.
    assert_info(&mut c, "i:w", "slidinglog", &log(0));

    // RL.INFO is read-only and of no other type.
    run(&mut c, "SET str x");
    assert!(err(&mut c, "RL.INFO str").starts_with("WRONGTYPE"));
}

#[test]
fn rl_reset_deletes_limiter_and_redis_cell_keys_only() {
    let (_s, mut c) = start();
    for (cmd, _) in ALGOS {
        let k = format!("rs:{cmd}");
        q(&mut c, &format!("{cmd} {k} 1 1h"));
        assert_eq!(run(&mut c, &format!("RL.RESET {k}")), Value::Int(1), "{cmd}");
        assert!(!exists(&mut c, &k));
        assert_eq!(run(&mut c, &format!("RL.RESET {k}")), Value::Int(0), "{cmd}");
        // Fresh again.
        let r = limiter(&mut c, &format!("{cmd} {k} 1 1h"));
        assert_eq!((r.allowed, r.limit, r.remaining), (1, 1, 0), "{cmd} after RL.RESET");
    }
    q(&mut c, "CL.THROTTLE rs:cl 0 1 60");
    assert_eq!(run(&mut c, "RL.RESET rs:cl"), Value::Int(1));
    // A reset key may then hold another algorithm.
    q(&mut c, "RL.GCRA rs:x 1 1h");
    assert!(err(&mut c, "RL.FIXED rs:x 1 1h").starts_with("WRONGTYPE key holds gcra state"));
    assert_eq!(run(&mut c, "RL.RESET rs:x"), Value::Int(1));
    check(&mut c, "RL.FIXED rs:x 1 10s", &[1, 1, 0, -1, 10_000]);
    // An integer string is not rate-limit state: WRONGTYPE, and left alone (a key redis-cell
    // left is deleted only with REDIS_CELL_KEYS: tests/cell_interop.rs).
    run(&mut c, "SET rs:cell 7");
    assert!(err(&mut c, "RL.RESET rs:cell").starts_with("WRONGTYPE "));
    assert_eq!(run(&mut c, "GET rs:cell"), Value::BulkString(b"7".to_vec()));
    // Other types: WRONGTYPE, and left alone.
    run(&mut c, "SET rs:str seven");
    run(&mut c, "RPUSH rs:list a");
    for k in ["rs:str", "rs:list"] {
        assert!(err(&mut c, &format!("RL.RESET {k}")).starts_with("WRONGTYPE "));
        assert!(exists(&mut c, k));
    }
}

// ---------------------------------------------------------------- INFO ratelimit

#[test]
fn info_ratelimit_counts_checks_admitted_units_and_limited_calls() {
    let (s, mut c) = start();
    assert_eq!(s.info_int("ratelimit", "ratelimit_gcra_checks"), 0);
    assert!(s.info("ratelimit").contains("ratelimit_version:"), "{}", s.info("ratelimit"));
    q(&mut c, "RL.GCRA g 3 10s");
    q(&mut c, "RL.GCRA g 3 10s COST 2");
    q(&mut c, "RL.GCRA g 3 10s"); // limited
    q(&mut c, "RL.GCRA g 3 10s COST 0"); // peek: not limited
    q(&mut c, "CL.THROTTLE cg 0 1 10"); // admitted (gcra)
    q(&mut c, "CL.THROTTLE cg 0 1 10"); // limited
    assert_eq!(s.info_int("ratelimit", "ratelimit_gcra_checks"), 6);
    assert_eq!(s.info_int("ratelimit", "ratelimit_gcra_admitted_units"), 4);
    assert_eq!(s.info_int("ratelimit", "ratelimit_gcra_limited"), 2);

    q(&mut c, "RL.FIXED f 5 10s COST 3");
    q(&mut c, "RL.FIXED f 5 10s COST 3 PARTIAL"); // 2 granted
    q(&mut c, "RL.FIXED f 5 10s"); // limited
    assert_eq!(s.info_int("ratelimit", "ratelimit_fixed_checks"), 3);
    assert_eq!(s.info_int("ratelimit", "ratelimit_fixed_admitted_units"), 5);
    assert_eq!(s.info_int("ratelimit", "ratelimit_fixed_limited"), 1);

    for (cmd, algo) in [
        ("RL.TOKENBUCKET", "tokenbucket"),
        ("RL.SLIDING", "sliding"),
        ("RL.SLIDINGLOG", "slidinglog"),
        ("RL.LEAKY", "leaky"),
    ] {
        assert_eq!(s.info_int("ratelimit", &format!("ratelimit_{algo}_checks")), 0);
        q(&mut c, &format!("{cmd} k:{algo} 2 10s COST 2"));
        q(&mut c, &format!("{cmd} k:{algo} 2 10s"));
        assert_eq!(s.info_int("ratelimit", &format!("ratelimit_{algo}_checks")), 2, "{algo}");
        assert_eq!(s.info_int("ratelimit", &format!("ratelimit_{algo}_admitted_units")), 2, "{algo}");
        assert_eq!(s.info_int("ratelimit", &format!("ratelimit_{algo}_limited")), 1, "{algo}");
    }
    // Errors are not checks.
    err(&mut c, "RL.GCRA g 0 10s");
    run(&mut c, "SET str x");
    err(&mut c, "RL.GCRA str 3 10s");
    err(&mut c, "RL.FIXED g 3 10s");
    assert_eq!(s.info_int("ratelimit", "ratelimit_gcra_checks"), 6);
    assert_eq!(s.info_int("ratelimit", "ratelimit_fixed_checks"), 3);
}

// ---------------------------------------------------------------- keyspace event

#[test]
fn limited_keyspace_event() {
    let s = Server::start();
    let mut c = s.conn();
    clock(&mut c, T0);
    run(&mut c, "CONFIG SET notify-keyspace-events Kd");
    let mut sub = s.conn();
    let mut ps = sub.as_pubsub();
    ps.psubscribe("__keyspace@0__:*").unwrap();

    // Admitted calls publish nothing of ours; limited ones publish rl.limited on their key.
    q(&mut c, "RL.GCRA ok 5 10s");
    q(&mut c, "RL.FIXED ev 1 10s");
    q(&mut c, "RL.FIXED ev 1 10s"); // limited
    q(&mut c, "CL.THROTTLE ev2 0 1 10");
    q(&mut c, "CL.THROTTLE ev2 0 1 10"); // limited
    q(&mut c, "RL.GCRA ok 5 10s COST 0"); // a peek is not limited
    q(&mut c, "RL.GCRA ev3 1 10s COST 2"); // limited (never admissible), key never created
    run(&mut c, "PUBLISH __keyspace@0__:end marker");

    let mut got = Vec::new();
    loop {
        let msg = ps.get_message().unwrap_or_else(|e| panic!("keyspace messages (got {got:?}): {e}"));
        let payload: String = msg.get_payload().unwrap();
        let channel = msg.get_channel_name().to_string();
        if channel == "__keyspace@0__:end" {
            break;
        }
        got.push((channel, payload));
    }
    let limited: Vec<&(String, String)> = got.iter().filter(|(_, p)| p == "rl.limited").collect();
    assert_eq!(
        limited.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>(),
        ["__keyspace@0__:ev", "__keyspace@0__:ev2", "__keyspace@0__:ev3"],
        "all messages: {got:?}"
    );
}
