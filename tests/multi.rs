//! RL.MULTI: several limits in one atomic call, all or nothing. Also PARTIAL on the
//! single-key commands (a partial grant never exceeds what single calls would admit).

mod common;
#[path = "common/traffic.rs"]
mod traffic;

use common::{
    clock_advance, clock_set, dump, err_text, exists, int, keyslot, limiter, multi, now_ms, pexpiretime, run, run_err,
    text, try_run, wait_replica_synced, Args, Cluster, LimiterReply, MultiReply, Opts, Rng, Server, LIMITER_FIELDS,
};
use redis::{Connection, Value};
use std::collections::HashMap;
use traffic::{assert_same, snapshot, ALGOS};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A multiple of 1 h (and so of every window used here).
const T0_US: i64 = 1_699_999_200_000_000;

/// Asserts an RL.MULTI reply: allowed, retry_after_ms and each limit's reply (RESP2 integers).
#[track_caller]
fn assert_multi(m: &MultiReply, allowed: i64, retry_after_ms: i64, limits: &[Vec<i64>]) {
    assert_eq!((m.allowed, m.retry_after_ms), (allowed, retry_after_ms), "{m:?}");
    assert_eq!(m.limits, limits, "{m:?}");
}

/// DUMP and PEXPIRETIME of some keys (None for missing ones).
fn states(con: &mut Connection, keys: &[&str]) -> Vec<(Option<Vec<u8>>, i64)> {
    keys.iter().map(|k| (dump(con, k), pexpiretime(con, k))).collect()
}

// ---------------------------------------------------------------------------------------------
// All or nothing
// ---------------------------------------------------------------------------------------------

#[test]
fn refused_multi_changes_no_key() {
    let s = Server::start();
    let mut c = s.conn();
    clock_set(&mut c, T0_US);
    assert_eq!(limiter(&mut c, "RL.FIXED b 2 1m COST 2"), vec![2, 2, 0, -1, 60000]);
    clock_advance(&mut c, 15_000_000);

    // a is missing and would admit; b refuses: a stays missing, b unchanged.
    let before_b = states(&mut c, &["b"]);
    let peek_a = limiter(&mut c, "RL.GCRA a 10 1m COST 0");
    let dry_b = limiter(&mut c, "RL.FIXED b 2 1m DRYRUN");
    assert_eq!(peek_a, vec![0, 10, 10, -1, 0]);
    assert_eq!(dry_b, vec![0, 2, 0, 45000, 45000]);
    let m = multi(&mut c, "RL.MULTI 2 a b GCRA 10 1m FIXED 2 1m");
    assert_multi(&m, 0, 45000, &[vec![0, 10, 10, -1, 0], vec![0, 2, 0, 45000, 45000]]);
    assert!(!exists(&mut c, "a"), "a refused RL.MULTI created key a");
    assert_eq!(states(&mut c, &["b"]), before_b, "a refused RL.MULTI changed b");
    // Same with the refusing limit first.
    let m = multi(&mut c, "RL.MULTI 2 b a FIXED 2 1m GCRA 10 1m");
    assert_multi(&m, 0, 45000, &[vec![0, 2, 0, 45000, 45000], vec![0, 10, 10, -1, 0]]);
    assert!(!exists(&mut c, "a"));

    // a exists now: still unchanged by a refused call, and its reply shows its own
    // unchanged remaining/reset with its own retry_after (-1: it alone would admit).
    assert_eq!(limiter(&mut c, "RL.GCRA a 10 1m COST 4"), vec![4, 10, 6, -1, 24000]);
    clock_advance(&mut c, 1_000_000);
    let before = states(&mut c, &["a", "b"]);
    let peek_a = limiter(&mut c, "RL.GCRA a 10 1m COST 0");
    assert_eq!(peek_a, vec![0, 10, 6, -1, 23000]);
    let m = multi(&mut c, "RL.MULTI 2 a b GCRA 10 1m FIXED 2 1m");
    assert_multi(&m, 0, 44000, &[peek_a.ints(), vec![0, 2, 0, 44000, 44000]]);
    assert_eq!(states(&mut c, &["a", "b"]), before, "a refused RL.MULTI changed a or b");

    // Three limits of different algorithms, the middle one refusing.
    assert_eq!(limiter(&mut c, "RL.SLIDINGLOG l 5 1m COST 2").allowed, 2);
    assert_eq!(limiter(&mut c, "RL.LEAKY k 3 1m COST 3").allowed, 3);
    clock_advance(&mut c, 500_000);
    let before = states(&mut c, &["l", "k", "t"]);
    let peek_l = limiter(&mut c, "RL.SLIDINGLOG l 5 1m COST 0");
    let dry_k = limiter(&mut c, "RL.LEAKY k 3 1m DRYRUN");
    let peek_t = limiter(&mut c, "RL.TOKENBUCKET t 5 1m COST 0");
    assert_eq!(dry_k.allowed, 0, "k should refuse: {dry_k:?}");
    assert!(dry_k.retry_after_ms > 0);
    let m = multi(&mut c, "RL.MULTI 3 l k t SLIDINGLOG 5 1m LEAKY 3 1m TOKENBUCKET 5 1m");
    assert_eq!(m.allowed, 0);
    assert_eq!(m.retry_after_ms, dry_k.retry_after_ms);
    assert_eq!(m.limits, vec![peek_l, dry_k, peek_t]);
    assert_eq!(states(&mut c, &["l", "k", "t"]), before, "a refused RL.MULTI changed a key");

    // Admitted: every key is updated, as single calls would have.
    clock_advance(&mut c, 20_000_000);
    let m = multi(&mut c, "RL.MULTI 3 l k t SLIDINGLOG 5 1m LEAKY 3 1m TOKENBUCKET 5 1m");
    assert_eq!(m.allowed, 1);
    assert_eq!(m.retry_after_ms, -1);
    for (i, r) in m.limits.iter().enumerate() {
        assert_eq!(r.allowed, 1, "limit {i} reply {r:?}");
        assert_eq!(r.retry_after_ms, -1, "limit {i} reply {r:?}");
    }
    assert!(m.limits[1].delay_ms.is_some(), "LEAKY reply has delay_ms");
    assert_eq!(limiter(&mut c, "RL.SLIDINGLOG l 5 1m COST 0").remaining, 2);
    assert_eq!(limiter(&mut c, "RL.TOKENBUCKET t 5 1m COST 0").remaining, 4);
    assert!(exists(&mut c, "t"));
}

