//! RL.RETURN against a real redis-server: every algorithm, the capacity cap, the window rule and
//! AGE, every error (and that an error writes nothing), replication as an effect (a replica
//! byte-identical by DUMP and DEBUG DIGEST, a return that credits nothing propagates nothing),
//! and an AOF replay. The module clock is the DEBUG_CLOCK; TTLs stay on the server's clock.

mod common;
#[path = "common/traffic.rs"]
mod traffic;

use common::{
    clock_advance, clock_set, err_text, limiter, now_ms, pttl, redis_cell_keys, redis_cell_set, rl_info_int, run,
    run_err, try_run, wait_replica_synced, Opts, Rng, Server,
};
use redis::{Connection, Value};
use traffic::{assert_same, snapshot};

/// A multiple of 1 h (and so of every window used here), in µs.
const T0_US: i64 = 1_699_999_200_000_000;
const SEC_US: i64 = 1_000_000;

/// RL.RETURN's reply: the units credited.
fn give(c: &mut Connection, args: &[&str]) -> i64 {
    let mut all = vec!["RL.RETURN"];
    all.extend_from_slice(args);
    match try_run(c, &all) {
        Ok(Value::Int(n)) => n,
        other => panic!("{all:?}: {other:?}"),
    }
}

/// RL.RETURN on a key that may have just expired (a full bucket, an empty window): 0 for
/// the missing key's error.
fn give_or_gone(c: &mut Connection, args: &[&str]) -> i64 {
    let mut all = vec!["RL.RETURN"];
    all.extend_from_slice(args);
    match try_run(c, &all) {
        Ok(Value::Int(n)) => n,
        Err(e) if err_text(&e).starts_with("ERR no limiter at this key") => 0,
        other => panic!("{all:?}: {other:?}"),
    }
}

#[test]
fn buckets_take_units_back_up_to_their_capacity() {
    let s = Server::start();
    let mut c = s.conn();
    clock_set(&mut c, T0_US);
    for algo in ["RL.GCRA", "RL.TOKENBUCKET"] {
        let key = format!("b:{algo}");
        let k = key.as_str();
        // 10 per minute, a batch of 7 claimed.
        assert_eq!(limiter(&mut c, &[algo, k, "10", "1m", "COST", "7", "PARTIAL"]).allowed, 7);
        assert_eq!(give(&mut c, &[k, "4"]), 4, "{algo}");
        let d = limiter(&mut c, &[algo, k, "10", "1m", "COST", "0"]);
        assert_eq!(d.remaining, 7, "{algo}: remaining after giving 4 of 7 back");
        // The TTL is the new reset_after: 3 units owed at 6 s each.
        let ttl = pttl(&mut c, k);
        assert!((17_000..=18_000).contains(&ttl), "{algo}: PTTL {ttl}");
        // 1 unit refills in 6 s: units out for 6 s come back less one.
        assert_eq!(give(&mut c, &[k, "1", "AGE", "6000"]), 0, "{algo}: all of it refilled meanwhile");
        assert_eq!(give(&mut c, &[k, "2", "AGE", "6000"]), 1, "{algo}");
        // 2 owed: giving 100 back credits 2, the bucket is full, never fuller.
        assert_eq!(give(&mut c, &[k, "100"]), 2, "{algo}");
        // A full bucket's state is a missing key's: it expires right away (1 ms), so what
        // follows may find the key gone; either way it is full and nothing more comes back.
        assert!(pttl(&mut c, k) <= 1, "{algo}");
        assert_eq!(limiter(&mut c, &[algo, k, "10", "1m", "COST", "0"]).remaining, 10, "{algo}");
        assert_eq!(give_or_gone(&mut c, &[k, "1"]), 0, "{algo}: a full bucket");
        // 3 claimed, 12 s pass (2 refilled), 3 returned: 3 − 2 = 1 comes back, full again.
        clock_set(&mut c, T0_US);
        let k2 = format!("b2:{algo}");
        assert_eq!(limiter(&mut c, &[algo, k2.as_str(), "10", "1m", "COST", "3"]).allowed, 3);
        clock_advance(&mut c, 12 * SEC_US);
        assert_eq!(give(&mut c, &[&k2, "3", "AGE", "12000"]), 1, "{algo}");
        assert_eq!(limiter(&mut c, &[algo, k2.as_str(), "10", "1m", "COST", "0"]).remaining, 10);
        clock_set(&mut c, T0_US);
    }
}

