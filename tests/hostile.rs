//! Hostile input: hundreds of thousands of random argument vectors across every command,
//! pipelined in batches; forged and mutated RL.SETSTATE payloads. The server must stay up,
//! every reply must have a valid shape (or be an ERR/WRONGTYPE error, exactly the one the
//! module's own parsers predict), nothing may be written on an error, a DRYRUN, a peek or a
//! limited call, and every state the server ends up holding must survive DUMP/RESTORE and a
//! DEBUG RELOAD.
//!
//! Seeded (`RL_SEED=n` replays a run); `RL_LONG=1` sends ten times more.

mod common;
#[path = "common/robust.rs"]
mod robust;

use std::collections::BTreeMap;
use std::time::Instant;

use common::resp::{Reply, Resp};
use common::{hex, now_ms, Opts, Rng, Server};
use redis_ratelimit::args;
use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::spec::{Spec, Update};
use redis_ratelimit_core::Algorithm;
use redis_ratelimit_core::{Nanos, Request, MAX_COUNT, NANOS_PER_MICRO, NANOS_PER_MILLI, NANOS_PER_SEC};
use robust::*;

const T0_US: i64 = 1_700_000_000_000_000;

fn srv_opts() -> Opts {
    Opts { extra: vec![("rdbcompression".into(), "no".into())], ..Opts::default() }
}

// ---------------------------------------------------------------------------------------------
// Random tokens.

const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "5",
    "10",
    "100",
    "1000",
    "-1",
    "-0",
    "+1",
    "01",
    "007",
    "00",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "1000000000000000",
    "1000000000000001",
    "999999999999999",
    "4294967296",
    "2147483648",
];
const FLOATS: &[&str] = &[
    "1.5", "0.0", "1e3", "1E3", "nan", "NaN", "-nan", "inf", "-inf", "+inf", "Infinity", "0x10", " 1", "1 ", "1\t",
    "1_000", "1,5", "١", "１",
];
const PERIODS: &[&str] = &[
    "1s",
    "100ms",
    "1us",
    "1m",
    "1h",
    "1d",
    "36525d",
    "36526d",
    "0s",
    "1S",
    "1Ms",
    "1US",
    "1H",
    "5x",
    "s",
    "ms",
    "1.5s",
    "-1s",
    "1 s",
    "9223372036854775807us",
    "3155760000000000us",
    "3155760000000001us",
    "3155760000000s",
    "52596000m",
    "876600h",
    "876601h",
    "1sec",
    "1msms",
    "1s1",
    "10",
    "0",
    "1dd",
];
const OPTIONS: &[&str] = &[
    "BURST", "COST", "DRYRUN", "PARTIAL", "burst", "cost", "dryrun", "partial", "Burst", "FOO", "BURSTS", "PXAT", "NX",
    "EX",
];
const ALGOS: &[&str] =
    &["GCRA", "TOKENBUCKET", "SLIDING", "SLIDINGLOG", "FIXED", "LEAKY", "gcra", "Leaky", "LEAKYY", "CELL"];
const WEIRD: &[&[u8]] =
    &[b"", b"\0", b"\r\n", b"*1\r\n$4\r\nPING\r\n", b"\xff\xfe", b"\x80", b"\xc3\x28", b"\xed\xa0\x80", b"'", b"%s%n"];

struct Gen {
    rng: Rng,
    /// 1 MB strings still to hand out (a few per run).
    big_left: usize,
    fresh: u64,
}

impl Gen {
    fn token(&mut self) -> Vec<u8> {
        let r = &mut self.rng;
        match r.below(100) {
            0..=24 => r.pick(NUMBERS).as_bytes().to_vec(),
            25..=29 => r.next().to_string().into_bytes(),
            30..=34 => r.range(0, 5000).to_string().into_bytes(),
            35..=42 => r.pick(FLOATS).as_bytes().to_vec(),
            43..=57 => r.pick(PERIODS).as_bytes().to_vec(),
            58..=74 => r.pick(OPTIONS).as_bytes().to_vec(),
            75..=80 => r.pick(ALGOS).as_bytes().to_vec(),
            81..=88 => r.pick(WEIRD).to_vec(),
            89..=93 => {
                let n = r.below(17) as usize;
                r.bytes(n)
            }
            94..=96 => vec![b'1'; 20 + r.below(1000) as usize],
            97 if self.big_left > 0 && r.chance(3) => {
                self.big_left -= 1;
                let mut v = vec![b'9'; 1 << 20];
                v[0] = b'1';
                v
            }
            _ => format!("{}{}", r.range(1, 1_000_000), r.pick(&["us", "ms", "s", "m", "h", "d"])).into_bytes(),
        }
    }

    /// A key for a command of `owner`: mostly keys only that command uses (so that most
    /// calls reach the algorithm), some shared by all (WRONGTYPE between algorithms), some of
    /// other Redis types, fresh ones and odd names.
    fn key_for(&mut self, owner: &str) -> Vec<u8> {
        if self.rng.chance(45) {
            let owner = if owner.eq_ignore_ascii_case("CL.THROTTLE") { "RL.GCRA" } else { owner };
            return format!("o:{}:{}", owner.to_ascii_uppercase(), self.rng.below(8)).into_bytes();
        }
        self.key()
    }

    fn key(&mut self) -> Vec<u8> {
        let r = &mut self.rng;
        match r.below(100) {
            0..=29 => r.pick(TYPED_KEYS).as_bytes().to_vec(),
            30..=74 => format!("r:{}", r.below(32)).into_bytes(),
            75..=89 => {
                self.fresh += 1;
                format!("f:{}", self.fresh).into_bytes()
            }
            90..=95 => r.pick(&[&b""[..], b"\xff\xfe", b"\0k", b"k\r\n"]).to_vec(),
            96 if self.big_left > 0 && r.chance(5) => {
                self.big_left -= 1;
                vec![b'k'; 1 << 20]
            }
            _ => vec![b'K'; 1 + r.below(2000) as usize],
        }
    }

    fn case(&mut self, w: &str) -> Vec<u8> {
        w.chars().map(|c| if self.rng.chance(30) { c.to_ascii_lowercase() } else { c }).collect::<String>().into_bytes()
    }