#[test]
fn retry_after_is_the_largest_or_never() {
    let s = Server::start();
    let mut c = s.conn();
    clock_set(&mut c, T0_US);
    assert_eq!(limiter(&mut c, "RL.GCRA a 1 10s"), vec![1, 1, 0, -1, 10000]);
    assert_eq!(limiter(&mut c, "RL.GCRA b 1 20s"), vec![1, 1, 0, -1, 20000]);
    clock_advance(&mut c, 2_000_000);
    let m = multi(&mut c, "RL.MULTI 2 a b GCRA 1 10s GCRA 1 20s");
    assert_multi(&m, 0, 18000, &[vec![0, 1, 0, 8000, 8000], vec![0, 1, 0, 18000, 18000]]);
    let m = multi(&mut c, "RL.MULTI 3 b fresh a GCRA 1 20s FIXED 5 1m GCRA 1 10s");
    assert_eq!(m.retry_after_ms, 18000);
    assert_eq!(m.limits[1], vec![0, 5, 5, -1, 0]);
    assert!(!exists(&mut c, "fresh"));

    // A limit the cost can never fit (COST > capacity): overall -1 …
    let m = multi(&mut c, "RL.MULTI 2 c d GCRA 5 1m FIXED 10 1m COST 6");
    assert_multi(&m, 0, -1, &[vec![0, 5, 5, -1, 0], vec![0, 10, 10, -1, 0]]);
    assert!(!exists(&mut c, "c") && !exists(&mut c, "d"));
    // … even when another refusing limit has a finite retry.
    assert_eq!(limiter(&mut c, "RL.SLIDINGLOG e 10 1m COST 8").allowed, 8);
    clock_advance(&mut c, 1_000_000);
    let dry_e = limiter(&mut c, "RL.SLIDINGLOG e 10 1m COST 3 DRYRUN");
    assert_eq!(dry_e, vec![0, 10, 2, 59000, 59000]);
    let m = multi(&mut c, "RL.MULTI 2 e f SLIDINGLOG 10 1m GCRA 2 1m COST 3");
    assert_multi(&m, 0, -1, &[dry_e.ints(), vec![0, 2, 2, -1, 0]]);
    let m = multi(&mut c, "RL.MULTI 2 f e GCRA 2 1m SLIDINGLOG 10 1m COST 3");
    assert_multi(&m, 0, -1, &[vec![0, 2, 2, -1, 0], dry_e.ints()]);
    // The finite one alone: its retry.
    let m = multi(&mut c, "RL.MULTI 2 e g SLIDINGLOG 10 1m GCRA 5 1m COST 3");
    assert_eq!(m.retry_after_ms, 59000);
    // Admitted: -1.
    let m = multi(&mut c, "RL.MULTI 2 e g SLIDINGLOG 10 1m GCRA 5 1m COST 2");
    assert_eq!((m.allowed, m.retry_after_ms), (2, -1));
    assert!(m.limits.iter().all(|r| r.retry_after_ms == -1), "{m:?}");
    // Both refusing with a finite retry, PARTIAL: retry until one unit fits everywhere.
    clock_advance(&mut c, 1_000_000);
    let m = multi(&mut c, "RL.MULTI 2 a b GCRA 1 10s GCRA 1 20s PARTIAL COST 5");
    assert_eq!((m.allowed, m.retry_after_ms), (0, 16000), "{m:?}");
}