#[test]
fn windows_take_units_back_only_into_the_claims_window() {
    let s = Server::start();
    let mut c = s.conn();
    for algo in ["RL.FIXED", "RL.SLIDING"] {
        let key = format!("w:{algo}");
        let k = key.as_str();
        // Claim 6 of 10 at 10 s into a 1-minute window.
        clock_set(&mut c, T0_US + 10 * SEC_US);
        assert_eq!(limiter(&mut c, &[algo, k, "10", "1m", "COST", "6", "PARTIAL"]).allowed, 6);
        clock_advance(&mut c, 20 * SEC_US);
        // Claimed 20 s ago (at most): the claim was in this window.
        assert_eq!(give(&mut c, &[k, "2", "AGE", "20000"]), 2, "{algo}");
        assert_eq!(limiter(&mut c, &[algo, k, "10", "1m", "COST", "0"]).remaining, 6, "{algo}");
        // The TTL is the new reset_after.
        let ttl = pttl(&mut c, k);
        let expected = if algo == "RL.FIXED" { 30_000 } else { 90_000 };
        assert!((expected - 1000..=expected).contains(&ttl), "{algo}: PTTL {ttl}");
        // An AGE reaching into the previous window proves nothing: no credit.
        assert_eq!(give(&mut c, &[k, "2", "AGE", "30001"]), 0, "{algo}");
        // Never more than the window counts.
        assert_eq!(give(&mut c, &[k, "100", "AGE", "0"]), 4, "{algo}");
        // Nothing counted any more: the key expires at once (1 ms) and may be gone already.
        assert_eq!(give_or_gone(&mut c, &[k, "1", "AGE", "0"]), 0, "{algo}");
        // Units taken in one window are gone once it has passed.
        assert_eq!(limiter(&mut c, &[algo, k, "10", "1m", "COST", "5"]).allowed, 5);
        clock_advance(&mut c, 30 * SEC_US);
        assert_eq!(give(&mut c, &[k, "5", "AGE", "0"]), 0, "{algo}: the window has passed");
        assert_eq!(give(&mut c, &[k, "5", "AGE", "30000"]), 0, "{algo}");
    }
    // The sliding counter's previous window keeps counting: only the current count comes back.
    clock_set(&mut c, T0_US);
    limiter(&mut c, &["RL.SLIDING", "w:prev", "10", "1m", "COST", "4"]);
    clock_advance(&mut c, 70 * SEC_US);
    limiter(&mut c, &["RL.SLIDING", "w:prev", "10", "1m", "COST", "2"]);
    assert_eq!(give(&mut c, &["w:prev", "6", "AGE", "0"]), 2);
    assert_eq!(rl_info_int(&mut c, "w:prev", "previous"), 4);
    assert_eq!(rl_info_int(&mut c, "w:prev", "current"), 0);
}

