//! Replication, persistence and keyspace-command tests: replicas, AOF replays, AOF rewrites,
//! RDB reloads, DUMP/RESTORE and COPY must all hold byte-identical state (DUMP) with the
//! absolute expiry the primary pinned (PEXPIRETIME). The replication stream and the AOF carry
//! RL.SETSTATE, never the check commands; DRYRUN, peeks and limited calls propagate nothing.

mod common;
#[path = "common/traffic.rs"]
mod traffic;

use common::{
    clock_get, clock_set, info_field, ints, limiter, now_ms, rl_info, run, wait_replica_synced, wait_until, CellReply,
    LimiterReply, MultiReply, Opts, Rng, Server,
};
use redis::{Connection, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};
use traffic::{assert_same, snapshot, ALGOS};

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

/// 2023-11-14T22:13:20Z, a multiple of 1 h (and so of every window used here).
const T0_US: i64 = 1_699_999_200_000_000;

/// Whether a check admitted: CL.THROTTLE not limited, the others some units allowed.
fn admitted(args: &[String], v: &Value) -> bool {
    match args[0].as_str() {
        "CL.THROTTLE" => CellReply::of(v).limited == 0,
        "RL.MULTI" => MultiReply::of(v).allowed > 0,
        _ => LimiterReply::of(v).allowed > 0,
    }
}

// ---------------------------------------------------------------------------------------------
// Random traffic over all algorithms, CL.THROTTLE and RL.MULTI
// ---------------------------------------------------------------------------------------------

fn is_bucket(algo: &str) -> bool {
    redis_ratelimit_core::Algorithm::ALL.iter().any(|a| a.is_bucket() && a.multi_name() == algo)
}

/// `limit period [BURST n]` for a bucket, `limit window` for a window algorithm. Mostly long
/// periods, so most keys outlive the test; a few short ones too. `wild`: extreme values
/// (limits up to 10^15, periods from 1 µs to 100 years, sliding-log counts past the 11-bit
/// inline field).
fn random_spec(rng: &mut Rng, algo: &str, wild: bool) -> Vec<String> {
    if wild {
        let limit = *rng.pick(&[1u64, 7, 1000, 2047, 2048, 65536, 1_000_000, 1_000_000_000_000, 1_000_000_000_000_000]);
        let period = *rng.pick(&["1us", "999us", "1ms", "1s", "1h", "1d", "36525d", "3600000000us", "7s"]);
        let mut v = vec![limit.to_string(), period.to_string()];
        if is_bucket(algo) && rng.chance(40) {
            // At most twice the limit: a refill never takes more than 200 years.
            let max = (2 * limit).min(1_000_000_000_000_000);
            let burst = match rng.below(3) {
                0 => 1,
                1 => max,
                _ => rng.range(1, max as i64) as u64,
            };
            v.push("BURST".into());
            v.push(burst.to_string());
        }
        return v;
    }
    if is_bucket(algo) {
        let limit = *rng.pick(&[1u64, 2, 3, 5, 10, 20, 100]);
        let period = *rng.pick(&["60", "1m", "90s", "10m", "1h", "3600000ms", "600s", "5s", "2500ms", "86400000000us"]);
        let mut v = vec![limit.to_string(), period.to_string()];
        if rng.chance(40) {
            v.push("BURST".into());
            v.push(rng.pick(&[1u64, 3, 5, 10, 50]).to_string());
        }
        v
    } else {
        let limit = *rng.pick(&[1u64, 3, 5, 10, 50, 100]);
        let window = *rng.pick(&["1m", "60s", "5m", "1h", "10s", "30s", "2h", "60000ms"]);
        vec![limit.to_string(), window.to_string()]
    }
}

fn spec_capacity(spec: &[String]) -> u64 {
    match spec.iter().position(|s| s == "BURST") {
        Some(i) => spec[i + 1].parse().unwrap(),
        None => spec[0].parse().unwrap(),
    }
}

/// COST/DRYRUN/PARTIAL, in random order (and case).
fn random_options(rng: &mut Rng, capacity: u64, wild: bool) -> Vec<String> {
    let mut opts: Vec<Vec<String>> = Vec::new();
    let r = rng.below(100);
    if wild && r < 25 {
        let cost = *rng.pick(&[2046u64, 2047, 2048, 4095, 100_000, capacity, capacity.saturating_sub(1).max(1)]);
        opts.push(vec!["COST".into(), cost.to_string()]);
    } else if r < 8 {
        opts.push(vec!["COST".into(), "0".into()]);
    } else if r < 40 {
        opts.push(vec!["COST".into(), rng.range(1, capacity as i64 + 2).to_string()]);
    } else if r < 45 {
        opts.push(vec!["cost".into(), "1".into()]);
    }
    if rng.chance(10) {
        opts.push(vec![if rng.chance(50) { "DRYRUN" } else { "dryrun" }.into()]);
    }
    if rng.chance(25) {
        opts.push(vec![if rng.chance(50) { "PARTIAL" } else { "Partial" }.into()]);
    }
    // Shuffle.
    for i in (1..opts.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        opts.swap(i, j);
    }
    opts.into_iter().flatten().collect()
}