#[test]
fn partial_grants_the_minimum_available() {
    let s = Server::start();
    let mut c = s.conn();
    clock_set(&mut c, T0_US);
    assert_eq!(limiter(&mut c, "RL.GCRA a 10 1m COST 3").allowed, 3);
    assert_eq!(limiter(&mut c, "RL.SLIDINGLOG b 5 1m COST 2").allowed, 2);
    clock_advance(&mut c, 1_000_000);
    assert_eq!(limiter(&mut c, "RL.GCRA a 10 1m COST 0").remaining, 7);
    assert_eq!(limiter(&mut c, "RL.SLIDINGLOG b 5 1m COST 0").remaining, 3);

    let m = multi(&mut c, "RL.MULTI 2 a b GCRA 10 1m SLIDINGLOG 5 1m COST 6 PARTIAL");
    assert_multi(&m, 3, -1, &[vec![3, 10, 4, -1, 35000], vec![3, 5, 0, -1, 60000]]);
    assert_eq!(limiter(&mut c, "RL.GCRA a 10 1m COST 0"), vec![0, 10, 4, -1, 35000]);
    assert_eq!(limiter(&mut c, "RL.SLIDINGLOG b 5 1m COST 0"), vec![0, 5, 0, -1, 60000]);

    // One limit has nothing: refused, retry until one unit fits there; nothing changes.
    let before = states(&mut c, &["a", "b"]);
    let m = multi(&mut c, "RL.MULTI 2 a b GCRA 10 1m SLIDINGLOG 5 1m PARTIAL COST 2");
    assert_multi(&m, 0, 59000, &[vec![0, 10, 4, -1, 35000], vec![0, 5, 0, 59000, 60000]]);
    assert_eq!(states(&mut c, &["a", "b"]), before);

    // COST below every availability: all of it.
    assert_eq!(limiter(&mut c, "RL.FIXED x 10 1m COST 1").allowed, 1);
    let m = multi(&mut c, "RL.MULTI 2 a x GCRA 10 1m FIXED 10 1m PARTIAL COST 2");
    assert_eq!(m.allowed, 2);
    let head = |r: &LimiterReply| (r.allowed, r.limit, r.remaining);
    assert_eq!(head(&m.limits[0]), (2, 10, 2));
    assert_eq!(head(&m.limits[1]), (2, 10, 7));
    // PARTIAL grants min over three limits.
    let m = multi(&mut c, "RL.MULTI 3 x a new FIXED 10 1m GCRA 10 1m TOKENBUCKET 100 1m PARTIAL COST 50");
    assert_eq!(m.allowed, 2, "{m:?}");
    assert_eq!(head(&m.limits[0]), (2, 10, 5));
    assert_eq!(head(&m.limits[1]), (2, 10, 0));
    assert_eq!(head(&m.limits[2]), (2, 100, 98));
    assert_eq!(limiter(&mut c, "RL.TOKENBUCKET new 100 1m COST 0").remaining, 98);
}

#[test]
fn cost_dryrun_and_peek_apply_to_every_limit() {
    let s = Server::start();
    let mut c = s.conn();
    clock_set(&mut c, T0_US);
    let spec = "TOKENBUCKET 10 1m SLIDING 10 1m LEAKY 10 1m FIXED 10 1m SLIDINGLOG 10 1m GCRA 10 1m";
    let keys = ["a", "b", "c", "d", "e", "f"];
    let m = multi(&mut c, &format!("RL.MULTI 6 a b c d e f {spec} COST 3"));
    assert_eq!((m.allowed, m.retry_after_ms), (3, -1));
    for (i, r) in m.limits.iter().enumerate() {
        assert_eq!((r.allowed, r.limit, r.remaining, r.retry_after_ms), (3, 10, 7, -1), "limit {i}: {r:?}");
    }
    assert_eq!(m.limits[2], vec![3, 10, 7, -1, 18000, 0], "LEAKY reply");
    // Each key consumed 3, as a single call with COST 3 would have.
    let singles = ["RL.TOKENBUCKET", "RL.SLIDING", "RL.LEAKY", "RL.FIXED", "RL.SLIDINGLOG", "RL.GCRA"];
    for (k, cmd) in keys.iter().zip(singles) {
        let r = limiter(&mut c, &format!("{cmd} {k} 10 1m COST 0"));
        assert_eq!(r.remaining, 7, "{k} after COST 3: {r:?}");
        // A twin key given the same single call holds the same state.
        let twin = format!("twin:{k}");
        clock_set(&mut c, T0_US);
        limiter(&mut c, &format!("{cmd} {twin} 10 1m COST 3"));
        assert_eq!(dump(&mut c, k), dump(&mut c, &twin), "{k}: RL.MULTI COST 3 vs single {cmd} COST 3");
    }

    clock_advance(&mut c, 1_000_000);
    // DRYRUN: the reply of a real call, nothing written.
    let before = states(&mut c, &keys);
    let dry = multi(&mut c, &format!("RL.MULTI 6 a b c d e f {spec} COST 4 DRYRUN"));
    assert_eq!(states(&mut c, &keys), before, "DRYRUN changed a key");
    assert_eq!(dry.allowed, 4);
    let real = multi(&mut c, &format!("RL.MULTI 6 a b c d e f {spec} COST 4"));
    assert_eq!(dry, real, "DRYRUN reply vs the real call's");
    assert_ne!(states(&mut c, &keys), before);

    // DRYRUN refused: same reply as a real refused call.
    let before = states(&mut c, &keys);
    let dry = multi(&mut c, &format!("RL.MULTI 6 a b c d e f {spec} COST 5 DRYRUN"));
    let real = multi(&mut c, &format!("RL.MULTI 6 a b c d e f {spec} COST 5"));
    assert_eq!(dry, real);
    assert_eq!(dry.allowed, 0);
    assert_eq!(states(&mut c, &keys), before);

    // COST 0 peeks every limit: allowed 0, retry -1, each limit's current view.
    let peek = multi(&mut c, &format!("RL.MULTI 6 a b c d e f {spec} COST 0"));
    assert_eq!((peek.allowed, peek.retry_after_ms), (0, -1));
    for ((k, cmd), r) in keys.iter().zip(singles).zip(&peek.limits) {
        assert_eq!(*r, limiter(&mut c, &format!("{cmd} {k} 10 1m COST 0")), "{k}: peek via RL.MULTI vs single");
    }
    assert_eq!(states(&mut c, &keys), before);
    // A peek on missing keys creates nothing.
    let peek = multi(&mut c, "RL.MULTI 2 m1 m2 GCRA 10 1m SLIDINGLOG 10 1m COST 0");
    assert_multi(&peek, 0, -1, &[vec![0, 10, 10, -1, 0], vec![0, 10, 10, -1, 0]]);
    assert!(!exists(&mut c, "m1") && !exists(&mut c, "m2"));
}

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

