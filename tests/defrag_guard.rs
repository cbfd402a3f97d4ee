//! Active defragmentation on Valkey 8.0 (issue 17.2). Valkey 8.0's defragmentation moves a
//! database dict that is rehashing and leaves its old address in the kvstore's rehashing list;
//! `activerehashing` then rehashes the freed copy while lookups rehash the live one, and the
//! server asserts at `dict.c:487` or crashes in `dictRehash` (valkey-io/valkey#1512). A server
//! bug: the same sequence with plain strings and no module crashes it too. The module keeps
//! `activerehashing` off on Valkey 8.0 while defragmentation runs (`src/defrag_guard.rs`).
//!
//! The reproduction, in seconds: db 0's dicts are allocated among 80-byte strings of another
//! database that are then freed (so their slab is sparse and defragmentation moves them), a
//! burst of limiter keys leaves them rehashing, and `activedefrag` goes on in the same pipeline;
//! checks in MULTI/EXEC follow. Without the guard Valkey 8.0.1 died within ~1 s of checks in every
//! run (6 of 6, with this module's keys; 8 of 8 with plain strings and no module).

mod common;

use std::time::{Duration, Instant};

use common::{info_field, wait_until, Opts, Server};

/// Keys in db 0: one past a power of two, so the last insert starts a rehash of 2^17 buckets.
const KEYS: usize = (1 << 17) + 1;
/// Strings per half of the filler around db 0's dicts (80-byte allocations, as the dicts).
const FILLER: usize = 40_000;
const TRAFFIC: Duration = Duration::from_secs(10);
const WARNING: &str = "can crash when active defragmentation moves a dict";

/// Valkey 8.0.x, the servers with the bug.
fn affected(s: &Server) -> bool {
    s.version().valkey.is_some_and(|(major, minor, _)| (major, minor) == (8, 0))
}

fn crash_lines(s: &Server) -> String {
    let log = s.log();
    let lines: Vec<&str> = log
        .lines()
        .skip_while(|l| !(l.contains("crashed by signal") || l.contains("ASSERTION FAILED")))
        .take(24)
        .collect();
    lines.join("\n")
}

#[test]
fn defragmenting_rehashing_dicts_does_not_crash_the_server() {
    let s = Server::start_with(Opts { extra: vec![("hz".into(), "100".into())], ..Opts::default() });
    let v = s.version();
    if let Some(why) = s.defrag_unsupported() {
        println!("defrag_guard [{}]: skipped: {why}", v.describe());
        return;
    }
    let filler = "v".repeat(76);
    let mut con = s.conn();
    let mut pipe = redis::pipe();
    pipe.cmd("SELECT").arg(9).ignore();
    for i in 0..FILLER {
        pipe.cmd("SET").arg(format!("a:{i}")).arg(&filler).ignore();
    }
    // db 0's first key allocates its dicts (keys and expires) among the filler.
    pipe.cmd("SELECT").arg(0).ignore();
    pipe.cmd("RL.GCRA").arg("k:0").arg(10).arg("1h").ignore();
    pipe.cmd("SELECT").arg(9).ignore();
    for i in 0..FILLER {
        pipe.cmd("SET").arg(format!("b:{i}")).arg(&filler).ignore();
    }
    pipe.cmd("FLUSHDB").arg("SYNC").ignore();
    pipe.cmd("SELECT").arg(0).ignore();
    let () = pipe.query(&mut con).unwrap();

    let mut pipe = redis::pipe();
    for i in 1..KEYS {
        pipe.cmd("RL.GCRA").arg(format!("k:{i}")).arg(10).arg("1h").ignore();
    }
    // In the same pipeline: the dicts are still rehashing when the first defrag pass starts.
    pipe.cmd("CONFIG")
        .arg("SET")
        .arg("activedefrag")
        .arg("yes")
        .arg("active-defrag-ignore-bytes")
        .arg(1)
        .arg("active-defrag-threshold-lower")
        .arg(1)
        .arg("active-defrag-cycle-min")
        .arg(50)
        .arg("active-defrag-cycle-max")
        .arg(90)
        .ignore();
    let () = pipe.query(&mut con).unwrap();

    let started = Instant::now();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut rounds = 0;
    while started.elapsed() < TRAFFIC {
        let mut pipe = redis::pipe();
        for _ in 0..200 {
            pipe.cmd("MULTI").ignore();
            for j in 0..4 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let key = format!("k:{}", rng % KEYS as u64);
                // COST 0 writes nothing: lookups alone are enough.
                let cost = if j == 0 { 0 } else { 1 };
                pipe.cmd("RL.GCRA").arg(key).arg(10).arg("1h").arg("COST").arg(cost).ignore();
            }
            pipe.cmd("EXEC").ignore();
        }
        if let Err(e) = pipe.query::<()>(&mut con) {
            panic!(
                "[{}] the server died after {:.1} s of checks with defragmentation on ({e}):\n{}",
                v.describe(),
                started.elapsed().as_secs_f64(),
                crash_lines(&s)
            );
        }
        rounds += 1;
    }
    assert!(s.alive(), "[{}] server gone:\n{}", v.describe(), crash_lines(&s));
    let hits: u64 = info_field(&s.info("stats"), "active_defrag_hits").unwrap_or("0").parse().unwrap();
    println!(
        "defrag_guard [{}]: {rounds} rounds of 200 MULTI/EXEC in {} s, active_defrag_hits {hits}, \
         defrag_guard {}, activerehashing {}",
        v.describe(),
        TRAFFIC.as_secs(),
        s.ratelimit_field("defrag_guard"),
        s.config_get("activerehashing")
    );
    if affected(&s) {
        // Defragmentation did run (it is what moves the dicts).
        assert!(hits > 0, "no defragmentation ran:\n{}", s.info("stats"));
        assert_eq!(s.ratelimit_field("defrag_guard"), "active");
        assert_eq!(s.ratelimit_field("defrag_crash_risk"), "no");
        assert_eq!(s.config_get("activerehashing"), "no");
    } else {
        assert_eq!(s.ratelimit_field("defrag_guard"), "not-needed");
        assert_eq!(s.config_get("activerehashing"), "yes");
    }
}

