//! Keyspace snapshots (DUMP and PEXPIRETIME of every key) compared between two servers, and the
//! algorithm keywords: for the replication, RL.MULTI and RL.RETURN tests. Included with
//! `#[path = "common/traffic.rs"] mod traffic;` next to `mod common;`.
#![allow(dead_code)]

use redis::{Connection, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The six algorithm keywords (RL.MULTI spelling; the single-key commands are `RL.<name>`).
pub const ALGOS: [&str; 6] = ["GCRA", "TOKENBUCKET", "LEAKY", "SLIDING", "FIXED", "SLIDINGLOG"];

// Moved to the common harness; re-exported for the tests that still take them from here.
#[allow(unused_imports)]
pub use crate::common::{clock_advance, clock_get, clock_set, err_text, now_ms, Rng};

/// A command from an argument list (while a test still takes it from here; see `common::Args`).
pub fn cmd_of(args: &[String]) -> redis::Cmd {
    crate::common::Args::cmd(args)
}

pub type Snap = BTreeMap<Vec<u8>, (Vec<u8>, i64)>;

pub fn snapshot(con: &mut Connection) -> Snap {
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(con).unwrap();
    let mut p = redis::pipe();
    for k in &keys {
        p.cmd("DUMP").arg(k).cmd("PEXPIRETIME").arg(k);
    }
    let vals: Vec<Value> = p.query(con).unwrap();
    let mut snap = Snap::new();
    for (k, pair) in keys.iter().zip(vals.chunks(2)) {
        let dump = match &pair[0] {
            Value::BulkString(b) => b.clone(),
            Value::Nil => continue, // expired between KEYS and DUMP
            other => panic!("DUMP {}: {other:?}", String::from_utf8_lossy(k)),
        };
        let at = match &pair[1] {
            Value::Int(i) => *i,
            other => panic!("PEXPIRETIME {}: {other:?}", String::from_utf8_lossy(k)),
        };
        if at == -2 {
            continue;
        }
        snap.insert(k.clone(), (dump, at));
    }
    snap
}

/// Asserts two snapshots hold the same keys with byte-identical DUMPs and identical absolute
/// expiry. A key present on one side only is accepted only if its expiry had passed by
/// `now` (the wall clock read after both snapshots). Returns the number of keys compared.
pub fn assert_same(a: &Snap, b: &Snap, now: i64, what: &str) -> usize {
    let mut compared = 0;
    let all: BTreeSet<&Vec<u8>> = a.keys().chain(b.keys()).collect();
    let mut problems = Vec::new();
    for k in all {
        let name = String::from_utf8_lossy(k);
        match (a.get(k), b.get(k)) {
            (Some((da, ea)), Some((db, eb))) => {
                compared += 1;
                if da != db {
                    problems.push(format!("{name}: DUMP differs\n  {:02x?}\n  {:02x?}", da, db));
                }
                if ea != eb {
                    problems.push(format!("{name}: PEXPIRETIME differs: {ea} vs {eb}"));
                }
            }
            (Some((_, e)), None) | (None, Some((_, e))) => {
                let side = if a.contains_key(k) { "first" } else { "second" };
                if *e < 0 || *e > now {
                    problems.push(format!(
                        "{name}: only on the {side} side, with PEXPIRETIME {e} (now {now}): not explained by expiry"
                    ));
                }
            }
            (None, None) => unreachable!(),
        }
    }
    assert!(problems.is_empty(), "{what}: {} problem(s):\n{}", problems.len(), problems.join("\n"));
    compared
}