#[test]
fn malformed_arguments_are_refused_naming_the_argument() {
    let s = Server::start();
    let mut c = s.conn();
    let cases: &[(&str, &str)] = &[
        ("RL.MULTI 2 a a GCRA 1 1 GCRA 1 1", "distinct"),
        ("RL.MULTI 3 a b a GCRA 1 1 GCRA 1 1 FIXED 1 1", "distinct"),
        ("RL.MULTI 0 a GCRA 1 1", "numkeys"),
        ("RL.MULTI -1 a GCRA 1 1", "numkeys"),
        ("RL.MULTI x a GCRA 1 1", "numkeys"),
        ("RL.MULTI 9 a GCRA 1 1", "numkeys"),
        ("RL.MULTI 2 a b GCRA 1 1", "limit"),
        ("RL.MULTI 1 a GCRA 1 1 FIXED 1 1", "limit"),
        ("RL.MULTI 1 a", ""),
        // Too short for any limit: the module's message, or Redis's arity check.
        ("RL.MULTI 1 a GCRA 1", ""),
        ("RL.MULTI 1 a GCRA 1 SLIDING", ""),
        ("RL.MULTI 1 a BOGUS 1 1", "BOGUS"),
        ("RL.MULTI 1 a SLIDING 1 1 BURST 2", "BURST"),
        ("RL.MULTI 1 a GCRA 1 1 COST 1 COST 2", "COST"),
        ("RL.MULTI 1 a GCRA 1 1 COST x", "COST"),
        ("RL.MULTI 2 a b GCRA 1 1 FIXED 0 1", "limit"),
        ("RL.MULTI 2 a b GCRA 1 1 FIXED 1 5x", "5x"),
        ("RL.MULTI 1 a GCRA 1 1 FOO", "FOO"),
    ];
    for (line, needle) in cases {
        let e = run_err(&mut c, line);
        assert!(e.starts_with("ERR "), "`{line}`: {e}");
        assert!(e.to_lowercase().contains(&needle.to_lowercase()), "`{line}`: error {e:?} should mention {needle:?}");
    }
    // Past 16 keys distinctness is checked with a hash set rather than pairwise: the same answer.
    let many = |last: &str| {
        let keys: Vec<String> = (0..19).map(|i| format!("k{i}")).chain([last.to_string()]).collect();
        format!("RL.MULTI 20 {} {}", keys.join(" "), vec!["GCRA 1 1"; 20].join(" "))
    };
    let e = run_err(&mut c, &many("k3"));
    assert!(e.starts_with("ERR ") && e.contains("distinct"), "{e}");
    let n: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n, 0, "a failed RL.MULTI wrote a key");
    assert_eq!(multi(&mut c, &many("k19")).allowed, 1);
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let e = run_err(&mut c, "RL.MULTI");
    assert!(e.starts_with("ERR") && e.contains("wrong number of arguments"), "{e}");
    let n: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n, 0, "a failed RL.MULTI wrote a key");

    // Another algorithm's key, or another type: WRONGTYPE, nothing written.
    limiter(&mut c, "RL.FIXED f 5 1m");
    let _: () = redis::cmd("SET").arg("str").arg("x").query(&mut c).unwrap();
    let before = states(&mut c, &["f"]);
    let e = run_err(&mut c, "RL.MULTI 2 a f GCRA 5 1m GCRA 5 1m");
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    assert!(e.contains("fixed") && e.contains("gcra"), "{e}");
    let e = run_err(&mut c, "RL.MULTI 2 a str GCRA 5 1m GCRA 5 1m");
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    assert!(!exists(&mut c, "a"), "a WRONGTYPE RL.MULTI wrote key a");
    assert_eq!(states(&mut c, &["f"]), before);
    // Correct algorithm: fine.
    assert_eq!(multi(&mut c, "RL.MULTI 2 a f GCRA 5 1m FIXED 5 1m").allowed, 1);
}