    fn valid_limit(&mut self) -> u64 {
        let r = &mut self.rng;
        match r.below(10) {
            0 => 1,
            1 => 2,
            2 => 10,
            3 => 100,
            4 => MAX_COUNT,
            5 => r.range(1, 1_000_000) as u64,
            6 => r.range(1, MAX_COUNT as i64) as u64,
            _ => r.range(1, 50) as u64,
        }
    }

    fn valid_period(&mut self) -> Vec<u8> {
        let r = &mut self.rng;
        match r.below(8) {
            0 => r.pick(&["1us", "1ms", "100ms", "1s", "1m", "1h", "1d", "36525d"]).as_bytes().to_vec(),
            1 => format!("{}", r.range(1, 100)).into_bytes(),
            _ => format!("{}{}", r.range(1, 5000), r.pick(&["us", "ms", "s", "m", "h", "d", "MS", "S"])).into_bytes(),
        }
    }

    /// `limit period [options]`, valid or close to it.
    fn limiter_args(&mut self, bucket: bool) -> Vec<Vec<u8>> {
        if self.rng.chance(25) {
            let n = self.rng.below(12) as usize;
            return (0..n).map(|_| self.token()).collect();
        }
        let limit = self.valid_limit();
        let mut v = vec![limit.to_string().into_bytes(), self.valid_period()];
        let mut opts: Vec<Vec<Vec<u8>>> = Vec::new();
        if bucket && self.rng.chance(40) {
            let b = if self.rng.chance(50) { self.valid_limit() } else { limit * 2 };
            opts.push(vec![self.case("BURST"), b.to_string().into_bytes()]);
        }
        if self.rng.chance(50) {
            let c = match self.rng.below(5) {
                0 => 0,
                1 => limit,
                2 => limit + 1,
                _ => self.rng.range(0, 5) as u64,
            };
            opts.push(vec![self.case("COST"), c.to_string().into_bytes()]);
        }
        if self.rng.chance(20) {
            opts.push(vec![self.case("DRYRUN")]);
        }
        if self.rng.chance(25) {
            opts.push(vec![self.case("PARTIAL")]);
        }
        for i in (1..opts.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            opts.swap(i, j);
        }
        v.extend(opts.into_iter().flatten());
        self.mutate(&mut v, 35);
        v
    }

    /// With probability `pct`, 1–3 random edits: replace, insert, delete or repeat a token.
    fn mutate(&mut self, v: &mut Vec<Vec<u8>>, pct: u64) {
        if !self.rng.chance(pct) {
            return;
        }
        for _ in 0..self.rng.range(1, 3) {
            let len = v.len() as u64;
            match self.rng.below(4) {
                0 if len > 0 => {
                    let i = self.rng.below(len) as usize;
                    v[i] = self.token();
                }
                1 => {
                    let i = self.rng.below(len + 1) as usize;
                    let t = self.token();
                    v.insert(i, t);
                }
                2 if len > 0 => {
                    let i = self.rng.below(len) as usize;
                    v.remove(i);
                }
                _ if len > 0 => {
                    let i = self.rng.below(len) as usize;
                    let t = v[i].clone();
                    v.push(t);
                }
                _ => {}
            }
        }
    }

    fn multi_args(&mut self) -> Vec<Vec<u8>> {
        let n = self.rng.range(1, 4) as usize;
        let mut v = vec![n.to_string().into_bytes()];
        if self.rng.chance(10) {
            v[0] = self.token();
        }
        let algos: Vec<&str> = (0..n)
            .map(|_| *self.rng.pick(&["GCRA", "TOKENBUCKET", "SLIDING", "SLIDINGLOG", "FIXED", "LEAKY"]))
            .collect();
        for a in &algos {
            let k = self.key_for(&format!("RL.{a}"));
            v.push(k);
        }
        for &a in &algos {
            v.push(self.case(a));
            let limit = self.valid_limit();
            v.push(limit.to_string().into_bytes());
            v.push(self.valid_period());
            if matches!(a, "GCRA" | "TOKENBUCKET" | "LEAKY") && self.rng.chance(30) {
                v.push(b"BURST".to_vec());
                v.push(self.valid_limit().to_string().into_bytes());
            }
        }
        if self.rng.chance(50) {
            v.push(b"COST".to_vec());
            v.push(self.rng.range(0, 4).to_string().into_bytes());
        }
        if self.rng.chance(20) {
            v.push(self.case("DRYRUN"));
        }
        if self.rng.chance(20) {
            v.push(self.case("PARTIAL"));
        }
        self.mutate(&mut v, 40);
        v
    }

    fn throttle_args(&mut self) -> Vec<Vec<u8>> {
        let r = &mut self.rng;
        let mut v = vec![
            r.range(0, 100).to_string().into_bytes(),
            r.range(1, 100).to_string().into_bytes(),
            r.range(1, 3600).to_string().into_bytes(),
        ];
        if r.chance(60) {
            v.push(r.range(0, 5).to_string().into_bytes());
        }
        self.mutate(&mut v, 40);
        v
    }

    fn debug_args(&mut self) -> Vec<Vec<u8>> {
        let r = &mut self.rng;
        let mut v: Vec<Vec<u8>> = match r.below(6) {
            0 => vec![
                b"CLOCK".to_vec(),
                b"SET".to_vec(),
                (T0_US + r.range(-10_000_000_000, 10_000_000_000)).to_string().into_bytes(),
            ],
            1 => vec![b"CLOCK".to_vec(), b"ADVANCE".to_vec(), r.range(-5_000_000, 60_000_000).to_string().into_bytes()],
            2 => vec![b"CLOCK".to_vec(), b"GET".to_vec()],
            3 => vec![b"clock".to_vec(), b"real".to_vec()],
            _ => vec![
                b"CLOCK".to_vec(),
                r.pick(&[&b"SET"[..], b"ADVANCE"]).to_vec(),
                r.pick(NUMBERS).as_bytes().to_vec(),
            ],
        };
        self.mutate(&mut v, 30);
        v
    }
}

const TYPED_KEYS: &[&str] = &["t:str", "t:int", "t:list", "t:hash", "t:set", "t:zset", "t:stream"];

