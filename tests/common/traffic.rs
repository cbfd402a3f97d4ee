//! Helpers shared by the replication and RL.MULTI tests (replication, multi): a seeded PRNG,
//! commands from argument lists, the debug clock and keyspace snapshots (DUMP and PEXPIRETIME of
//! every key) compared between two servers.
//! Included with `#[path = "common/traffic.rs"] mod traffic;` (not a test target).
#![allow(dead_code)]

use redis::{Connection, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};

/// The six algorithm keywords (RL.MULTI spelling; the single-key commands are `RL.<name>`).
pub const ALGOS: [&str; 6] = ["GCRA", "TOKENBUCKET", "LEAKY", "SLIDING", "FIXED", "SLIDINGLOG"];

/// xorshift64*: a seeded PRNG, no extra crates.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

pub fn err_text(e: &redis::RedisError) -> String {
    format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or(""))
}

pub fn cmd_of(args: &[String]) -> redis::Cmd {
    let mut c = redis::cmd(&args[0]);
    for a in &args[1..] {
        c.arg(a.as_str());
    }
    c
}

pub fn clock_set(con: &mut Connection, us: i64) {
    let _: () = redis::cmd("RL.DEBUG").arg("CLOCK").arg("SET").arg(us).query(con).unwrap();
}

pub fn clock_advance(con: &mut Connection, us: i64) {
    let _: () = redis::cmd("RL.DEBUG").arg("CLOCK").arg("ADVANCE").arg(us).query(con).unwrap();
}

pub fn clock_get(con: &mut Connection) -> i64 {
    redis::cmd("RL.DEBUG").arg("CLOCK").arg("GET").query(con).unwrap()
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