#[test]
fn errors_name_the_problem_and_write_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    clock_set(&mut c, T0_US);
    limiter(&mut c, &["RL.GCRA", "g", "10", "1m", "COST", "5"]);
    limiter(&mut c, &["RL.FIXED", "f", "10", "1m", "COST", "5"]);
    limiter(&mut c, &["RL.SLIDING", "s", "10", "1m", "COST", "5"]);
    limiter(&mut c, &["RL.SLIDINGLOG", "l", "10", "1m", "COST", "5"]);
    limiter(&mut c, &["RL.LEAKY", "q", "10", "1m", "COST", "5"]);
    let _: () = redis::cmd("SET").arg("str").arg("x").query(&mut c).unwrap();
    let _: () = redis::cmd("RPUSH").arg("list").arg("x").query(&mut c).unwrap();
    // A key redis-cell left: an arrival time, without its rate (the RL.* commands leave it to
    // CL.THROTTLE unless the module is loaded with REDIS_CELL_KEYS).
    let cell = redis_cell_set("cell", (T0_US + 10_000_000) * 1000, T0_US * 1000);
    run(&mut c, &cell);
    let before = snapshot(&mut c);
    let wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value";
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["RL.RETURN", "missing", "1"], "ERR no limiter at this key"),
        (vec!["RL.RETURN", "str", "1"], wrongtype),
        (vec!["RL.RETURN", "list", "1", "AGE", "5"], wrongtype),
        (vec!["RL.RETURN", "cell", "1"], "WRONGTYPE the key holds a redis-cell arrival time"),
        (vec!["RL.RETURN", "l", "1"], "ERR RL.RETURN does not support the sliding log"),
        (vec!["RL.RETURN", "l", "1", "AGE", "0"], "ERR RL.RETURN does not support the sliding log"),
        (vec!["RL.RETURN", "q", "1"], "ERR RL.RETURN does not support the leaky bucket"),
        (vec!["RL.RETURN", "q", "5", "AGE", "0"], "ERR RL.RETURN does not support the leaky bucket"),
        (vec!["RL.RETURN", "f", "1"], "ERR AGE is required for window limiters"),
        (vec!["RL.RETURN", "s", "1"], "ERR AGE is required for window limiters"),
        (vec!["RL.RETURN", "g", "0"], "ERR n must be a positive integer"),
        (vec!["RL.RETURN", "g", "-1"], "ERR n must be a positive integer"),
        (vec!["RL.RETURN", "g", "1.5"], "ERR n must be a positive integer"),
        (vec!["RL.RETURN", "g", ""], "ERR n must be a positive integer"),
        (
            vec!["RL.RETURN", "g", "1000000000000001"],
            "ERR n must be a positive integer no larger than 1000000000000000",
        ),
        (vec!["RL.RETURN", "g", "99999999999999999999999"], "ERR n must be a positive integer no larger than"),
        (vec!["RL.RETURN", "f", "1", "AGE", "-1"], "ERR AGE must be a non-negative integer"),
        (vec!["RL.RETURN", "f", "1", "AGE", "1s"], "ERR AGE must be a non-negative integer"),
        (
            vec!["RL.RETURN", "f", "1", "AGE", "1000000000000001"],
            "ERR AGE must be a non-negative integer no larger than",
        ),
        (vec!["RL.RETURN", "f", "1", "AGE"], "ERR AGE needs a value"),
        (vec!["RL.RETURN", "f", "1", "AGE", "1", "AGE", "1"], "ERR option AGE given more than once"),
        (vec!["RL.RETURN", "g", "1", "COST", "1"], "ERR unknown option 'COST'"),
        // Arguments are checked before the key.
        (vec!["RL.RETURN", "missing", "0"], "ERR n must be a positive integer"),
        (vec!["RL.RETURN", "str", "x"], "ERR n must be a positive integer"),
    ];
    for (args, expected) in &cases {
        let e = run_err(&mut c, args);
        assert!(e.starts_with(expected), "{args:?}: {e}");
    }
    // Arity is Redis's own (declared -3): test the code, not the sentence.
    for args in [vec!["RL.RETURN"], vec!["RL.RETURN", "g"]] {
        let e = try_run(&mut c, &args).unwrap_err();
        assert_eq!(e.code(), Some("ERR"), "{args:?}: {e}");
    }
    let after = snapshot(&mut c);
    assert_same(&before, &after, 0, "before vs after the errors");
    assert_eq!(before.len(), after.len());
    // Every reply is an integer, under RESP3 too.
    let _: Value = redis::cmd("HELLO").arg("3").query(&mut c).unwrap();
    assert_eq!(give(&mut c, &["g", "1"]), 1);

    // With REDIS_CELL_KEYS the RL.* commands read redis-cell keys: RL.RETURN still has no rate.
    let s = Server::start_with(redis_cell_keys());
    let mut c = s.conn();
    clock_set(&mut c, T0_US);
    run(&mut c, &cell);
    let e = run_err(&mut c, &["RL.RETURN", "cell", "1"]);
    assert!(e.starts_with("ERR RL.RETURN needs the key's rate"), "{e}");
}