fn typed_setup() -> Vec<Vec<Vec<u8>>> {
    let mut v: Vec<Vec<Vec<u8>>> = vec![];
    let mut del = args!["DEL"];
    del.extend(TYPED_KEYS.iter().map(|k| k.as_bytes().to_vec()));
    v.push(del);
    v.push(args!["SET", "t:str", "hello"]);
    v.push(args!["SET", "t:int", "1700000000000000000"]);
    v.push(args!["RPUSH", "t:list", "a", "b"]);
    v.push(args!["HSET", "t:hash", "f", "v"]);
    v.push(args!["SADD", "t:set", "m"]);
    v.push(args!["ZADD", "t:zset", "1", "m"]);
    v.push(args!["XADD", "t:stream", "*", "f", "v"]);
    v
}

// ---------------------------------------------------------------------------------------------
// Payloads for RL.SETSTATE: valid states from the core, then mutated.

fn random_spec(rng: &mut Rng) -> Spec {
    let cmd = *rng.pick(&LIMITERS);
    let limit = match rng.below(6) {
        0 => MAX_COUNT,
        1 => 1,
        2 => rng.range(1, 1_000_000_000) as u64,
        _ => rng.range(1, 100) as u64,
    };
    let period: i64 = match rng.below(5) {
        0 => 36_525 * 86_400 * NANOS_PER_SEC,
        1 => NANOS_PER_MICRO,
        _ => rng.range(1, 10_000) * NANOS_PER_MILLI,
    };
    let burst = if is_bucket(cmd) && rng.chance(30) { rng.range(1, 1000) as u64 } else { limit };
    // A burst that would take over 200 years to refill is refused by Rate::new: fall back.
    if is_bucket(cmd) && redis_ratelimit_core::Rate::new(limit, Nanos::new(period), burst).is_err() {
        return spec_of(cmd, 10, NANOS_PER_SEC, None);
    }
    spec_of(cmd, limit, period, Some(burst))
}

/// A valid payload (a state, or a sliding-log commit) produced by running the core.
fn valid_payload(rng: &mut Rng) -> Vec<u8> {
    let spec = random_spec(rng);
    let mut model = Model::default();
    let mut now = T0_US * NANOS_PER_MICRO + rng.range(-1_000_000_000_000, 1_000_000_000_000) * 1000;
    let mut last_update = None;
    for _ in 0..rng.range(1, 6) {
        now += rng.range(-1_000_000, 5_000_000_000);
        let cost = rng.range(0, 3) as u64;
        let (_, u) =
            spec.check(model.state.as_ref(), Nanos::new(now), Request { cost, partial: rng.chance(50) }).unwrap();
        if let Some(u) = u {
            model.apply(&u);
            last_update = Some(u);
        }
    }
    let mut out = Vec::new();
    match (last_update, rng.chance(40)) {
        (Some(u @ Update::Log(_)), true) => u.encode_into(&mut out),
        _ => match &model.state {
            Some(s) => s.encode_into(&mut out),
            None => {
                let (_, u) = spec.check(None, Nanos::new(now), Request::new(1)).unwrap();
                u.unwrap().encode_into(&mut out);
            }
        },
    }
    out
}

thread_local! {
    /// Payloads written by the core that its own decoder refused (a codec bug).
    static CORE_PAYLOAD_REFUSED: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn mutate_payload(rng: &mut Rng, p: &mut Vec<u8>) {
    const EXTREMES: [u64; 8] =
        [0, 1, u64::MAX, i64::MAX as u64, i64::MIN as u64, MAX_COUNT, MAX_COUNT + 1, 2 * MAX_COUNT];
    for _ in 0..rng.range(1, 3) {
        let len = p.len() as u64;
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len) as usize;
                p[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len) as usize;
                p[i] = rng.next() as u8;
            }
            2 => p.truncate(rng.below(len + 1) as usize),
            3 => {
                let n = rng.range(1, 24) as usize;
                let extra = rng.bytes(n);
                p.extend(extra);
            }
            4 if len >= 10 => {
                let fields = (len - 2) / 8;
                let i = 2 + 8 * rng.below(fields) as usize;
                let v = *rng.pick(&EXTREMES);
                p[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
            5 if len >= 2 => p[rng.below(2) as usize] = *rng.pick(&[0u8, 1, 2, 6, 7, 0x81, 0xff]),
            6 if len >= 10 => {
                // Duplicate or drop one 8-byte word (shifts every later field).
                let i = 2 + 8 * rng.below((len - 2) / 8) as usize;
                let w: Vec<u8> = p[i..i + 8].to_vec();
                if rng.chance(50) {
                    p.splice(i..i, w);
                } else {
                    p.drain(i..i + 8);
                }
            }
            _ => {}
        }
    }
}