/// At load, after `CONFIG SET activedefrag yes`, after an attempt to turn `activerehashing` back
/// on, and after `activedefrag no` (at once when no dict is rehashing; after a dict that was
/// rehashing is gone otherwise). Elsewhere the configuration is left alone.
#[test]
fn guard_follows_the_configuration() {
    let plain = Server::start();
    let v = plain.version();
    if !affected(&plain) {
        assert_eq!(plain.ratelimit_field("defrag_guard"), "not-needed");
        assert_eq!(plain.ratelimit_field("defrag_crash_risk"), "no");
        let unsupported = plain.defrag_unsupported();
        if unsupported.is_none() {
            plain.config_set("activedefrag", "yes");
        }
        assert_eq!(plain.config_get("activerehashing"), "yes");
        assert!(!plain.log().contains(WARNING));
        match unsupported {
            None => println!("defrag_guard [{}]: not needed, configuration untouched", v.describe()),
            Some(why) => println!(
                "defrag_guard [{}]: not needed, configuration untouched (activedefrag yes not tried: {why})",
                v.describe()
            ),
        }
        return;
    }
    assert_eq!(plain.ratelimit_field("defrag_guard"), "standby");
    assert_eq!(plain.config_get("activerehashing"), "yes");
    drop(plain);
    let s = Server::start_with(Opts { extra: vec![("activedefrag".into(), "yes".into())], ..Opts::default() });
    // At load.
    assert_eq!(s.config_get("activerehashing"), "no");
    assert_eq!(s.ratelimit_field("defrag_guard"), "active");
    assert_eq!(s.ratelimit_field("defrag_crash_risk"), "no");
    assert!(s.log().lines().any(|l| l.contains(WARNING) && l.contains("at load")), "{}", s.log());
    // An operator turning it back on while defragmentation runs.
    s.config_set("activerehashing", "yes");
    assert_eq!(s.config_get("activerehashing"), "no");
    // Defragmentation off with nothing rehashing: back on at once.
    s.config_set("activedefrag", "no");
    assert_eq!(s.config_get("activerehashing"), "yes");
    assert_eq!(s.ratelimit_field("defrag_guard"), "standby");
    assert!(s.log().contains("activerehashing is back on"));
    // And the operator's choice is theirs again.
    s.config_set("activerehashing", "no");
    s.config_set("activerehashing", "yes");
    assert_eq!(s.config_get("activerehashing"), "yes");

    // CONFIG SET activedefrag yes; a dict left rehashing when it goes off keeps activerehashing
    // off until the dict is gone (FLUSHALL), checked once a second.
    s.config_set("activedefrag", "yes");
    assert_eq!(s.config_get("activerehashing"), "no");
    assert_eq!(s.ratelimit_field("defrag_guard"), "active");
    let mut pipe = redis::pipe();
    for i in 0..KEYS {
        pipe.cmd("RL.GCRA").arg(format!("k:{i}")).arg(10).arg("1h").ignore();
    }
    pipe.cmd("CONFIG").arg("SET").arg("activedefrag").arg("no").ignore();
    let mut con = s.conn();
    let () = pipe.query(&mut con).unwrap();
    let rehashing: u64 = info_field(&s.info("memory"), "mem_overhead_db_hashtable_rehashing").unwrap().parse().unwrap();
    assert!(rehashing > 0, "the test needs a dict that is still rehashing");
    assert_eq!(s.config_get("activerehashing"), "no");
    assert_eq!(s.ratelimit_field("defrag_guard"), "active");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(s.config_get("activerehashing"), "no", "turned on while a dict was rehashing");
    let () = redis::cmd("FLUSHALL").arg("SYNC").query(&mut con).unwrap();
    wait_until(Duration::from_secs(10), "activerehashing back on", || s.config_get("activerehashing") == "yes");
    assert_eq!(s.ratelimit_field("defrag_guard"), "standby");
}

/// `NO_DEFRAG_GUARD`: the configuration stays as the operator set it, and the risk is reported.
#[test]
fn no_defrag_guard_leaves_the_configuration_alone() {
    let s = Server::start_with(Opts { module_args: vec!["NO_DEFRAG_GUARD".into()], ..Opts::default() });
    if !affected(&s) {
        assert_eq!(s.ratelimit_field("defrag_guard"), "not-needed");
        return;
    }
    assert_eq!(s.ratelimit_field("defrag_guard"), "disabled");
    assert_eq!(s.ratelimit_field("defrag_crash_risk"), "no");
    s.config_set("activedefrag", "yes");
    assert_eq!(s.config_get("activerehashing"), "yes");
    assert_eq!(s.ratelimit_field("defrag_guard"), "disabled");
    assert_eq!(s.ratelimit_field("defrag_crash_risk"), "yes");
    assert!(s.log().lines().any(|l| l.contains(WARNING) && l.contains("NO_DEFRAG_GUARD")), "{}", s.log());
    s.config_set("activedefrag", "no");
    assert_eq!(s.ratelimit_field("defrag_crash_risk"), "no");
}
