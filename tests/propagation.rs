//! Effects are not built when nothing would read them (no AOF, no replication backlog, no
//! replica: Redis would drop them), and every way a reader can appear still gets the exact
//! state: a replica attaching later (full sync, including writes made while it waits for its
//! RDB), a partial resynchronization after a disconnection, a primary restarted from an RDB
//! with replication metadata (its backlog exists before any replica connects), the AOF turned
//! on at runtime. `INFO ratelimit` shows the module's answer as `propagate_effects`.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{wait_replica_synced, Opts, Server};
use redis::{Connection, Value};

fn propagate_effects(s: &Server) -> String {
    s.ratelimit_field("propagate_effects")
}

/// One call of every writing command on `keys` keys of each kind (long periods: nothing
/// expires while a test runs), pipelined. `round` varies costs and parameters.
fn traffic(con: &mut Connection, round: u64, keys: u64) {
    let mut p = redis::pipe();
    for i in 0..keys {
        let cost = 1 + (i + round) % 3;
        p.cmd("RL.GCRA").arg(format!("g:{i}")).arg(100).arg("1d").arg("COST").arg(cost);
        p.cmd("RL.TOKENBUCKET").arg(format!("t:{i}")).arg(100).arg("1d").arg("COST").arg(cost);
        p.cmd("RL.LEAKY").arg(format!("l:{i}")).arg(100).arg("1d");
        p.cmd("RL.SLIDING").arg(format!("s:{i}")).arg(100).arg("1d").arg("COST").arg(cost);
        p.cmd("RL.FIXED").arg(format!("f:{i}")).arg(100).arg("1d");
        p.cmd("RL.SLIDINGLOG").arg(format!("o:{i}")).arg(100).arg("1d").arg("COST").arg(cost);
        p.cmd("CL.THROTTLE").arg(format!("c:{i}")).arg(99).arg(100).arg(86400).arg(cost);
        p.cmd("RL.MULTI")
            .arg(2)
            .arg(format!("m1:{i}"))
            .arg(format!("m2:{i}"))
            .arg("GCRA")
            .arg(50)
            .arg("1d")
            .arg("FIXED")
            .arg(50)
            .arg("1d");
        if round % 2 == 1 {
            p.cmd("RL.RETURN").arg(format!("g:{i}")).arg(1).arg("AGE").arg(0);
        }
        if round % 3 == 2 && i % 7 == 0 {
            p.cmd("RL.RESET").arg(format!("t:{i}"));
        }
    }
    let replies: Vec<Value> = p.query(con).expect("traffic");
    for r in replies {
        assert!(!matches!(r, Value::ServerError(_)), "a call failed: {r:?}");
    }
}

fn digest(con: &mut Connection) -> String {
    redis::cmd("DEBUG").arg("DIGEST").query(con).expect("DEBUG DIGEST")
}

/// Every key with its absolute expiry.
fn expiries(con: &mut Connection) -> BTreeMap<String, i64> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(con).expect("KEYS");
    keys.into_iter()
        .map(|k| {
            let at: i64 = redis::cmd("PEXPIRETIME").arg(&k).query(con).expect("PEXPIRETIME");
            (k, at)
        })
        .collect()
}

/// The replica holds exactly the primary's keys, values and expiries.
fn assert_same_state(primary: &Server, replica: &Server, when: &str) {
    wait_replica_synced(primary, replica);
    let (mut p, mut r) = (primary.conn(), replica.conn());
    let keys: i64 = redis::cmd("DBSIZE").query(&mut p).unwrap();
    assert!(keys > 0, "{when}: the primary has no keys");
    assert_eq!(digest(&mut p), digest(&mut r), "{when}: DEBUG DIGEST of primary and replica differ");
    assert_eq!(expiries(&mut p), expiries(&mut r), "{when}: expiries differ");
}

fn attach(replica: &Server, primary: &Server) {
    let mut r = replica.conn();
    let _: () = redis::cmd("REPLICAOF").arg("127.0.0.1").arg(primary.port).query(&mut r).expect("REPLICAOF");
}

/// `common::wait_until` with this file's 30 s.
fn wait_for(what: &str, f: impl FnMut() -> bool) {
    common::wait_until(Duration::from_secs(30), what, f);
}

#[test]
fn a_lone_primary_skips_effects_and_a_replica_attaching_later_gets_the_state() {
    let primary = Server::start();
    let replica = Server::start();
    let mut p = primary.conn();
    assert_eq!(propagate_effects(&primary), "unknown", "before any effect");
    traffic(&mut p, 0, 40);
    assert_eq!(propagate_effects(&primary), "no", "no AOF, no backlog, no replica");
    assert_eq!(primary.info_field("replication", "master_repl_offset"), "0");
    traffic(&mut p, 1, 40);

    // Writes still count for the save points; calls that write nothing do not.
    let changes = || primary.info_int("persistence", "rdb_changes_since_last_save");
    let before = changes();
    for i in 0..10 {
        let _: Value = redis::cmd("RL.GCRA").arg(format!("dirty:{i}")).arg(10).arg("1d").query(&mut p).unwrap();
    }
    let _: Value = redis::cmd("RL.GCRA").arg("dirty:0").arg(10).arg("1d").arg("DRYRUN").query(&mut p).unwrap();
    let _: Value = redis::cmd("RL.GCRA").arg("dirty:0").arg(10).arg("1d").arg("COST").arg(100).query(&mut p).unwrap();
    let _: Value = redis::cmd("RL.RESET").arg("dirty:1").query(&mut p).unwrap();
    assert_eq!(changes() - before, 11, "ten admitted calls and a reset");
    assert_eq!(primary.info_field("replication", "master_repl_offset"), "0");

    attach(&replica, &primary);
    assert_same_state(&primary, &replica, "after the full sync");
    // (The replica comes online at its first ACK, a server event that makes the module look
    // again: wait for it, so that the answer below is the one found after it.)
    wait_for("the replica online", || primary.info("replication").contains("state=online"));
    traffic(&mut p, 2, 40);
    assert_eq!(propagate_effects(&primary), "yes", "a replica is attached");
    assert_same_state(&primary, &replica, "after more traffic");
}