fn payload(rng: &mut Rng) -> Vec<u8> {
    match rng.below(10) {
        0 => {
            let n = rng.below(120) as usize;
            rng.bytes(n)
        }
        1..=3 => {
            let p = valid_payload(rng);
            // What the core itself produced is always accepted back.
            if let Err(e) = Update::decode(&p) {
                CORE_PAYLOAD_REFUSED.with(|v| v.borrow_mut().push(format!("{} ({e})", hex(&p))));
            }
            p
        }
        _ => {
            let mut p = valid_payload(rng);
            mutate_payload(rng, &mut p);
            p
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What each command must answer, predicted with the module's own parsers.

/// RL.MULTI as parsed: (numkeys, per key (leaky, capacity), request, dry run).
type MultiExpect = (usize, Vec<(bool, u64)>, Request, bool);

#[derive(Debug)]
enum Expect {
    Limiter {
        leaky: bool,
        parsed: Result<args::CheckArgs, String>,
    },
    Throttle(Result<(u64 /*burst*/, u64 /*quantity*/), String>),
    Multi(Result<MultiExpect, String>),
    Info(Option<String>),
    Reset(Option<String>),
    SetState(Result<(), String>),
    Debug,
    /// Refused by Redis for the declared arity.
    Arity(String),
}

fn algo_of(cmd: &str) -> Option<(Algorithm, &'static str)> {
    Some(match cmd.to_ascii_uppercase().as_str() {
        "RL.GCRA" => (Algorithm::Gcra, "RL.GCRA"),
        "RL.TOKENBUCKET" => (Algorithm::TokenBucket, "RL.TOKENBUCKET"),
        "RL.LEAKY" => (Algorithm::Leaky, "RL.LEAKY"),
        "RL.SLIDING" => (Algorithm::Sliding, "RL.SLIDING"),
        "RL.FIXED" => (Algorithm::Fixed, "RL.FIXED"),
        "RL.SLIDINGLOG" => (Algorithm::SlidingLog, "RL.SLIDINGLOG"),
        _ => return None,
    })
}

/// The arity each command declares through RedisModule_SetCommandInfo: Redis itself refuses a
/// call with the wrong number of arguments before the module sees it.
fn declared_arity(cmd: &str) -> i64 {
    match cmd {
        "RL.MULTI" => -6,
        "RL.INFO" | "RL.RESET" => 2,
        "CL.THROTTLE" => -5,
        "RL.SETSTATE" | "RL.DEBUG" => -3,
        _ => -4,
    }
}

fn predict(argv: &[Vec<u8>]) -> Expect {
    let cmd = String::from_utf8_lossy(&argv[0]).to_ascii_uppercase();
    let a: Vec<&[u8]> = argv.iter().map(|x| x.as_slice()).collect();
    let arity = declared_arity(&cmd);
    if (arity > 0 && a.len() as i64 != arity) || (a.len() as i64) < -arity {
        return Expect::Arity(args::wrong_arity(&cmd));
    }
    if let Some((algo, name)) = algo_of(&cmd) {
        let parsed = if a.len() < 4 { Err(args::wrong_arity(name)) } else { args::check(algo, &a[2..], name) };
        return Expect::Limiter { leaky: algo == Algorithm::Leaky, parsed };
    }
    match cmd.as_str() {
        "CL.THROTTLE" => Expect::Throttle(if a.len() < 5 {
            Err(args::wrong_arity("cl.throttle"))
        } else {
            args::cl_throttle(&a[2..]).map(|(r, q)| (r.burst, q))
        }),
        "RL.MULTI" => Expect::Multi((|| {
            if a.len() < 2 {
                return Err(args::wrong_arity("rl.multi"));
            }
            let numkeys = match args::non_negative(a[1], "numkeys") {
                Ok(n) if n >= 1 && (n as usize) <= a.len() - 2 => n as usize,
                _ => {
                    return Err("ERR numkeys must be a positive integer no larger than the number of keys given".into())
                }
            };
            let keys = &a[2..2 + numkeys];
            // The limits are parsed first, then the keys checked for duplicates.
            let m = args::multi(&a[2 + numkeys..], numkeys)?;
            for (i, k) in keys.iter().enumerate() {
                if keys[..i].contains(k) {
                    return Err("ERR RL.MULTI keys must be distinct".into());
                }
            }
            let specs = m.specs.iter().map(|s| (s.algorithm() == Algorithm::Leaky, capacity(s))).collect();
            Ok((numkeys, specs, m.req, m.dryrun))
        })()),
        "RL.INFO" => Expect::Info((a.len() != 2).then(|| args::wrong_arity("rl.info"))),
        "RL.RESET" => Expect::Reset((a.len() != 2).then(|| args::wrong_arity("rl.reset"))),
        "RL.SETSTATE" => Expect::SetState((|| {
            if a.len() != 3 && a.len() != 5 {
                return Err(args::wrong_arity("rl.setstate"));
            }
            let u = Update::decode(a[2]).map_err(|e| format!("ERR invalid state payload: {e}"))?;
            if a.len() == 5 {
                if !a[3].eq_ignore_ascii_case(b"PXAT") {
                    return Err(format!("ERR unknown option '{}'", args::shown(a[3])));
                }
                args::integer(a[4], "PXAT")?;
            }
            if let Update::Log(c) = &u {
                if c.units > c.win.limit {
                    return Err("ERR invalid state payload: more units than the limit".into());
                }
            }
            Ok(())
        })()),
        "RL.DEBUG" => Expect::Debug,
        other => panic!("no prediction for {other}"),
    }
}

/// Unwraps a RESP3 map into named values (or a RESP2 flat array into the same).
/// Checks a reply against the prediction. Ok(true) when the call may have written (so the
/// keys it names may change), Ok(false) when it must not have.
fn verify(exp: &Expect, r: &Reply) -> Result<bool, String> {
    let err = r.error_text();
    if let Some(e) = &err {
        if e.contains("internal error") {
            return Err(format!("module panicked (caught): {e}"));
        }
        if !(e.starts_with("ERR ") || e.starts_with("WRONGTYPE ")) {
            return Err(format!("error with an unexpected code: {e}"));
        }
    }
    // An expected parse error must be exactly the predicted one.
    let expect_error = |want: &String| -> Result<bool, String> {
        match &err {
            Some(e) if e == want => Ok(false),
            _ => Err(format!("expected error {want:?}, got {r:?}")),
        }
    };
    // Parsed fine: the only acceptable error is WRONGTYPE (the key's content is not tracked).
    let wrongtype_ok = || -> Result<bool, String> {
        match &err {
            Some(e) if e.starts_with("WRONGTYPE") => Ok(false),
            Some(e) => Err(format!("arguments are valid but the reply is {e}")),
            None => unreachable!(),
        }
    };
    match exp {
        Expect::Limiter { parsed: Err(want), .. }
        | Expect::Throttle(Err(want))
        | Expect::Multi(Err(want))
        | Expect::SetState(Err(want)) => expect_error(want),
        Expect::Info(Some(want)) | Expect::Reset(Some(want)) | Expect::Arity(want) => expect_error(want),
        _ if err.is_some() => match exp {
            Expect::Debug => Ok(false),
            // A log commit is refused when, added to what the key already holds, it would
            // exceed any limit (the key's content is not tracked here).
            Expect::SetState(Ok(())) if err.as_deref().is_some_and(|e| e.contains("more units than any limit")) => {
                Ok(false)
            }
            _ => wrongtype_ok(),
        },
        Expect::Limiter { leaky, parsed: Ok(c) } => {
            let v = limiter_reply(r, *leaky)?;
            if v.limit as u64 != capacity(&c.spec) {
                return Err(format!("limit field {} ≠ capacity {}", v.limit, capacity(&c.spec)));
            }
            let allowed = v.allowed as u64;
            if allowed > c.req.cost || (!c.req.partial && allowed != 0 && allowed != c.req.cost) {
                return Err(format!("allowed {allowed} for COST {} partial {}", c.req.cost, c.req.partial));
            }
            if c.req.cost == 0 && v.retry_after_ms != -1 {
                return Err(format!("a peek has retry_after {}", v.retry_after_ms));
            }
            // A limited call whose parameters differ from the stored ones keeps the converted
            // state (nothing consumed), so only peeks and DRYRUN are sure to write nothing.
            Ok(c.req.cost > 0 && !c.dryrun)
        }
        Expect::Throttle(Ok((burst, q))) => {
            let v = cell_reply(r)?;
            if v.limit as u64 != *burst {
                return Err(format!("limit {} ≠ max_burst+1 {burst}", v.limit));
            }
            if *q == 0 && v.limited != 0 {
                return Err("quantity 0 limited".into());
            }
            // Admitted, or limited under new parameters (the converted state is kept).
            Ok(*q > 0)
        }
        Expect::Multi(Ok((n, specs, req, dryrun))) => {
            let (allowed, retry, limits): (i64, i64, Vec<Reply>) = match r {
                Reply::Array(Some(a)) if a.len() == 2 + n => {
                    (a[0].int().ok_or("allowed")?, a[1].int().ok_or("retry")?, a[2..].to_vec())
                }
                Reply::Map(_) => {
                    let m = r.pairs().ok_or("bad map")?;
                    let names: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
                    if names != ["allowed", "retry_after_ms", "limits"] {
                        return Err(format!("RL.MULTI map keys {names:?}"));
                    }
                    let l = m[2].1.array().ok_or("limits not an array")?.to_vec();
                    if l.len() != *n {
                        return Err(format!("{} limits for {n} keys", l.len()));
                    }
                    (m[0].1.int().ok_or("allowed")?, m[1].1.int().ok_or("retry")?, l)
                }
                _ => return Err(format!("RL.MULTI reply shape for {n} keys: {r:?}")),
            };
            if allowed < 0 || allowed as u64 > req.cost || (!req.partial && allowed != 0 && allowed as u64 != req.cost)
            {
                return Err(format!("RL.MULTI allowed {allowed} for COST {}", req.cost));
            }
            // Admitted: no retry; refused: a retry of at least 1 ms or -1 (never admissible).
            let retry_ok = if allowed > 0 { retry == -1 } else { retry == -1 || retry >= 1 };
            if !retry_ok {
                return Err(format!("RL.MULTI retry {retry} with allowed {allowed}"));
            }
            for (l, (leaky, cap)) in limits.iter().zip(specs) {
                let v = limiter_reply(l, *leaky)?;
                if v.limit as u64 != *cap {
                    return Err(format!("RL.MULTI limit field {} ≠ {cap}", v.limit));
                }
                if allowed == 0 && v.allowed != 0 {
                    return Err("RL.MULTI refused but a limit shows units allowed".into());
                }
            }
            // A refused RL.MULTI consumes nothing, but a limit that refused under new
            // parameters keeps its converted state (as the single-key commands do).
            Ok(req.cost > 0 && !dryrun)
        }
        Expect::Info(None) => {
            if r.is_nil() {
                return Ok(false);
            }
            let m = r.pairs().ok_or_else(|| format!("RL.INFO shape {r:?}"))?;
            let algo = m
                .first()
                .filter(|(k, _)| k == "algorithm")
                .and_then(|(_, v)| v.bulk())
                .ok_or("RL.INFO: no algorithm first")?;
            if !Algorithm::ALL.iter().any(|a| a.name().as_bytes() == algo) {
                return Err(format!("RL.INFO algorithm {:?}", String::from_utf8_lossy(algo)));
            }
            // A key redis-cell left (`t:int`) says so in a `source` field; every other field is an integer.
            let from_cell = m.get(1).is_some_and(|(k, v)| k == "source" && v.bulk() == Some(&b"redis-cell"[..]));
            let ints = if from_cell { &m[2..] } else { &m[1..] };
            if m.last().map(|(k, _)| k.as_str()) != Some("ttl_ms") || ints.iter().any(|(_, v)| v.int().is_none()) {
                return Err(format!("RL.INFO fields {m:?}"));
            }
            Ok(false)
        }
        Expect::Reset(None) => match r.int() {
            Some(0) => Ok(false),
            Some(1) => Ok(true),
            _ => Err(format!("RL.RESET replied {r:?}")),
        },
        Expect::SetState(Ok(())) => match r {
            Reply::Status(s) if s == b"OK" => Ok(true),
            _ => Err(format!("RL.SETSTATE replied {r:?}")),
        },
        Expect::Debug => match r {
            Reply::Status(s) if s == b"OK" => Ok(false),
            Reply::Int(i) if *i >= 0 => Ok(false),
            _ => Err(format!("RL.DEBUG replied {r:?}")),
        },
    }
}

/// The keys a command names (for the before/after DUMP comparison).
fn keys_of(argv: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let cmd = String::from_utf8_lossy(&argv[0]).to_ascii_uppercase();
    match cmd.as_str() {
        "RL.DEBUG" => vec![],
        "RL.MULTI" => {
            let n = std::str::from_utf8(argv.get(1).map(|v| v.as_slice()).unwrap_or(b""))
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
                .unwrap_or(1)
                .clamp(1, 4);
            argv.iter().skip(2).take(n).cloned().collect()
        }
        _ => argv.get(1).cloned().into_iter().collect(),
    }
}

fn shorten(a: &[u8]) -> String {
    let s = String::from_utf8_lossy(&a[..a.len().min(40)]).into_owned();
    if a.len() > 40 {
        format!("{s}…({} bytes)", a.len())
    } else {
        s
    }
}

fn show(argv: &[Vec<u8>]) -> String {
    argv.iter().map(|a| format!("{:?}", shorten(a))).collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------------------------

enum Slot {
    Setup,
    Ping,
    Cmd(usize),
    Before(usize),
    After(usize),
}

/// Every key of the database: DUMP → RESTORE into a scratch key must work (every state the
/// server holds can be serialized and loaded back). Returns the failures.
fn restore_check(c: &mut Resp) -> (usize, Vec<String>) {
    let mut cursor = b"0".to_vec();
    let mut keys = Vec::new();
    loop {
        let r = c.cmd(&[b"SCAN", &cursor, b"COUNT", b"1000"]);
        let a = r.array().unwrap();
        cursor = a[0].bulk().unwrap().to_vec();
        keys.extend(a[1].array().unwrap().iter().map(|k| k.bulk().unwrap().to_vec()));
        if cursor == b"0" {
            break;
        }
    }
    let mut failures = Vec::new();
    for k in &keys {
        if c.cmd(&[b"TYPE", k]).bulk() != Some(b"ratelimit") {
            continue;
        }
        let d = c.cmd(&[b"DUMP", k]);
        let Some(d) = d.bulk().map(|b| b.to_vec()) else { continue };
        let r = c.cmd(&[b"RESTORE", b"__restore_check__", b"0", &d, b"REPLACE"]);
        if r.is_error() {
            let info = c.cmd(&[b"RL.INFO", k]);
            failures.push(format!(
                "key {:?}: DUMP payload does not RESTORE ({}); RL.INFO {:?}; DUMP {}",
                shorten(k),
                r.error_text().unwrap(),
                info.pairs().unwrap_or_default(),
                hex(&d)
            ));
        }
    }
    c.cmd(&[b"DEL", b"__restore_check__"]);
    (keys.len(), failures)
}

#[test]
fn hostile_random_argument_vectors() {
    let server = Server::start_with(srv_opts());
    let seed = seed(0x00C0_FFEE);
    let mut g = Gen { rng: Rng::new(seed), big_left: 6, fresh: 0 };
    let total: usize = if long() { 1_000_000 } else { 100_000 };
    let batch = 1000;
    let mut c2 = Resp::connect(server.port);
    let mut c3 = Resp::connect(server.port);
    assert!(matches!(c3.c(&["HELLO", "3"]), Reply::Map(_)));
    c2.c(&["RL.DEBUG", "CLOCK", "SET", &T0_US.to_string()]);
    let commands = [
        "RL.GCRA",
        "RL.TOKENBUCKET",
        "RL.LEAKY",
        "RL.SLIDING",
        "RL.FIXED",
        "RL.SLIDINGLOG",
        "RL.MULTI",
        "RL.INFO",
        "RL.RESET",
        "CL.THROTTLE",
        "RL.SETSTATE",
        "RL.DEBUG",
    ];
    let mut per_cmd: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut failures: Vec<String> = Vec::new();
    let (mut sent, mut compared, mut big_sent) = (0usize, 0usize, 0usize);
    let started = Instant::now();
    let mut b = 0;
    while sent < total {
        let resp3 = b % 8 == 7;
        b += 1;
        let mut cmds: Vec<Vec<Vec<u8>>> = Vec::new();
        let mut slots = Vec::new();
        let mut logical: Vec<(Vec<Vec<u8>>, Expect, usize)> = Vec::new(); // argv, expectation, #keys sampled
        for s in typed_setup() {
            cmds.push(s);
            slots.push(Slot::Setup);
        }
        for _ in 0..batch {
            let name = *g.rng.pick(&commands);
            let mut argv = vec![g.case(name)];
            match name {
                "RL.MULTI" => argv.extend(g.multi_args()),
                "CL.THROTTLE" => {
                    argv.push(g.key_for(name));
                    argv.extend(g.throttle_args());
                }
                "RL.INFO" | "RL.RESET" => {
                    argv.push(g.key());
                    if g.rng.chance(10) {
                        argv.push(g.token());
                    }
                    if g.rng.chance(3) {
                        argv.pop();
                    }
                }
                "RL.SETSTATE" => {
                    argv.push(g.key());
                    argv.push(payload(&mut g.rng));
                    if g.rng.chance(70) {
                        argv.push(g.case("PXAT"));
                        argv.push((now_ms() + g.rng.range(-1000, 10_000_000)).to_string().into_bytes());
                    }
                    let mut rest = argv.split_off(1);
                    g.mutate(&mut rest, 5);
                    argv.extend(rest);
                }
                "RL.DEBUG" => argv.extend(g.debug_args()),
                _ => {
                    argv.push(g.key_for(name));
                    argv.extend(g.limiter_args(is_bucket(name)));
                }
            }
            if argv.is_empty() {
                continue;
            }
            big_sent += argv.iter().filter(|a| a.len() >= 1 << 20).count();
            let exp = predict(&argv);
            let idx = logical.len();
            // Sample ~12%: DUMP and PEXPIRETIME of the named keys before and after.
            let keys = if g.rng.chance(12) { keys_of(&argv) } else { vec![] };
            for k in keys.iter() {
                cmds.push(vec![b"DUMP".to_vec(), k.clone()]);
                slots.push(Slot::Before(idx));
                cmds.push(vec![b"PEXPIRETIME".to_vec(), k.clone()]);
                slots.push(Slot::Before(idx));
            }
            cmds.push(argv.clone());
            slots.push(Slot::Cmd(idx));
            for k in keys.iter() {
                cmds.push(vec![b"DUMP".to_vec(), k.clone()]);
                slots.push(Slot::After(idx));
                cmds.push(vec![b"PEXPIRETIME".to_vec(), k.clone()]);
                slots.push(Slot::After(idx));
            }
            logical.push((argv, exp, keys.len()));
        }
        cmds.push(args!["PING"]);
        slots.push(Slot::Ping);
        let con = if resp3 { &mut c3 } else { &mut c2 };
        let replies = con.pipeline(&cmds).unwrap_or_else(|e| {
            panic!("batch {b}: connection failed ({e}): server crashed? alive: {}\n{}", server.alive(), server.log())
        });
        let mut before: Vec<Vec<Reply>> = logical.iter().map(|(_, _, n)| Vec::with_capacity(2 * n)).collect();
        let mut after: Vec<Vec<Reply>> = before.clone();
        let mut wrote = vec![false; logical.len()];
        for (slot, r) in slots.iter().zip(&replies) {
            match *slot {
                Slot::Setup => assert!(!r.is_error(), "setup: {r:?}"),
                Slot::Ping => assert_eq!(r, &Reply::Status(b"PONG".to_vec()), "PING after batch {b}"),
                Slot::Before(i) => before[i].push(r.clone()),
                Slot::After(i) => after[i].push(r.clone()),
                Slot::Cmd(i) => {
                    let (argv, exp, _) = &logical[i];
                    let name = String::from_utf8_lossy(&argv[0]).to_ascii_uppercase();
                    let e = per_cmd.entry(name).or_default();
                    e.0 += 1;
                    e.1 += r.is_error() as u64;
                    match verify(exp, r) {
                        Ok(w) => wrote[i] = w,
                        Err(msg) => failures.push(format!("{}: {msg}", show(argv))),
                    }
                }
            }
        }
        let now_ms = now_ms();
        for (i, (argv, _, n)) in logical.iter().enumerate() {
            if *n == 0 || wrote[i] {
                continue;
            }
            compared += 1;
            for j in 0..*n {
                let (d0, e0) = (&before[i][2 * j], &before[i][2 * j + 1]);
                let (d1, e1) = (&after[i][2 * j], &after[i][2 * j + 1]);
                // A key whose TTL ran out during the batch may vanish between any two of these
                // four commands: nothing can be concluded about it.
                let expired = e0.int().is_some_and(|t| (t == -2 && !d0.is_nil()) || (t > 0 && t <= now_ms));
                if (d0 != d1 || e0 != e1) && !expired {
                    failures.push(format!(
                        "{}: a call that must write nothing changed key #{j}: DUMP {:?} → {:?}, PEXPIRETIME {e0:?} → {e1:?}",
                        show(argv),
                        d0.bulk().map(hex),
                        d1.bulk().map(hex)
                    ));
                }
            }
        }
        sent += logical.len();
        if failures.len() > 50 {
            break;
        }
    }
    let elapsed = started.elapsed();
    assert!(server.alive(), "server died\n{}", server.log());
    let mut c = Resp::connect(server.port);
    let (nkeys, restore_failures) = restore_check(&mut c);
    let dbsize = c.c(&["DBSIZE"]).int().unwrap();
    let reload =
        if restore_failures.is_empty() { c.c(&["DEBUG", "RELOAD"]) } else { Reply::Status(b"skipped".to_vec()) };
    for (cmd, (n, e)) in &per_cmd {
        println!("hostile: {cmd:<15} sent {n:>6}, errors {e:>6}, valid replies {:>6}", n - e);
    }
    println!(
        "hostile: seed {seed}, vectors sent {sent} in {:.1} s ({} of 1 MB args), no-write checks {compared}, keys at the end {nkeys} (DBSIZE {dbsize}), \
         DEBUG RELOAD {reload:?}, reply failures {}, unrestorable states {}, crashes: 0",
        elapsed.as_secs_f64(),
        big_sent,
        failures.len(),
        restore_failures.len()
    );
    assert!(server.alive(), "server died after DEBUG RELOAD\n{}", server.log());
    let log = server.log();
    assert!(!log.contains("panicked"), "the module panicked:\n{log}");
    for f in failures.iter().take(20) {
        eprintln!("FAILURE {f}");
    }
    for f in restore_failures.iter().take(10) {
        eprintln!("UNRESTORABLE {f}");
    }
    assert!(failures.is_empty(), "{} replies broke the contract (first: {})", failures.len(), failures[0]);
    assert!(
        restore_failures.is_empty(),
        "{} states the module holds cannot be loaded back (first: {})",
        restore_failures.len(),
        restore_failures[0]
    );
    assert_eq!(reload, Reply::Status(b"OK".to_vec()), "DEBUG RELOAD failed\n{}", server.log());
    assert!(sent >= total);
}

/// RL.SETSTATE with forged payloads: the reply is exactly what decoding predicts, the stored
/// state is exactly the decoded one (or the decoded commit applied), every command still works
/// on it afterwards, and it can always be saved and loaded.
#[test]
fn setstate_mutated_payloads_never_crash_and_stay_loadable() {
    let server = Server::start_with(srv_opts());
    let seed = seed(0x5E75_7A7E);
    let mut rng = Rng::new(seed);
    let mut c = Resp::connect(server.port);
    c.c(&["RL.DEBUG", "CLOCK", "SET", &T0_US.to_string()]);
    let n = if long() { 200_000 } else { 20_000 };
    let keys = 16;
    let mut models: Vec<Model> = vec![Model::default(); keys];
    let (mut ok, mut refused, mut follow_ups) = (0, 0, 0);
    let mut failures: Vec<String> = Vec::new();
    let far = (now_ms() + 10 * 365 * 86_400_000).to_string();
    let mut i = 0;
    while i < n {
        let mut cmds = Vec::new();
        let mut plan = Vec::new();
        for _ in 0..500 {
            let k = rng.below(keys as u64) as usize;
            let key = format!("s:{k}");
            let p = payload(&mut rng);
            let predicted = Update::decode(&p).map_err(|e| format!("ERR invalid state payload: {e}")).and_then(|u| {
                if let Update::Log(c) = &u {
                    if c.units > c.win.limit {
                        return Err("ERR invalid state payload: more units than the limit".to_string());
                    }
                }
                Ok(u)
            });
            cmds.push(vec![
                b"RL.SETSTATE".to_vec(),
                key.clone().into_bytes(),
                p.clone(),
                b"PXAT".to_vec(),
                far.clone().into_bytes(),
            ]);
            // Then: RL.INFO, a call of every algorithm (WRONGTYPE for all but one), a DUMP.
            cmds.push(args!["RL.INFO", key]);
            for cmd in LIMITERS {
                cmds.push(args![cmd, key, "10", "1s", "DRYRUN"]);
            }
            cmds.push(args!["DUMP", key]);
            plan.push((k, p, predicted));
            i += 1;
        }
        let replies = c.pipeline(&cmds).unwrap_or_else(|e| panic!("connection failed ({e}): crash?\n{}", server.log()));
        let per = 2 + LIMITERS.len() + 1;
        for (j, (k, p, predicted)) in plan.into_iter().enumerate() {
            let r = &replies[j * per..(j + 1) * per];
            let ctx = format!("RL.SETSTATE s:{k} {}", hex(&p));
            // A log commit needs a sliding log (or no key): known only now, in reply order.
            let predicted = predicted.and_then(|u| match (&u, &models[k].state) {
                (Update::Log(_), Some(s)) if !matches!(s, State::SlidingLog(_)) => {
                    Err("WRONGTYPE key does not hold a sliding log".to_string())
                }
                _ => Ok(u),
            });
            match (&predicted, &r[0]) {
                (Ok(u), Reply::Status(s)) if s == b"OK" => {
                    ok += 1;
                    models[k].apply(u);
                }
                (Err(want), Reply::Error(e)) if want.as_bytes() == &e[..] => refused += 1,
                (want, got) => {
                    failures.push(format!("{ctx}: predicted {want:?}, got {got:?}"));
                    continue;
                }
            }
            let Some(state) = models[k].state.clone() else { continue };
            // RL.INFO names the algorithm.
            let algorithm = r[1].field("algorithm");
            if algorithm.as_ref().and_then(Reply::bulk) != Some(state.algorithm().name().as_bytes()) {
                failures.push(format!("{ctx}: RL.INFO {:?} for a {} state", r[1], state.algorithm().name()));
            }
            // Exactly one algorithm answers; the others say WRONGTYPE. Nobody panics.
            for (a, cmd) in LIMITERS.iter().enumerate() {
                let reply = &r[2 + a];
                follow_ups += 1;
                let mine = algo_of(cmd).unwrap().0 == state.algorithm();
                let good = if mine {
                    limiter_reply(reply, *cmd == "RL.LEAKY").is_ok()
                } else {
                    reply.error_text().is_some_and(|e| e.starts_with("WRONGTYPE"))
                };
                if !good {
                    failures.push(format!("{ctx}: then {cmd} s:{k} 10 1s DRYRUN answered {reply:?}"));
                } else if mine {
                    // Exactly the core's answer on that state.
                    let spec = spec_of(cmd, 10, NANOS_PER_SEC, None);
                    let d = models[k].check(&spec, T0_US, Request::new(1), true);
                    let want = decision_ints(&d, *cmd == "RL.LEAKY");
                    if reply.ints().as_ref() != Some(&want) {
                        failures.push(format!(
                            "{ctx}: then {cmd} s:{k} 10 1s DRYRUN answered {reply:?}, the core says {want:?}"
                        ));
                    }
                }
            }
            // The server holds exactly the model's state.
            let dump = r[2 + LIMITERS.len()].bulk().unwrap_or_default();
            let enc = models[k].encoded().unwrap();
            if !contains(dump, &enc) {
                failures.push(format!("{ctx}: stored state differs from the model's {}", hex(&enc)));
            }
        }
        if failures.len() > 30 {
            break;
        }
    }
    assert!(server.alive(), "server died\n{}", server.log());
    let (nkeys, unrestorable) = restore_check(&mut c);
    println!(
        "setstate: seed {seed}, payloads {i}, accepted {ok}, refused {refused}, follow-up calls {follow_ups}, keys {nkeys}, \
         contract failures {}, unrestorable states {}, crashes: 0",
        failures.len(),
        unrestorable.len()
    );
    for f in failures.iter().take(10) {
        eprintln!("FAILURE {f}");
    }
    for f in unrestorable.iter().take(5) {
        eprintln!("UNRESTORABLE {f}");
    }
    let refused = CORE_PAYLOAD_REFUSED.with(|v| v.take());
    for f in refused.iter().take(5) {
        eprintln!("CORE PAYLOAD REFUSED BY ITS OWN DECODER {f}");
    }
    assert!(failures.is_empty(), "{} failures (first: {})", failures.len(), failures[0]);
    assert!(
        refused.is_empty(),
        "{} payloads written by the core are refused by State/Update::decode (first: {})",
        refused.len(),
        refused[0]
    );
    assert!(
        unrestorable.is_empty(),
        "{} states cannot be loaded back (first: {})",
        unrestorable.len(),
        unrestorable[0]
    );
    if unrestorable.is_empty() {
        assert_eq!(c.c(&["DEBUG", "RELOAD"]), Reply::Status(b"OK".to_vec()), "DEBUG RELOAD\n{}", server.log());
    }
}

/// Without DEBUG_CLOCK, RL.DEBUG refuses everything, whatever its arguments.
#[test]
fn rl_debug_is_refused_without_debug_clock() {
    let server = Server::start_with(Opts { debug_clock: false, ..Opts::default() });
    let mut c = Resp::connect(server.port);
    let mut g = Gen { rng: Rng::new(seed(7)), big_left: 0, fresh: 0 };
    let mut cmds = Vec::new();
    for _ in 0..2000 {
        let mut v = vec![b"RL.DEBUG".to_vec()];
        v.extend(g.debug_args());
        cmds.push(v);
    }
    cmds.push(args!["RL.DEBUG"]);
    for (argv, r) in cmds.iter().zip(c.pipeline(&cmds).unwrap()) {
        let want = if argv.len() < 3 {
            "ERR wrong number of arguments for 'rl.debug' command"
        } else {
            "ERR RL.DEBUG is disabled: load the module with the argument DEBUG_CLOCK"
        };
        assert_eq!(r.error_text().as_deref(), Some(want), "{}", show(argv));
    }
    assert!(server.alive());
    println!("rl.debug without DEBUG_CLOCK: {} vectors refused, crashes: 0", cmds.len());
}

/// One RL.MULTI with many keys must not block the (single-threaded) server: its cost should be
/// linear in its size. The keys' distinctness is checked pairwise, before the limits are even
/// parsed, so a ~200 kB command that is invalid anyway held the server for seconds.
#[test]
fn rl_multi_with_many_keys_does_not_block_the_server() {
    let server = Server::start();
    let mut c = Resp::connect(server.port);
    let n = 20_000;
    let mut argv: Vec<Vec<u8>> = vec![b"RL.MULTI".to_vec(), n.to_string().into_bytes()];
    argv.extend((0..n).map(|i| format!("k{i}").into_bytes()));
    argv.extend(args!["GCRA", "10", "1s"]); // one limit for 20,000 keys: an error
    let t = Instant::now();
    let r = c.pipeline(&[argv]).unwrap().remove(0);
    let took = t.elapsed();
    println!("RL.MULTI with {n} keys answered {:?} in {took:?}", r.error_text());
    assert!(r.error_text().is_some_and(|e| e.starts_with("ERR ")), "{r:?}");
    assert!(
        took < std::time::Duration::from_millis(500),
        "RL.MULTI with {n} keys (and one limit) held the server for {took:?}: the pairwise distinct-key \
         check is quadratic (60,000 keys: ~40 s)"
    );
}
