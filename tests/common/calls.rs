//! Commands from a line or an argument list, and the small calls the tests share (key
//! inspection, the debug clock, typed limiter replies).

use std::time::{SystemTime, UNIX_EPOCH};

use redis::{Cmd, ConnectionLike, RedisResult, Value};

use super::reply::{err_text, LimiterReply, MultiReply, RlInfo};

/// What a command is built from: a line split on whitespace (`"RL.GCRA k 10 1s"`), or a list
/// of arguments (`&["RL.GCRA", key, "10", "1s"]`, `&Vec<String>`, `&[Vec<u8>]`) taken as they
/// are (an argument may hold spaces or any bytes).
pub trait Args {
    fn cmd(&self) -> Cmd;
    /// The command as shown in a failure message.
    fn shown(&self) -> String;
}

impl Args for str {
    fn cmd(&self) -> Cmd {
        let mut it = self.split_whitespace();
        let mut c = redis::cmd(it.next().expect("empty command"));
        for w in it {
            c.arg(w);
        }
        c
    }
    fn shown(&self) -> String {
        self.to_string()
    }
}

impl Args for String {
    fn cmd(&self) -> Cmd {
        self.as_str().cmd()
    }
    fn shown(&self) -> String {
        self.clone()
    }
}

impl<T: Args + ?Sized> Args for &T {
    fn cmd(&self) -> Cmd {
        (**self).cmd()
    }
    fn shown(&self) -> String {
        (**self).shown()
    }
}

impl<A: AsRef<[u8]>> Args for [A] {
    fn cmd(&self) -> Cmd {
        let mut c = Cmd::new();
        for a in self {
            c.arg(a.as_ref());
        }
        c
    }
    fn shown(&self) -> String {
        self.iter().map(|a| String::from_utf8_lossy(a.as_ref()).into_owned()).collect::<Vec<_>>().join(" ")
    }
}

impl<A: AsRef<[u8]>, const N: usize> Args for [A; N] {
    fn cmd(&self) -> Cmd {
        self[..].cmd()
    }
    fn shown(&self) -> String {
        self[..].shown()
    }
}

impl<A: AsRef<[u8]>> Args for Vec<A> {
    fn cmd(&self) -> Cmd {
        self[..].cmd()
    }
    fn shown(&self) -> String {
        self[..].shown()
    }
}

pub fn try_run<C: ConnectionLike, A: Args + ?Sized>(con: &mut C, args: &A) -> RedisResult<Value> {
    args.cmd().query::<Value>(con)
}

/// Runs a command, panicking with the command and the error if it fails.
pub fn run<C: ConnectionLike, A: Args + ?Sized>(con: &mut C, args: &A) -> Value {
    try_run(con, args).unwrap_or_else(|e| panic!("`{}` failed: {}", args.shown(), err_text(&e)))
}

/// The error a command must answer with (see [`err_text`]); panics if it succeeds.
pub fn run_err<C: ConnectionLike, A: Args + ?Sized>(con: &mut C, args: &A) -> String {
    match try_run(con, args) {
        Ok(v) => panic!("`{}` should fail, got {v:?}", args.shown()),
        Err(e) => err_text(&e),
    }
}

/// A single-key limiter command's reply, decoded.
pub fn limiter<C: ConnectionLike, A: Args + ?Sized>(con: &mut C, args: &A) -> LimiterReply {
    let v = run(con, args);
    LimiterReply::from_value(&v).unwrap_or_else(|e| panic!("`{}`: {e}", args.shown()))
}

/// An RL.MULTI reply, decoded.
pub fn multi<C: ConnectionLike, A: Args + ?Sized>(con: &mut C, args: &A) -> MultiReply {
    let v = run(con, args);
    MultiReply::from_value(&v).unwrap_or_else(|e| panic!("`{}`: {e}", args.shown()))
}

/// RL.INFO of `key`; None when the key is missing.
pub fn rl_info<C: ConnectionLike>(con: &mut C, key: &str) -> Option<RlInfo> {
    RlInfo::of(&run(con, &["RL.INFO", key]))
}

/// An integer field of RL.INFO `key`; panics if the key or the field is missing.
pub fn rl_info_int<C: ConnectionLike>(con: &mut C, key: &str, field: &str) -> i64 {
    rl_info(con, key).unwrap_or_else(|| panic!("RL.INFO {key}: no such key")).int(field)
}

pub fn exists<C: ConnectionLike>(con: &mut C, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).unwrap() == 1
}

/// DUMP of `key`; None when it is missing.
pub fn dump<C: ConnectionLike>(con: &mut C, key: &str) -> Option<Vec<u8>> {
    redis::cmd("DUMP").arg(key).query(con).unwrap()
}

/// DUMP of a key that must exist.
pub fn payload<C: ConnectionLike>(con: &mut C, key: &str) -> Vec<u8> {
    dump(con, key).unwrap_or_else(|| panic!("DUMP {key}: no such key"))
}

pub fn pttl<C: ConnectionLike>(con: &mut C, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).unwrap()
}

/// Absolute expiry in unix ms (does not move with time, unlike PTTL).
pub fn pexpiretime<C: ConnectionLike>(con: &mut C, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME").arg(key).query(con).unwrap()
}

pub fn keyslot<C: ConnectionLike>(con: &mut C, key: &str) -> i64 {
    redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(con).unwrap()
}

/// Sets the module's debug clock (the server runs with `DEBUG_CLOCK`), in µs since the epoch.
pub fn clock_set<C: ConnectionLike>(con: &mut C, us: i64) {
    let _: () = redis::cmd("RL.DEBUG").arg("CLOCK").arg("SET").arg(us).query(con).unwrap();
}

pub fn clock_advance<C: ConnectionLike>(con: &mut C, us: i64) {
    let _: () = redis::cmd("RL.DEBUG").arg("CLOCK").arg("ADVANCE").arg(us).query(con).unwrap();
}

pub fn clock_get<C: ConnectionLike>(con: &mut C) -> i64 {
    redis::cmd("RL.DEBUG").arg("CLOCK").arg("GET").query(con).unwrap()
}

/// The host's wall clock in µs since the epoch (the clock the module reads without DEBUG_CLOCK).
pub fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64
}

pub fn now_ms() -> i64 {
    now_us() / 1000
}