#[test]
fn algorithm_keywords_and_options_are_case_insensitive() {
    let s = Server::start();
    let mut c = s.conn();
    clock_set(&mut c, T0_US);
    let upper = "GCRA 5 1m BURST 7 TOKENBUCKET 5 1m SLIDING 5 1m SLIDINGLOG 5 1m FIXED 5 1m LEAKY 5 1m BURST 3";
    let mixed = "gcra 5 1M burst 7 TokenBucket 5 1m sliding 5 1m SlidingLog 5 1m fixed 5 1m Leaky 5 1m Burst 3";
    for (round, opts) in
        [("COST 2", "cost 2"), ("COST 9 PARTIAL", "partial Cost 9"), ("DRYRUN", "dryRun"), ("COST 0", "CoSt 0")]
            .iter()
            .enumerate()
    {
        let a = multi(&mut c, &format!("RL.MULTI 6 u1 u2 u3 u4 u5 u6 {upper} {}", opts.0));
        let b = multi(&mut c, &format!("RL.MULTI 6 m1 m2 m3 m4 m5 m6 {mixed} {}", opts.1));
        assert_eq!(a, b, "round {round}: {} vs {}", opts.0, opts.1);
        for i in 1..=6 {
            assert_eq!(dump(&mut c, &format!("u{i}")), dump(&mut c, &format!("m{i}")), "round {round}, key {i}");
        }
        clock_advance(&mut c, 2_000_000);
    }
    // The algorithm names as RL.INFO reports them.
    let info = common::rl_info(&mut c, "m2").expect("RL.INFO m2");
    assert_eq!(info.algorithm(), "tokenbucket");
}

#[test]
fn resp3_reply_is_a_map() {
    let s = Server::start();
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/?protocol=resp3", s.port)).unwrap();
    let mut c3 = client.get_connection().unwrap();
    let mut c2 = s.conn();
    clock_set(&mut c2, T0_US);

    fn as_map(v: &Value) -> Vec<(String, Value)> {
        match v {
            Value::Map(m) => m.iter().map(|(k, v)| (text(k), v.clone())).collect(),
            other => panic!("expected a RESP3 map, got {other:?}"),
        }
    }
    let check = |c3: &mut Connection, c2: &mut Connection, k3: &str, k2: &str, rest: &str, algos: &[&str]| {
        let n = algos.len();
        let v3 = run(c3, &format!("RL.MULTI {n} {k3} {rest}"));
        let v2 = multi(c2, &format!("RL.MULTI {n} {k2} {rest}"));
        let m = as_map(&v3);
        let names: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["allowed", "retry_after_ms", "limits"], "{v3:?}");
        let m3 = MultiReply::of(&v3);
        assert_eq!((m3.allowed, m3.retry_after_ms), (v2.allowed, v2.retry_after_ms));
        let Some((_, Value::Array(limits))) = m.last() else { panic!("limits is not an array: {v3:?}") };
        assert_eq!(limits.len(), n);
        for ((l, algo), r2) in limits.iter().zip(algos).zip(&v2.limits) {
            let lm = as_map(l);
            let names: Vec<&str> = lm.iter().map(|(k, _)| k.as_str()).collect();
            let want = if *algo == "LEAKY" { &LIMITER_FIELDS[..] } else { &LIMITER_FIELDS[..5] };
            assert_eq!(names, want, "{algo}: {l:?}");
            let vals: Vec<i64> = lm.iter().map(|(_, v)| int(v)).collect();
            assert_eq!(*r2, vals, "{algo}: RESP3 values vs RESP2");
        }
    };
    let algos = ["GCRA", "LEAKY", "SLIDINGLOG"];
    let rest = "GCRA 2 1m LEAKY 2 1m SLIDINGLOG 2 1m";
    check(&mut c3, &mut c2, "a b c", "x y z", rest, &algos); // admitted
    check(&mut c3, &mut c2, "a b c", "x y z", &format!("{rest} COST 0"), &algos); // peek
    check(&mut c3, &mut c2, "a b c", "x y z", &format!("{rest} COST 2"), &algos); // refused
    check(&mut c3, &mut c2, "a b c", "x y z", &format!("{rest} COST 2 PARTIAL"), &algos); // partial
    check(&mut c3, &mut c2, "a b c", "x y z", &format!("{rest} COST 3"), &algos); // never
    let algos = ["TOKENBUCKET", "SLIDING", "FIXED"];
    check(&mut c3, &mut c2, "d e f", "u v w", "TOKENBUCKET 1 1m SLIDING 1 1m FIXED 1 1m DRYRUN", &algos);
}