#[derive(Default, Debug)]
struct Traffic {
    calls: usize,
    admitted: usize,
    limited: usize,
    /// Every key the traffic touched.
    keys: BTreeSet<String>,
}

/// Sends `calls` random commands to `con` (a server with DEBUG_CLOCK), over distinct key sets
/// per algorithm (keys `<prefix>:<algo>:<i>`), CL.THROTTLE (including redis-cell string keys
/// taken over), RL.MULTI, RL.RESET, and random debug-clock moves (some backwards).
fn random_traffic(con: &mut Connection, rng: &mut Rng, calls: usize, prefix: &str) -> Traffic {
    traffic(con, rng, calls, prefix, false)
}

/// `random_traffic` with extreme parameters, costs and clock jumps.
fn wild_traffic(con: &mut Connection, rng: &mut Rng, calls: usize, prefix: &str) -> Traffic {
    traffic(con, rng, calls, prefix, true)
}

fn traffic(con: &mut Connection, rng: &mut Rng, calls: usize, prefix: &str, wild: bool) -> Traffic {
    let mut t = Traffic::default();
    let mut specs: HashMap<String, Vec<String>> = HashMap::new();
    // redis-cell keys (a string holding an arrival time in ns, with the TTL redis-cell gives
    // it), taken over by a first admitted CL.THROTTLE before the clock moves: the module reads
    // such a string only while its TTL still ends at its arrival time (within 60 s), which the
    // debug clock's jumps below would break (the server's clock does not jump with it).
    let now_us = clock_get(con);
    for i in 0..3 {
        let key = format!("{prefix}:cl:s{i}");
        let tat_ns = (now_us + 1_000_000 * i as i64) * 1_000;
        run(con, &common::redis_cell_set(&key, tat_ns, now_us * 1_000));
        let first = ["CL.THROTTLE", &key, "19", "30", "3600", "1"].map(String::from);
        let v = run(con, &first);
        assert!(matches!(&v, Value::Array(a) if a[0] == Value::Int(0)), "{key}: the first call takes it over: {v:?}");
        t.keys.insert(key);
        t.calls += 1;
        t.admitted += 1;
    }
    for _ in 0..calls {
        // Clock moves: mostly forward, sometimes backwards, sometimes a big jump.
        if rng.chance(35) {
            let r = rng.below(100);
            let delta_us: i64 = if wild && r < 3 {
                rng.range(1, 365 * 86_400_000_000)
            } else if wild && r < 6 {
                -rng.range(1, 3_600_000_000)
            } else if wild && r < 20 {
                rng.range(0, 2_000)
            } else if r < 12 {
                -rng.range(1, 5_000_000)
            } else if r < 15 {
                rng.range(60_000_000, 3_600_000_000)
            } else {
                rng.range(0, 20_000_000)
            };
            let _: () = redis::cmd("RL.DEBUG").arg("CLOCK").arg("ADVANCE").arg(delta_us).query(con).unwrap();
        }
        let kind = rng.below(100);
        let args: Vec<String>;
        // RL.MULTI: how many limits its reply holds.
        let mut expect_limits = 0usize;
        if kind < 66 {
            let algo = *rng.pick(&ALGOS);
            let key = format!("{prefix}:{}:{}", algo.to_lowercase(), rng.below(6));
            if !specs.contains_key(&key) || rng.chance(12) {
                specs.insert(key.clone(), random_spec(rng, algo, wild));
            }
            let spec = specs[&key].clone();
            let mut a = vec![format!("RL.{algo}"), key.clone()];
            a.extend(spec.iter().cloned());
            a.extend(random_options(rng, spec_capacity(&spec), wild));
            t.keys.insert(key);
            args = a;
        } else if kind < 78 {
            let key = if rng.chance(20) {
                format!("{prefix}:cl:s{}", rng.below(3))
            } else {
                format!("{prefix}:cl:{}", rng.below(5))
            };
            let (burst, count, period) = if wild {
                let count = *rng.pick(&[1u64, 1000, 1_000_000_000_000]);
                // max_burst + 1 at most twice the count: a refill never takes more than 200 years.
                let burst = *rng.pick(&[0u64, 2046, 2047, 1_000_000]);
                (burst.min(2 * count - 1), count, *rng.pick(&[1u64, 3600, 86_400 * 36_525]))
            } else {
                (*rng.pick(&[0u64, 1, 4, 9, 19]), *rng.pick(&[1u64, 2, 5, 10, 30]), *rng.pick(&[10u64, 60, 600, 3600]))
            };
            let mut a =
                vec!["CL.THROTTLE".to_string(), key.clone(), burst.to_string(), count.to_string(), period.to_string()];
            if rng.chance(60) {
                a.push(rng.range(0, burst as i64 + 3).to_string());
            }
            t.keys.insert(key);
            args = a;
        } else if kind < 97 {
            // RL.MULTI over keys <prefix>:multi:<j>, key j always algorithm ALGOS[j % 6].
            let n = rng.range(1, 3) as usize;
            let mut idx: Vec<u64> = Vec::new();
            while idx.len() < n {
                let j = rng.below(12);
                if !idx.contains(&j) {
                    idx.push(j);
                }
            }
            let keys: Vec<String> = idx.iter().map(|j| format!("{prefix}:multi:{j}")).collect();
            let mut a = vec!["RL.MULTI".to_string(), n.to_string()];
            a.extend(keys.iter().cloned());
            let mut cap = u64::MAX;
            for (j, key) in idx.iter().zip(&keys) {
                let algo = ALGOS[*j as usize % 6];
                if !specs.contains_key(key) || rng.chance(8) {
                    specs.insert(key.clone(), random_spec(rng, algo, wild));
                }
                let spec = &specs[key];
                cap = cap.min(spec_capacity(spec));
                a.push(if rng.chance(20) { algo.to_lowercase() } else { algo.to_string() });
                a.extend(spec.iter().cloned());
            }
            a.extend(random_options(rng, cap, wild));
            expect_limits = n;
            t.keys.extend(keys);
            args = a;
        } else {
            let all: Vec<&String> = t.keys.iter().filter(|k| !k.contains(":cl:s")).collect();
            if all.is_empty() {
                continue;
            }
            let key = (*rng.pick(&all)).clone();
            let v = run(con, &["RL.RESET".to_string(), key]);
            assert!(matches!(v, Value::Int(0) | Value::Int(1)), "RL.RESET reply {v:?}");
            t.calls += 1;
            continue;
        }
        let v = run(con, &args);
        assert!(matches!(v, Value::Array(_)), "{}: unexpected reply {v:?}", args.join(" "));
        match args[0].as_str() {
            "RL.MULTI" => assert_eq!(MultiReply::of(&v).limits.len(), expect_limits, "{}: reply {v:?}", args.join(" ")),
            "CL.THROTTLE" => drop(CellReply::of(&v)),
            cmd => {
                let r = LimiterReply::of(&v);
                assert_eq!(r.delay_ms.is_some(), cmd == "RL.LEAKY", "{}: reply {v:?}", args.join(" "));
            }
        }
        if admitted(&args, &v) {
            t.admitted += 1;
        } else {
            t.limited += 1;
        }
        t.calls += 1;
    }
    t
}