/// Random claims and returns on every algorithm: the replica holds byte-identical state (DUMP,
/// absolute expiry, DEBUG DIGEST) and both AOFs hold RL.SETSTATE, never RL.RETURN; a return that credits nothing
/// moves no replication offset; an AOF replay restores the same keys.
#[test]
fn returns_replicate_as_effects_and_replay_from_the_aof() {
    let primary = Server::start_with(Opts {
        appendonly: true,
        extra: vec![("repl-ping-replica-period".into(), "3600".into())],
        ..Default::default()
    });
    let replica = Server::start_with(Opts { replica_of: Some(primary.port), appendonly: true, ..Default::default() });
    wait_replica_synced(&primary, &replica);
    let mut p = primary.conn();
    let mut r = replica.conn();
    clock_set(&mut p, T0_US);
    let algos = ["RL.GCRA", "RL.TOKENBUCKET", "RL.LEAKY", "RL.FIXED", "RL.SLIDING"];
    let mut rng = Rng::new(0x5EED_0011);
    let mut credited_total = 0;
    for i in 0..600 {
        let algo = *rng.pick(&algos);
        let key = format!("r:{algo}:{}", rng.below(8));
        let limit = ["5", "10", "1000"][rng.below(3) as usize];
        let window = ["1s", "1m", "1h"][rng.below(3) as usize];
        if rng.chance(50) || i < 20 {
            let cost = (1 + rng.below(12)).to_string();
            run(&mut p, &[algo, key.as_str(), limit, window, "COST", cost.as_str(), "PARTIAL"]);
        } else {
            let n = (1 + rng.below(8)).to_string();
            let age = rng.below(90_000).to_string();
            match try_run(&mut p, &["RL.RETURN", key.as_str(), n.as_str(), "AGE", age.as_str()]) {
                Ok(Value::Int(k)) => credited_total += k,
                Ok(v) => panic!("{v:?}"),
                // A key that expired, or a leaky bucket (refused).
                Err(e) => assert_eq!(e.code(), Some("ERR"), "{e}"),
            }
        }
        clock_advance(&mut p, rng.below(3_000_000) as i64);
    }
    assert!(credited_total > 100, "only {credited_total} units credited: the traffic is too tame");
    wait_replica_synced(&primary, &replica);
    assert_same(&snapshot(&mut p), &snapshot(&mut r), now_ms(), "primary vs replica");
    // DEBUG DIGEST of the whole dataset (values and expiries); retried while a key expires
    // between the two reads.
    let digest = |c: &mut Connection| -> String { redis::cmd("DEBUG").arg("DIGEST").query(c).unwrap() };
    let mut same = false;
    for _ in 0..20 {
        let d1 = digest(&mut p);
        wait_replica_synced(&primary, &replica);
        let dr = digest(&mut r);
        if d1 == digest(&mut p) {
            assert_eq!(d1, dr, "DEBUG DIGEST: primary vs replica");
            same = true;
            break;
        }
    }
    assert!(same, "the dataset kept changing");

    // Returns that credit nothing write and propagate nothing.
    clock_set(&mut p, T0_US + 3_600 * SEC_US);
    run(&mut p, &["RL.GCRA", "q:full", "10", "1h"]);
    give(&mut p, &["q:full", "5"]); // now full, expiring
    run(&mut p, &["RL.GCRA", "q:gcra", "10", "1h", "COST", "3"]);
    run(&mut p, &["RL.GCRA", "q:gcra", "10", "1h", "COST", "0"]);
    run(&mut p, &["RL.FIXED", "q:fixed", "10", "1h", "COST", "3"]);
    run(&mut p, &["RL.SLIDING", "q:sliding", "10", "1h", "COST", "3"]);
    run(&mut p, &["RL.SLIDINGLOG", "q:log", "10", "1h", "COST", "3"]);
    give(&mut p, &["q:gcra", "3"]);
    run(&mut p, &["RL.GCRA", "q:gcra", "10", "1h", "COST", "2"]);
    clock_advance(&mut p, 3_600 * SEC_US);
    wait_replica_synced(&primary, &replica);
    let quiet: Vec<Vec<&str>> = vec![
        vec!["RL.RETURN", "q:fixed", "3", "AGE", "0"],   // its window has passed
        vec!["RL.RETURN", "q:sliding", "3", "AGE", "0"], // likewise (now the previous window)
        vec!["RL.RETURN", "q:gcra", "3"],                // refilled: full
        vec!["RL.RETURN", "q:log", "3"],
        vec!["RL.RETURN", "q:missing", "3"],
        vec!["RL.RETURN", "q:gcra", "0"],
    ];
    // The random traffic's keys have real TTLs of seconds: their expiry (a propagated DEL)
    // must not land between two reads of the offset.
    let _: () = redis::cmd("DEBUG").arg("SET-ACTIVE-EXPIRE").arg(0).query(&mut p).unwrap();
    for args in &quiet {
        let before = primary.repl_offset();
        let v = try_run(&mut p, args);
        assert!(matches!(v, Ok(Value::Int(0)) | Err(_)), "{args:?}: {v:?}");
        assert_eq!(primary.repl_offset(), before, "{args:?} ({v:?}) moved the replication offset");
    }
    let _: () = redis::cmd("DEBUG").arg("SET-ACTIVE-EXPIRE").arg(1).query(&mut p).unwrap();
    // A crediting return does move it.
    run(&mut p, &["RL.FIXED", "q:fixed", "10", "1h", "COST", "3"]);
    let before = primary.repl_offset();
    assert_eq!(give(&mut p, &["q:fixed", "2", "AGE", "0"]), 2);
    assert!(primary.repl_offset() > before);
    wait_replica_synced(&primary, &replica);
    assert_same(&snapshot(&mut p), &snapshot(&mut r), now_ms(), "primary vs replica after the quiet calls");

    // The replica's AOF and the primary's: only effects, never the command.
    for (name, s) in [("primary", &primary), ("replica", &replica)] {
        let dir = s.dir.join("appendonlydir");
        let mut all = Vec::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            all.extend(std::fs::read(e.unwrap().path()).unwrap());
        }
        let text = String::from_utf8_lossy(&all).to_ascii_uppercase();
        assert!(!text.contains("RL.RETURN"), "{name}'s AOF holds RL.RETURN");
        assert!(text.contains("RL.SETSTATE"), "{name}'s AOF holds no RL.SETSTATE");
    }

    // AOF replay: the primary restarted from its AOF holds what it held.
    let before = snapshot(&mut p);
    drop(p);
    drop(r);
    drop(replica);
    let mut primary = primary;
    primary.restart();
    let mut p = primary.conn();
    let n = assert_same(&before, &snapshot(&mut p), now_ms(), "AOF: before vs after restart");
    assert!(n >= 15, "only {n} keys compared");
}