#[test]
fn command_getkeys_reports_the_keys() {
    let s = Server::start();
    let mut c = s.conn();
    let keys: Vec<String> = "COMMAND GETKEYS RL.MULTI 2 a b GCRA 1 1 FIXED 1 1".cmd().query(&mut c).unwrap();
    assert_eq!(keys, vec!["a", "b"]);
    let keys: Vec<String> =
        "COMMAND GETKEYS RL.MULTI 3 x GCRA y GCRA 1 1 SLIDING 1 1 LEAKY 1 1 COST 2".cmd().query(&mut c).unwrap();
    assert_eq!(keys, vec!["x", "GCRA", "y"]);
    let keys: Vec<String> = "COMMAND GETKEYS RL.MULTI 1 k gcra 1 1".cmd().query(&mut c).unwrap();
    assert_eq!(keys, vec!["k"]);
}

#[test]
fn acl_key_patterns_cover_every_key() {
    let s = Server::start();
    let mut admin = s.conn();
    let _: () = "ACL SETUSER t1 on >pw ~{t1}:* +@all".cmd().query(&mut admin).unwrap();
    let client = redis::Client::open(format!("redis://t1:pw@127.0.0.1:{}/", s.port)).unwrap();
    let mut c = client.get_connection().unwrap();
    let who: String = redis::cmd("ACL").arg("WHOAMI").query(&mut c).unwrap();
    assert_eq!(who, "t1");

    for line in [
        "RL.MULTI 2 {t1}:a {t2}:b GCRA 1 1m GCRA 1 1m",
        "RL.MULTI 2 {t2}:b {t1}:a GCRA 1 1m GCRA 1 1m",
        "RL.MULTI 3 {t1}:a {t1}:c other FIXED 1 1m FIXED 1 1m SLIDINGLOG 1 1m",
        "RL.MULTI 2 {t1}:a {t2}:b GCRA 1 1m GCRA 1 1m DRYRUN",
        "RL.MULTI 2 {t1}:a {t2}:b GCRA 1 1m GCRA 1 1m COST 0",
        "RL.GCRA {t2}:b 1 1m",
    ] {
        let e = run_err(&mut c, line);
        assert!(e.starts_with("NOPERM"), "`{line}` as t1: {e}");
    }
    for k in ["{t1}:a", "{t1}:c", "{t2}:b", "other"] {
        assert!(!exists(&mut admin, k), "{k} was written by a refused command");
    }
    let m = multi(&mut c, "RL.MULTI 2 {t1}:a {t1}:b GCRA 1 1m GCRA 1 1m");
    assert_eq!(m.allowed, 1);
    assert!(exists(&mut admin, "{t1}:a") && exists(&mut admin, "{t1}:b"));
    // The default user may touch anything.
    assert_eq!(multi(&mut admin, "RL.MULTI 2 {t1}:c {t2}:b GCRA 1 1m GCRA 1 1m").allowed, 1);
}

// ---------------------------------------------------------------------------------------------
// Replication
// ---------------------------------------------------------------------------------------------

#[test]
fn replica_identical_after_random_multi_traffic() {
    let primary = Server::start();
    let replica = Server::start_with(Opts { replica_of: Some(primary.port), ..Default::default() });
    wait_replica_synced(&primary, &replica);
    let mut p = primary.conn();
    clock_set(&mut p, T0_US);
    let mut rng = Rng::new(0x0A11_0F17);
    // Key j always holds algorithm ALGOS[j % 6]; parameters change now and then.
    let mut specs: HashMap<usize, String> = HashMap::new();
    let random_spec = |rng: &mut Rng, algo: &str| -> String {
        if matches!(algo, "GCRA" | "TOKENBUCKET" | "LEAKY") {
            let mut s = format!(
                "{} {} {}",
                algo,
                rng.pick(&[1, 2, 5, 10, 30]),
                rng.pick(&["1m", "90s", "10m", "1h", "600000ms", "5s"])
            );
            if rng.chance(40) {
                s.push_str(&format!(" BURST {}", rng.pick(&[1, 3, 8, 40])));
            }
            s
        } else {
            format!("{} {} {}", algo, rng.pick(&[1, 3, 10, 50]), rng.pick(&["1m", "5m", "1h", "30s", "10s"]))
        }
    };
    let (mut admitted, mut refused) = (0, 0);
    for _ in 0..2500 {
        if rng.chance(35) {
            let d = if rng.chance(12) { -rng.range(1, 4_000_000) } else { rng.range(0, 15_000_000) };
            clock_advance(&mut p, d);
        }
        let n = rng.range(1, 4) as usize;
        let mut idx: Vec<usize> = Vec::new();
        while idx.len() < n {
            let j = rng.below(18) as usize;
            if !idx.contains(&j) {
                idx.push(j);
            }
        }
        let mut line = format!("RL.MULTI {n}");
        for j in &idx {
            line.push_str(&format!(" {{t}}:k{j}"));
        }
        for j in &idx {
            if !specs.contains_key(j) || rng.chance(6) {
                specs.insert(*j, random_spec(&mut rng, ALGOS[j % 6]));
            }
            line.push(' ');
            line.push_str(&specs[j]);
        }
        match rng.below(10) {
            0 => line.push_str(" COST 0"),
            1 | 2 => line.push_str(&format!(" COST {}", rng.range(1, 12))),
            _ => {}
        }
        if rng.chance(8) {
            line.push_str(" DRYRUN");
        }
        if rng.chance(25) {
            line.push_str(" PARTIAL");
        }
        let m = multi(&mut p, &line);
        assert_eq!(m.limits.len(), n, "{line}: {m:?}");
        if m.allowed > 0 {
            admitted += 1;
        } else {
            refused += 1;
        }
        if rng.chance(1) {
            let j = rng.below(18);
            run(&mut p, &format!("RL.RESET {{t}}:k{j}"));
        }
    }
    assert!(admitted > 300 && refused > 100, "admitted {admitted}, refused {refused}");
    wait_replica_synced(&primary, &replica);
    let mut r = replica.conn();
    let sp = snapshot(&mut p);
    let sr = snapshot(&mut r);
    let n = assert_same(&sp, &sr, now_ms(), "primary vs replica after RL.MULTI traffic");
    assert!(n >= 12, "only {n} keys compared");
    let stats = replica.info("commandstats");
    assert!(stats.contains("cmdstat_rl.setstate:"), "{stats}");
    assert!(!stats.contains("cmdstat_rl.multi:"), "the replica ran RL.MULTI itself:\n{stats}");
}