// ---------------------------------------------------------------------------------------------
// Snapshots: DUMP and PEXPIRETIME of every key
// ---------------------------------------------------------------------------------------------

fn read_dir_files(dir: &Path, suffix: &str) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(suffix) {
                out.push((name, std::fs::read(e.path()).unwrap_or_default()));
            }
        }
    }
    out
}

fn contains_ci(hay: &[u8], needle: &str) -> bool {
    let n = needle.to_ascii_lowercase().into_bytes();
    hay.windows(n.len()).any(|w| w.to_ascii_lowercase() == n)
}

const CHECK_COMMANDS: [&str; 8] =
    ["RL.GCRA", "RL.TOKENBUCKET", "RL.LEAKY", "RL.SLIDING", "RL.FIXED", "RL.SLIDINGLOG", "CL.THROTTLE", "RL.MULTI"];

fn wait_aof_rewrite_done(s: &Server) {
    wait_until(Duration::from_secs(15), "AOF rewrite to finish", || {
        let info = s.info("persistence");
        info_field(&info, "aof_rewrite_in_progress") == Some("0")
            && info_field(&info, "aof_rewrite_scheduled") == Some("0")
    });
    let info = s.info("persistence");
    assert_eq!(info_field(&info, "aof_last_bgrewrite_status"), Some("ok"), "{info}");
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// A few thousand random calls on the primary; the replica (which also writes an AOF) holds
/// byte-identical keys with identical absolute expiry, the same RL.INFO, and its stream
/// carried RL.SETSTATE only.
#[test]
fn replica_holds_identical_state_after_random_traffic() {
    let start = Instant::now();
    let primary = Server::start();
    let replica = Server::start_with(Opts { replica_of: Some(primary.port), appendonly: true, ..Default::default() });
    wait_replica_synced(&primary, &replica);
    // Let the replica's initial AOF rewrite (after the full sync) finish first.
    wait_aof_rewrite_done(&replica);

    let mut p = primary.conn();
    clock_set(&mut p, T0_US);
    let mut rng = Rng::new(0x5EED_0001);
    let t = random_traffic(&mut p, &mut rng, 4000, "rep");
    assert!(t.admitted > 500 && t.limited > 100, "traffic too one-sided: {t:?}");
    let w = wild_traffic(&mut p, &mut rng, 2000, "wild");
    assert!(w.admitted > 300 && w.limited > 50, "wild traffic too one-sided: {w:?}");
    wait_replica_synced(&primary, &replica);

    let mut r = replica.conn();
    let sp = snapshot(&mut p);
    let sr = snapshot(&mut r);
    let compared = assert_same(&sp, &sr, now_ms(), "primary vs replica");
    assert!(compared >= 40, "only {compared} keys compared (primary has {}): {t:?}", sp.len());
    let rl_keys = sp.keys().filter(|k| !String::from_utf8_lossy(k).contains(":cl:s")).count();
    assert!(rl_keys >= 40, "too few keys left: {rl_keys}");

    // RL.INFO: same fields and values when both clocks read the same instant (ttl_ms is on
    // each server's real clock: compared loosely).
    let now = clock_get(&mut p);
    clock_set(&mut r, now);
    let mut infos = 0;
    for key in t.keys.iter().chain(&w.keys) {
        let (Some(ip), Some(ir)) = (rl_info(&mut p, key), rl_info(&mut r, key)) else {
            continue; // missing (reset/expired)
        };
        assert_eq!(ip.without_ttl(), ir.without_ttl(), "RL.INFO {key} differs (primary vs replica)");
        let (tp, tr) = (ip.int("ttl_ms"), ir.int("ttl_ms"));
        assert!((tp - tr).abs() <= 250, "RL.INFO {key}: ttl_ms {tp} on the primary vs {tr} on the replica");
        infos += 1;
    }
    assert!(infos >= 40, "only {infos} RL.INFO compared");

    // The stream carried RL.SETSTATE, never the check commands: replica commandstats...
    let stats = replica.info("commandstats");
    assert!(stats.contains("cmdstat_rl.setstate:calls="), "replica never ran RL.SETSTATE:\n{stats}");
    for c in CHECK_COMMANDS {
        let name = format!("cmdstat_{}:", c.to_ascii_lowercase());
        assert!(!stats.contains(&name), "replica ran {c} (it must receive RL.SETSTATE only):\n{stats}");
    }
    let pstats = primary.info("commandstats");
    for c in CHECK_COMMANDS {
        let name = format!("cmdstat_{}:", c.to_ascii_lowercase());
        assert!(pstats.contains(&name), "primary has no {name} (traffic did not cover {c}):\n{pstats}");
    }
    // ...and the replica's AOF (incr files) holds RL.SETSTATE and no check command.
    let aof_dir = replica.dir.join("appendonlydir");
    let mut files = Vec::new();
    wait_until(Duration::from_secs(5), "replica AOF to hold RL.SETSTATE", || {
        files = read_dir_files(&aof_dir, ".incr.aof");
        files.iter().any(|(_, b)| contains_ci(b, "RL.SETSTATE"))
    });
    for (name, bytes) in &files {
        for c in CHECK_COMMANDS {
            assert!(!contains_ci(bytes, c), "replica AOF {name} contains {c}");
        }
    }
    // The primary never sees RL.SETSTATE from a client here.
    assert!(!pstats.contains("cmdstat_rl.setstate:"), "primary ran RL.SETSTATE:\n{pstats}");
    eprintln!(
        "replica_holds_identical_state_after_random_traffic: {} calls ({} admitted), wild {} calls ({} admitted), {compared} keys compared, {:?}",
        t.calls,
        t.admitted,
        w.calls,
        w.admitted,
        start.elapsed()
    );
}

/// DRYRUN, peeks (COST 0), limited calls, RL.INFO and RL.RESET of a missing key write
/// nothing and propagate nothing: the primary's master_repl_offset does not move. An admitted
/// call does move it (the check is meaningful).
#[test]
fn dryrun_peek_and_limited_calls_propagate_nothing() {
    // No periodic PINGs to the replica during the test: they would move the offset.
    let primary = Server::start_with(Opts {
        extra: vec![("repl-ping-replica-period".into(), "3600".into())],
        ..Default::default()
    });
    let replica = Server::start_with(Opts { replica_of: Some(primary.port), ..Default::default() });
    wait_replica_synced(&primary, &replica);
    let mut p = primary.conn();
    clock_set(&mut p, T0_US);
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();

    // Fill each key to its limit (long periods: nothing expires during the test).
    let setups: Vec<Vec<String>> = vec![
        s(&["RL.GCRA", "nz:gcra", "3", "1h", "COST", "3"]),
        s(&["RL.TOKENBUCKET", "nz:tb", "3", "1h", "COST", "3"]),
        s(&["RL.LEAKY", "nz:leaky", "3", "1h", "COST", "3"]),
        s(&["RL.SLIDING", "nz:sliding", "3", "1h", "COST", "3"]),
        s(&["RL.FIXED", "nz:fixed", "3", "1h", "COST", "3"]),
        s(&["RL.SLIDINGLOG", "nz:log", "3", "1h", "COST", "3"]),
        s(&["CL.THROTTLE", "nz:cl", "2", "3", "3600", "3"]),
        s(&["RL.MULTI", "2", "nz:m1", "nz:m2", "GCRA", "3", "1h", "SLIDINGLOG", "3", "1h", "COST", "3"]),
    ];
    for a in &setups {
        let v = run(&mut p, a);
        assert!(admitted(a, &v), "{}: setup call not admitted: {v:?}", a.join(" "));
    }
    wait_replica_synced(&primary, &replica);
    let before_snap = snapshot(&mut p);

    let quiet: Vec<Vec<String>> = vec![
        // limited
        s(&["RL.GCRA", "nz:gcra", "3", "1h"]),
        s(&["RL.TOKENBUCKET", "nz:tb", "3", "1h"]),
        s(&["RL.LEAKY", "nz:leaky", "3", "1h"]),
        s(&["RL.SLIDING", "nz:sliding", "3", "1h"]),
        s(&["RL.FIXED", "nz:fixed", "3", "1h"]),
        s(&["RL.SLIDINGLOG", "nz:log", "3", "1h"]),
        s(&["RL.GCRA", "nz:gcra", "3", "1h", "PARTIAL", "COST", "2"]),
        s(&["RL.SLIDINGLOG", "nz:log", "3", "1h", "COST", "9"]),
        s(&["CL.THROTTLE", "nz:cl", "2", "3", "3600", "1"]),
        s(&["RL.MULTI", "2", "nz:m1", "nz:m2", "GCRA", "3", "1h", "SLIDINGLOG", "3", "1h"]),
        s(&["RL.MULTI", "2", "nz:m1", "nz:fresh1", "GCRA", "3", "1h", "FIXED", "3", "1h", "PARTIAL"]),
        // peeks (on existing and on missing keys)
        s(&["RL.GCRA", "nz:gcra", "3", "1h", "COST", "0"]),
        s(&["RL.FIXED", "nz:fresh2", "3", "1h", "COST", "0"]),
        s(&["RL.LEAKY", "nz:fresh3", "3", "1h", "COST", "0"]),
        s(&["RL.SLIDINGLOG", "nz:fresh4", "3", "1h", "COST", "0"]),
        s(&["CL.THROTTLE", "nz:fresh5", "2", "3", "3600", "0"]),
        s(&["RL.MULTI", "2", "nz:fresh6", "nz:fresh7", "TOKENBUCKET", "3", "1h", "SLIDING", "3", "1h", "COST", "0"]),
        // dry runs that would be admitted
        s(&["RL.GCRA", "nz:fresh8", "3", "1h", "DRYRUN"]),
        s(&["RL.TOKENBUCKET", "nz:fresh9", "3", "1h", "DRYRUN", "COST", "2"]),
        s(&["RL.LEAKY", "nz:fresh10", "3", "1h", "DRYRUN"]),
        s(&["RL.SLIDING", "nz:fresh11", "3", "1h", "DRYRUN"]),
        s(&["RL.FIXED", "nz:fresh12", "3", "1h", "DRYRUN", "PARTIAL", "COST", "5"]),
        s(&["RL.SLIDINGLOG", "nz:fresh13", "3", "1h", "DRYRUN"]),
        s(&["RL.MULTI", "2", "nz:fresh14", "nz:fresh15", "LEAKY", "3", "1h", "FIXED", "3", "1h", "DRYRUN"]),
        // read-only / no-op
        s(&["RL.INFO", "nz:gcra"]),
        s(&["RL.INFO", "nz:missing"]),
        s(&["RL.RESET", "nz:missing"]),
    ];
    for a in &quiet {
        let before = primary.repl_offset();
        let v = run(&mut p, a);
        let after = primary.repl_offset();
        assert_eq!(after, before, "`{}` (reply {v:?}) moved master_repl_offset from {before} to {after}", a.join(" "));
    }
    // Peeks/dry runs/limited calls left no key behind and changed nothing.
    let mut p2 = primary.conn();
    let after_snap = snapshot(&mut p2);
    assert_same(&before_snap, &after_snap, 0, "before vs after the quiet calls");
    assert_eq!(before_snap.len(), after_snap.len());

    // An admitted call moves it.
    let before = primary.repl_offset();
    let v = limiter(&mut p, &s(&["RL.GCRA", "nz:other", "3", "1h"]));
    assert_eq!(v.allowed, 1);
    let after = primary.repl_offset();
    assert!(after > before, "an admitted call did not propagate anything (offset {before} → {after})");
    wait_replica_synced(&primary, &replica);
}

/// DEBUG RELOAD (RDB save + load in place) keeps every key's DUMP and absolute expiry.
#[test]
fn debug_reload_keeps_state() {
    let s = Server::start();
    let mut c = s.conn();
    clock_set(&mut c, T0_US);
    let mut rng = Rng::new(0x5EED_0002);
    let t = random_traffic(&mut c, &mut rng, 1500, "rl");
    wild_traffic(&mut c, &mut rng, 800, "wild");
    let before = snapshot(&mut c);
    let keys: Vec<Vec<u8>> = before.keys().cloned().collect();
    let pttl = |c: &mut Connection| -> Vec<i64> {
        let mut p = redis::pipe();
        for k in &keys {
            p.cmd("PTTL").arg(k);
        }
        p.query(c).unwrap()
    };
    let t_reload = Instant::now();
    let ttl_before = pttl(&mut c);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    let ttl_after = pttl(&mut c);
    let elapsed_ms = t_reload.elapsed().as_millis() as i64;
    let after = snapshot(&mut c);
    let compared = assert_same(&before, &after, now_ms(), "before vs after DEBUG RELOAD");
    assert!(compared >= 40, "only {compared} keys compared: {t:?}");
    for ((k, b), a) in keys.iter().zip(&ttl_before).zip(&ttl_after) {
        if *a == -2 {
            assert!(*b <= elapsed_ms + 5, "{} vanished on reload with PTTL {b}", String::from_utf8_lossy(k));
            continue;
        }
        if *b == -1 {
            assert_eq!(*a, -1, "{}", String::from_utf8_lossy(k));
            continue;
        }
        assert!(
            *a <= *b + 2 && *a >= *b - elapsed_ms - 5,
            "{}: PTTL {b} before DEBUG RELOAD, {a} after ({elapsed_ms} ms elapsed)",
            String::from_utf8_lossy(k)
        );
    }
}

/// AOF: random traffic, restart → identical; BGREWRITEAOF (RDB preamble) then more traffic,
/// restart → identical; BGREWRITEAOF without the RDB preamble (the type's aof_rewrite emits
/// RL.SETSTATE) then more traffic, restart → identical.
#[test]
fn aof_restart_and_rewrite_keep_state() {
    let mut s = Server::start_with(Opts { appendonly: true, ..Default::default() });
    let mut rng = Rng::new(0x5EED_0003);
    let mut c = s.conn();
    clock_set(&mut c, T0_US);
    let t1 = random_traffic(&mut c, &mut rng, 1200, "aof");
    wild_traffic(&mut c, &mut rng, 600, "wild");
    let clock = clock_get(&mut c);
    let before = snapshot(&mut c);
    drop(c);
    s.restart();
    let mut c = s.conn();
    let after = snapshot(&mut c);
    let n = assert_same(&before, &after, now_ms(), "AOF: before vs after restart");
    assert!(n >= 40, "only {n} keys compared: {t1:?}");

    // Rewrite with the default RDB preamble, then more traffic into the new incr file.
    clock_set(&mut c, clock + 1_000_000);
    let _: Value = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
    wait_aof_rewrite_done(&s);
    random_traffic(&mut c, &mut rng, 600, "aof");
    let clock = clock_get(&mut c);
    let before = snapshot(&mut c);
    drop(c);
    s.restart();
    let mut c = s.conn();
    let after = snapshot(&mut c);
    let n = assert_same(&before, &after, now_ms(), "AOF (rewritten with RDB preamble): before vs after restart");
    assert!(n >= 40, "only {n} keys compared");

    // Rewrite as commands: the base file is made of the type's aof_rewrite output.
    clock_set(&mut c, clock + 1_000_000);
    let _: () = redis::cmd("CONFIG").arg("SET").arg("aof-use-rdb-preamble").arg("no").query(&mut c).unwrap();
    let _: Value = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
    wait_aof_rewrite_done(&s);
    let base = read_dir_files(&s.dir.join("appendonlydir"), ".base.aof");
    assert_eq!(base.len(), 1, "expected one base AOF file: {:?}", base.iter().map(|f| &f.0).collect::<Vec<_>>());
    assert!(contains_ci(&base[0].1, "RL.SETSTATE"), "rewritten base AOF {} has no RL.SETSTATE", base[0].0);
    for cmd in CHECK_COMMANDS {
        assert!(!contains_ci(&base[0].1, cmd), "rewritten base AOF contains {cmd}");
    }
    random_traffic(&mut c, &mut rng, 600, "aof");
    let before = snapshot(&mut c);
    drop(c);
    s.restart();
    let mut c = s.conn();
    let after = snapshot(&mut c);
    let n = assert_same(&before, &after, now_ms(), "AOF (rewritten without preamble): before vs after restart");
    assert!(n >= 40, "only {n} keys compared");
    // No check command ever reached the AOF.
    for (name, bytes) in read_dir_files(&s.dir.join("appendonlydir"), ".aof") {
        for cmd in CHECK_COMMANDS {
            assert!(!contains_ci(&bytes, cmd), "AOF file {name} contains {cmd}");
        }
    }
}

/// RDB: SAVE then restart → identical; DUMP/RESTORE into a new name gives the same RL.INFO;
/// COPY copies value and expiry; MEMORY USAGE answers; DEBUG DIGEST-VALUE equal on a replica.
#[test]
fn rdb_restart_dump_restore_copy_digest() {
    let mut s = Server::start();
    let mut rng = Rng::new(0x5EED_0004);
    let mut c = s.conn();
    clock_set(&mut c, T0_US);
    let t = random_traffic(&mut c, &mut rng, 1200, "rdb");
    wild_traffic(&mut c, &mut rng, 600, "wild");
    // One long-lived key of every algorithm, sure to exist.
    let fixed_keys: Vec<(String, Vec<String>)> = ALGOS
        .iter()
        .map(|a| {
            let key = format!("rdbfix:{}", a.to_lowercase());
            let mut args = vec![format!("RL.{a}"), key.clone(), "5".into(), "1h".into(), "COST".into(), "2".into()];
            run(&mut c, &args);
            args.truncate(4);
            (key, args)
        })
        .collect();
    let cl = vec!["CL.THROTTLE".to_string(), "rdbfix:cl".into(), "9".into(), "10".into(), "3600".into(), "3".into()];
    run(&mut c, &cl);
    let clock = clock_get(&mut c);

    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    let before = snapshot(&mut c);
    drop(c);
    s.restart();
    let mut c = s.conn();
    let after = snapshot(&mut c);
    let n = assert_same(&before, &after, now_ms(), "RDB: before SAVE+restart vs after");
    assert!(n >= 40, "only {n} keys compared: {t:?}");

    clock_set(&mut c, clock);
    let mut all_fixed: Vec<String> = fixed_keys.iter().map(|(k, _)| k.clone()).collect();
    all_fixed.push("rdbfix:cl".into());
    for key in &all_fixed {
        // DUMP/RESTORE into a new key: same RL.INFO (the restored key has no TTL).
        let payload: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut c).unwrap();
        let new = format!("{key}:restored");
        let _: () = redis::cmd("RESTORE").arg(&new).arg(0).arg(&payload).query(&mut c).unwrap();
        let orig = rl_info(&mut c, key).unwrap_or_else(|| panic!("RL.INFO {key} is nil"));
        let restored = rl_info(&mut c, &new).unwrap_or_else(|| panic!("RL.INFO {new} is nil"));
        assert_eq!(orig.without_ttl(), restored.without_ttl(), "RL.INFO of {key} vs its DUMP/RESTORE copy");
        assert_eq!(restored.int("ttl_ms"), -1, "RESTORE with ttl 0 keeps no TTL");
        let d2: Vec<u8> = redis::cmd("DUMP").arg(&new).query(&mut c).unwrap();
        assert_eq!(d2, payload, "DUMP of the restored key differs");
        // The restored key keeps working.
        let e: redis::RedisResult<Value> = redis::cmd("RESTORE").arg(&new).arg(0).arg(&payload).query(&mut c);
        assert_eq!(e.unwrap_err().code(), Some("BUSYKEY"));
        // Again with the original's absolute expiry (DEBUG DIGEST-VALUE mixes in whether a
        // key has a TTL, so the digests below compare keys that both have one).
        let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(&mut c).unwrap();
        let _: () =
            redis::cmd("RESTORE").arg(&new).arg(at).arg(&payload).arg("REPLACE").arg("ABSTTL").query(&mut c).unwrap();
        let at2: i64 = redis::cmd("PEXPIRETIME").arg(&new).query(&mut c).unwrap();
        assert_eq!(at, at2);
        let restored = rl_info(&mut c, &new).unwrap_or_else(|| panic!("RL.INFO {new} is nil"));
        assert_eq!(orig.without_ttl(), restored.without_ttl(), "RL.INFO of {key} vs RESTORE ABSTTL");

        // COPY: same value and the same absolute expiry.
        let copy = format!("{key}:copy");
        let copied: i64 = redis::cmd("COPY").arg(key).arg(&copy).query(&mut c).unwrap();
        assert_eq!(copied, 1, "COPY {key}");
        let (d1, d2): (Vec<u8>, Vec<u8>) =
            redis::pipe().cmd("DUMP").arg(key).cmd("DUMP").arg(&copy).query(&mut c).unwrap();
        assert_eq!(d1, d2, "COPY of {key}: DUMP differs");
        let (e1, e2): (i64, i64) =
            redis::pipe().cmd("PEXPIRETIME").arg(key).cmd("PEXPIRETIME").arg(&copy).query(&mut c).unwrap();
        assert_eq!(e1, e2, "COPY of {key}: PEXPIRETIME differs");
        assert!(e1 > 0);
        let of_copy = rl_info(&mut c, &copy).unwrap_or_else(|| panic!("RL.INFO {copy} is nil"));
        assert_eq!(orig.without_ttl(), of_copy.without_ttl(), "RL.INFO of the COPY of {key}");

        // MEMORY USAGE answers a positive size.
        let mem: i64 = redis::cmd("MEMORY").arg("USAGE").arg(key).query(&mut c).unwrap();
        assert!(mem > 0, "MEMORY USAGE {key} = {mem}");

        // Digest of a copy equals the original's.
        let dv: Vec<String> =
            redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).arg(&new).arg(&copy).query(&mut c).unwrap();
        assert_eq!(dv.len(), 3);
        assert!(dv[0] == dv[1] && dv[1] == dv[2], "DEBUG DIGEST-VALUE of {key}, restored, copy: {dv:?}");
        assert_ne!(dv[0], "0".repeat(40), "digest of {key} is all zeros");
    }
    // The copies behave like the original on the next call.
    for (key, args) in &fixed_keys {
        let mut a1 = args.clone();
        let mut a2 = args.clone();
        a2[1] = format!("{key}:copy");
        a1.push("DRYRUN".into());
        a2.push("DRYRUN".into());
        assert_eq!(ints(run(&mut c, &a1)), ints(run(&mut c, &a2)), "{key} vs its COPY");
    }
    // A sliding log with many entries uses more memory than an empty-ish one.
    for i in 0..200 {
        clock_set(&mut c, clock + i);
        run(&mut c, &["RL.SLIDINGLOG", "rdbfix:biglog", "1000", "1h"]);
    }
    let big: i64 = redis::cmd("MEMORY").arg("USAGE").arg("rdbfix:biglog").query(&mut c).unwrap();
    let small: i64 = redis::cmd("MEMORY").arg("USAGE").arg("rdbfix:slidinglog").query(&mut c).unwrap();
    // (1 µs apart: at least a byte per entry, core/src/sliding_log.rs; the key names differ.)
    assert!(big > small + 150, "MEMORY USAGE of a 200-entry log {big} vs a 1-entry log {small}");

    // A replica holds the same digests.
    let replica = Server::start_with(Opts { replica_of: Some(s.port), ..Default::default() });
    wait_replica_synced(&s, &replica);
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    let mut r = replica.conn();
    let mut cmd_p = redis::cmd("DEBUG");
    cmd_p.arg("DIGEST-VALUE");
    for k in &keys {
        cmd_p.arg(k);
    }
    let dp: Vec<String> = cmd_p.query(&mut c).unwrap();
    let dr: Vec<String> = cmd_p.query(&mut r).unwrap();
    let now = now_ms();
    let snap = snapshot(&mut c);
    let mut compared = 0;
    for ((k, a), b) in keys.iter().zip(&dp).zip(&dr) {
        let e = snap.get(k.as_bytes()).map_or(0, |x| x.1);
        if e > 0 && e < now + 100 {
            continue; // expiring right now
        }
        assert_eq!(a, b, "DEBUG DIGEST-VALUE {k}: primary {a}, replica {b}");
        compared += 1;
    }
    assert!(compared >= 40, "only {compared} digests compared");
    let sr = snapshot(&mut r);
    let snap = snapshot(&mut c);
    assert_same(&snap, &sr, now_ms(), "primary vs replica after full sync from RDB");
}