/// With a diskless-sync delay the replica waits for its RDB while the backlog already exists:
/// effects skipped in that window are in the RDB (the replica's stream starts at the fork);
/// the fork makes the module look again before the next effect.
#[test]
fn writes_while_the_replica_waits_for_its_rdb_reach_it() {
    for diskless in ["yes", "no"] {
        let primary = Server::start_with(Opts {
            extra: vec![
                ("repl-diskless-sync".into(), diskless.into()),
                ("repl-diskless-sync-delay".into(), "1".into()),
            ],
            ..Default::default()
        });
        let replica = Server::start();
        let mut p = primary.conn();
        traffic(&mut p, 0, 20);
        assert_eq!(propagate_effects(&primary), "no");
        attach(&replica, &primary);
        // Keep writing through the wait, the fork and the transfer.
        let mut round = 1;
        let mut saw = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            traffic(&mut p, round, 20);
            round += 1;
            let s = propagate_effects(&primary);
            if saw.last() != Some(&s) {
                saw.push(s);
            }
            let link = replica.info_field("replication", "master_link_status");
            if link == "up" && saw.last().map(String::as_str) == Some("yes") {
                break;
            }
            assert!(Instant::now() < deadline, "replica never synced (diskless {diskless}); saw {saw:?}");
        }
        traffic(&mut p, round, 20);
        assert_same_state(&primary, &replica, &format!("diskless {diskless}"));
    }
}

#[test]
fn a_partial_resync_after_a_disconnection_keeps_the_state() {
    let primary = Server::start();
    let replica = Server::start();
    attach(&replica, &primary);
    wait_replica_synced(&primary, &replica);
    let mut p = primary.conn();
    traffic(&mut p, 0, 30);
    assert_same_state(&primary, &replica, "after sync");
    let partial_before = primary.info_int("stats", "sync_partial_ok");
    let _: i64 = redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica").query(&mut p).expect("CLIENT KILL");
    traffic(&mut p, 1, 30);
    traffic(&mut p, 2, 30);
    wait_for("a partial resync", || primary.info_int("stats", "sync_partial_ok") > partial_before);
    traffic(&mut p, 3, 30);
    assert_same_state(&primary, &replica, "after the partial resync");
}

/// A primary restarted from an RDB that holds replication metadata recreates its backlog
/// while loading, before any replica connects, so that its replicas can resynchronize
/// partially: effects written right after the restart must reach them.
#[test]
fn a_primary_restarted_from_its_rdb_propagates_before_its_replica_returns() {
    // The RDB is written at shutdown (a save point), after the last bytes sent to the replica,
    // so that its offset is the replica's and the replica can resynchronize partially.
    let mut primary = Server::start_with(Opts { extra: vec![("save".into(), "3600 1".into())], ..Default::default() });
    let replica = Server::start();
    attach(&replica, &primary);
    wait_replica_synced(&primary, &replica);
    let mut p = primary.conn();
    traffic(&mut p, 0, 30);
    assert_same_state(&primary, &replica, "before the restart");
    primary.restart();
    let mut p = primary.conn();
    traffic(&mut p, 1, 30);
    // ("unknown" when the replica came back meanwhile: that event makes the module look again.)
    assert_ne!(propagate_effects(&primary), "no", "the backlog restored from the RDB");
    wait_for("the replica's partial resync", || {
        primary.info_int("stats", "sync_partial_ok") >= 1
            && replica.info_field("replication", "master_link_status") == "up"
    });
    traffic(&mut p, 2, 30);
    assert_same_state(&primary, &replica, "after the restart");
}

/// The AOF turned on at runtime receives every effect from then on: reloading it gives the
/// same dataset. A BGSAVE's fork with no replica around leaves effects skipped.
#[test]
fn the_aof_turned_on_at_runtime_receives_the_effects() {
    let server = Server::start();
    let mut c = server.conn();
    traffic(&mut c, 0, 30);
    assert_eq!(propagate_effects(&server), "no");
    let _: String = redis::cmd("BGSAVE").query(&mut c).expect("BGSAVE");
    wait_for("BGSAVE", || server.info_field("persistence", "rdb_bgsave_in_progress") == "0");
    traffic(&mut c, 1, 30);
    assert_eq!(propagate_effects(&server), "no", "a fork with no replica");

    let _: () = redis::cmd("CONFIG").arg("SET").arg("appendonly").arg("yes").query(&mut c).expect("CONFIG SET");
    wait_for("the AOF rewrite", || {
        server.info_field("persistence", "aof_rewrite_in_progress") == "0"
            && server.info_field("persistence", "aof_rewrite_scheduled") == "0"
            && server.info_field("persistence", "aof_enabled") == "1"
    });
    for round in 2..6 {
        traffic(&mut c, round, 30);
    }
    assert_eq!(propagate_effects(&server), "yes", "the AOF is on");
    let before = digest(&mut c);
    let before_expiries = expiries(&mut c);
    let _: () = redis::cmd("DEBUG").arg("LOADAOF").query(&mut c).expect("DEBUG LOADAOF");
    assert_eq!(digest(&mut c), before, "the AOF reloaded gives another dataset");
    assert_eq!(expiries(&mut c), before_expiries);
}