// ---------------------------------------------------------------------------------------------
// Cluster
// ---------------------------------------------------------------------------------------------

/// (slot, port) of a MOVED error.
fn moved(e: &redis::RedisError) -> (i64, u16) {
    assert_eq!(e.code(), Some("MOVED"), "expected MOVED, got {}", err_text(e));
    let detail = e.detail().unwrap_or_default();
    let mut parts = detail.split_whitespace();
    let slot: i64 = parts.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("MOVED {detail}"));
    let addr = parts.next().unwrap_or_else(|| panic!("MOVED {detail}"));
    let port: u16 = addr.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("MOVED {detail}"));
    (slot, port)
}

#[test]
fn cluster_slots_moved_and_crossslot() {
    let cluster = Cluster::start(3, 0);
    let owner = cluster.primary_for_key(b"{tenant}:ip");
    let other = cluster.nodes.iter().find(|n| n.port != owner.port).unwrap();
    let mut oc = owner.conn();
    let mut wc = other.conn();
    let slot = keyslot(&mut oc, "{tenant}:ip");
    assert_eq!(slot, keyslot(&mut oc, "{tenant}:user"));

    // The wrong node redirects, for RL.MULTI and a single-key command alike.
    let line = "RL.MULTI 2 {tenant}:ip {tenant}:user GCRA 10 1m SLIDINGLOG 100 1h";
    let e = try_run(&mut wc, line).unwrap_err();
    assert_eq!(moved(&e), (slot, owner.port), "{}", err_text(&e));
    // The owner admits, all keys in one slot.
    let m = multi(&mut oc, line);
    assert_eq!(m.allowed, 1, "{m:?}");
    assert_eq!(m.limits, [vec![1, 10, 9, -1, 6000], vec![1, 100, 99, -1, 3_600_000]]);
    assert!(exists(&mut oc, "{tenant}:ip") && exists(&mut oc, "{tenant}:user"));

    // Keys in different slots: CROSSSLOT, wherever it is sent; nothing written.
    let (k1, k2) = ("{alpha}:ip", "{beta}:ip");
    assert_ne!(keyslot(&mut oc, k1), keyslot(&mut oc, k2));
    let cross = format!("RL.MULTI 2 {k1} {k2} GCRA 10 1m GCRA 10 1m");
    for n in &cluster.nodes {
        let mut c = n.conn();
        let e = try_run(&mut c, &cross).unwrap_err();
        assert_eq!(e.code(), Some("CROSSSLOT"), "node {}: {}", n.port, err_text(&e));
    }
    for k in [k1, k2] {
        let mut c = cluster.primary_for_key(k.as_bytes()).conn();
        assert!(!exists(&mut c, k), "{k} written by a CROSSSLOT RL.MULTI");
    }
    // Also CROSSSLOT with a key in the owner's own slot first.
    let e = try_run(&mut oc, "RL.MULTI 2 {tenant}:ip {beta}:ip GCRA 10 1m GCRA 10 1m").unwrap_err();
    assert_eq!(e.code(), Some("CROSSSLOT"), "{}", err_text(&e));

    // A hash-tagged RL.GCRA key followed through MOVED.
    let key = "{user:42}:api";
    let mut port = cluster.nodes[0].port;
    let mut hops = 0;
    let reply = loop {
        let node = cluster.node_by_port(port).expect("MOVED to an unknown node");
        let mut c = node.conn();
        match try_run(&mut c, &format!("RL.GCRA {key} 5 1m COST 2")) {
            Ok(v) => break LimiterReply::of(&v),
            Err(e) => {
                let (s, p) = moved(&e);
                assert_eq!(s, keyslot(&mut c, key));
                port = p;
                hops += 1;
                assert!(hops <= 2, "redirected more than twice");
            }
        }
    };
    assert_eq!(reply, vec![2, 5, 3, -1, 24000]);
    assert_eq!(port, cluster.primary_for_key(key.as_bytes()).port);
    let mut c = cluster.node_by_port(port).unwrap().conn();
    let again = limiter(&mut c, &format!("RL.GCRA {key} 5 1m COST 0"));
    assert_eq!((again.allowed, again.limit, again.remaining), (0, 5, 3));
    // RL.MULTI with two keys of that tag on the owner.
    let m = multi(&mut c, "RL.MULTI 2 {user:42}:api {user:42}:login GCRA 5 1m FIXED 3 1h");
    assert_eq!(m.allowed, 1);
    assert_eq!((m.limits[0].allowed, m.limits[0].limit, m.limits[0].remaining), (1, 5, 2));
}

// ---------------------------------------------------------------------------------------------
// PARTIAL on single-key commands
// ---------------------------------------------------------------------------------------------

/// On a scripted random timeline per algorithm, key A gets `COST n PARTIAL` and key B gets n
/// single COST 1 calls at the same instant: A's grant never exceeds what B admitted (and, as
/// documented, equals min(n, available)); afterwards both keys answer peeks identically. A
/// third key gets the same PARTIAL request through a one-limit RL.MULTI: same reply, same state.
#[test]
fn partial_never_exceeds_single_calls() {
    let s = Server::start();
    let mut c = s.conn();
    let mut rng = Rng::new(0x09A2_71A1);
    let mut failures = Vec::new();
    for algo in ALGOS {
        clock_set(&mut c, T0_US + rng.range(0, 9_999_999));
        let (a, b, m) = (format!("pa:{algo}"), format!("pb:{algo}"), format!("pm:{algo}"));
        let bucket = matches!(algo, "GCRA" | "TOKENBUCKET" | "LEAKY");
        let mut spec = if bucket { "10 10s BURST 15".to_string() } else { "10 10s".to_string() };
        for step in 0..120 {
            let r = rng.below(100);
            let d = if r < 8 {
                -rng.range(1, 800_000)
            } else if r < 14 {
                rng.range(5_000_000, 25_000_000)
            } else {
                rng.range(0, 2_500_000)
            };
            clock_advance(&mut c, d);
            if rng.chance(8) {
                spec = if bucket {
                    format!(
                        "{} {} BURST {}",
                        rng.pick(&[5, 10, 20]),
                        rng.pick(&["10s", "5s", "20s"]),
                        rng.pick(&[5, 15, 30])
                    )
                } else {
                    format!("{} {}", rng.pick(&[5, 10, 20]), rng.pick(&["10s", "5s", "20s"]))
                };
            }
            let cap: i64 = {
                let w: Vec<&str> = spec.split_whitespace().collect();
                if bucket {
                    w[3].parse().unwrap()
                } else {
                    w[0].parse().unwrap()
                }
            };
            let n = rng.range(1, cap + 3);
            let peek_a = limiter(&mut c, &format!("RL.{algo} {a} {spec} COST 0"));
            let ra = limiter(&mut c, &format!("RL.{algo} {a} {spec} COST {n} PARTIAL"));
            let g = ra.allowed;
            // RL.MULTI with that one limit answers exactly as the single-key command.
            let rm = multi(&mut c, &format!("RL.MULTI 1 {m} {algo} {spec} COST {n} PARTIAL"));
            if rm.limits[0] != ra || rm.allowed != g || rm.retry_after_ms != ra.retry_after_ms {
                failures.push(format!("{algo} step {step}: RL.MULTI 1 {rm:?} vs single {ra:?}"));
            }
            let mut admitted = 0;
            for _ in 0..n {
                if limiter(&mut c, &format!("RL.{algo} {b} {spec}")).allowed == 1 {
                    admitted += 1;
                }
            }
            let ctx = format!("{algo} step {step} spec `{spec}` n {n}: PARTIAL reply {ra:?}, single calls admitted {admitted}, peek before {peek_a:?}");
            if g > admitted {
                failures.push(format!("PARTIAL granted more than single calls: {ctx}"));
            } else if g != admitted {
                failures.push(format!("PARTIAL granted less than single calls: {ctx}"));
            }
            if g != n.min(peek_a.remaining) {
                failures.push(format!("PARTIAL grant is not min(COST, remaining before): {ctx}"));
            }
            if g == 0 && ra.retry_after_ms <= 0 {
                failures.push(format!("PARTIAL refused without a retry_after: {ctx}"));
            }
            let pa = limiter(&mut c, &format!("RL.{algo} {a} {spec} COST 0"));
            let pb = limiter(&mut c, &format!("RL.{algo} {b} {spec} COST 0"));
            if pa != pb {
                failures.push(format!("after the step, peeks differ: A {pa:?} vs B {pb:?}: {ctx}"));
            }
            if dump(&mut c, &a) != dump(&mut c, &m) {
                failures.push(format!("after the step, RL.MULTI's key and the single-key command's key differ: {ctx}"));
            }
            if !failures.is_empty() {
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
