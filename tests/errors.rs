//! Every documented error, with its exact message, for every command; and after every bad
//! input: the server still answers, and nothing was written (DBSIZE and every key's DUMP
//! unchanged).

mod common;

use common::{err_text, ints, limiter, run, try_run, Opts, Rng, Server};
use redis::{Connection, Value};

const T0: i64 = 1_700_000_000_000_000;

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const PERIOD_FORMAT: &str = "expected a positive integer with an optional unit us, ms, s, m, h or d";

/// (command, algorithm name, rate-based: takes BURST and says "period")
const LIMITERS: [(&str, &str, bool); 6] = [
    ("RL.GCRA", "gcra", true),
    ("RL.TOKENBUCKET", "tokenbucket", true),
    ("RL.LEAKY", "leaky", true),
    ("RL.SLIDING", "sliding", false),
    ("RL.FIXED", "fixed", false),
    ("RL.SLIDINGLOG", "slidinglog", false),
];

/// Keys of other types the fixture creates.
const OTHER_TYPES: [&str; 6] = ["t:string", "t:intstring", "t:list", "t:hash", "t:set", "t:zset"];

// ---------------------------------------------------------------- helpers

fn words(line: &str) -> Vec<Vec<u8>> {
    line.split(' ').filter(|w| !w.is_empty()).map(|w| w.as_bytes().to_vec()).collect()
}

/// Splits `template` on spaces; the word `K` becomes `key`, the word `@` becomes `v`
/// (which may be empty, contain spaces or be any bytes).
fn tpl(template: &str, key: &str, v: &[u8]) -> Vec<Vec<u8>> {
    template
        .split(' ')
        .filter(|w| !w.is_empty())
        .map(|w| match w {
            "K" => key.as_bytes().to_vec(),
            "@" => v.to_vec(),
            w => w.as_bytes().to_vec(),
        })
        .collect()
}

fn show(args: &[Vec<u8>]) -> String {
    args.iter()
        .map(
            |a| {
                if a.len() > 40 {
                    format!("<{} bytes>", a.len())
                } else {
                    format!("{:?}", String::from_utf8_lossy(a))
                }
            },
        )
        .collect::<Vec<_>>()
        .join(" ")
}

/// A server holding one key per algorithm and one per other type; checks after every bad
/// input that the server answers and nothing changed.
struct Fx {
    s: Server,
    c: Connection,
    keys: Vec<String>,
    dbsize: i64,
    dumps: Vec<Option<Vec<u8>>>,
}

impl Fx {
    fn new() -> Fx {
        Fx::with(Server::start())
    }

    fn with(s: Server) -> Fx {
        let c = s.conn();
        let mut fx = Fx { s, c, keys: Vec::new(), dbsize: 0, dumps: Vec::new() };
        fx.ok(&format!("RL.DEBUG CLOCK SET {T0}"));
        // Long periods: the keys' TTLs (real clock) outlive the test by far.
        for (cmd, algo, _) in LIMITERS {
            fx.ok(&format!("{cmd} k:{algo} 2 36525d"));
        }
        fx.ok("SET t:string hello");
        fx.ok("SET t:intstring 1700000000000000000");
        fx.ok("RPUSH t:list a b");
        fx.ok("HSET t:hash f v");
        fx.ok("SADD t:set m");
        fx.ok("ZADD t:zset 1 m");
        fx.keys = LIMITERS.iter().map(|(_, a, _)| format!("k:{a}")).collect();
        fx.keys.extend(OTHER_TYPES.iter().map(|k| k.to_string()));
        fx.snapshot();
        fx
    }

    fn ok(&mut self, line: &str) -> Value {
        run(&mut self.c, line)
    }

    /// Sends a command that must fail. A socket call interrupted on the client's side (EINTR:
    /// the test process was stopped and resumed while blocked, with a socket timeout set; seen
    /// once with a 1-MB argument) leaves the connection mid-command: the command, which writes
    /// nothing, is sent again on a new connection.
    fn send(&mut self, args: &[Vec<u8>]) -> redis::RedisResult<Value> {
        let mut result = try_run(&mut self.c, args);
        for _ in 0..3 {
            match &result {
                Err(e) if e.is_io_error() && e.to_string().contains("os error 4") => {
                    self.c = self.s.conn();
                    result = try_run(&mut self.c, args);
                }
                _ => break,
            }
        }
        result
    }

    fn state(&mut self) -> (i64, Vec<Option<Vec<u8>>>) {
        let mut p = redis::pipe();
        p.cmd("PING").cmd("DBSIZE");
        for k in &self.keys {
            p.cmd("DUMP").arg(k);
        }
        // Absolute expiries (ms), which do not move with time.
        for k in &self.keys {
            p.cmd("PEXPIRETIME").arg(k);
        }
        let mut v: Vec<Value> = p
            .query(&mut self.c)
            .unwrap_or_else(|e| panic!("server did not answer after a bad input: {e}\n{}", self.s.log()));
        assert_eq!(v[0], Value::SimpleString("PONG".into()), "PING");
        let Value::Int(dbsize) = v[1] else { panic!("DBSIZE {:?}", v[1]) };
        let n = self.keys.len();
        let expiries: Vec<Value> = v.drain(2 + n..).collect();
        let dumps = v
            .drain(2..)
            .zip(expiries)
            .map(|(d, e)| match (d, e) {
                (Value::Nil, _) => None,
                // The expiry is part of what must not change: appended to the payload.
                (Value::BulkString(mut b), Value::Int(at)) => {
                    b.extend_from_slice(format!("|pexpiretime={at}").as_bytes());
                    Some(b)
                }
                other => panic!("DUMP/PEXPIRETIME {other:?}"),
            })
            .collect();
        (dbsize, dumps)
    }

    fn snapshot(&mut self) {
        let (dbsize, dumps) = self.state();
        self.dbsize = dbsize;
        self.dumps = dumps;
    }

    /// Runs a command that must fail; returns the error line after checking that nothing
    /// was written.
    #[track_caller]
    fn bad(&mut self, args: &[Vec<u8>]) -> String {
        let msg = match self.send(args) {
            Ok(v) => panic!("`{}` should fail, got {v:?}", show(args)),
            Err(e) => err_text(&e),
        };
        let (dbsize, dumps) = self.state();
        assert_eq!(dbsize, self.dbsize, "`{}` ({msg}) changed DBSIZE", show(args));
        for (k, (a, b)) in self.keys.iter().zip(dumps.iter().zip(&self.dumps)) {
            assert!(a == b, "`{}` ({msg}) changed key {k}", show(args));
        }
        msg
    }

    #[track_caller]
    fn expect(&mut self, args: &[Vec<u8>], want: &str) {
        let got = self.bad(args);
        assert_eq!(got, want, "error of `{}`", show(args));
    }

    #[track_caller]
    fn expect_prefix(&mut self, args: &[Vec<u8>], prefix: &str) -> String {
        let got = self.bad(args);
        assert!(got.starts_with(prefix), "error of `{}`: {got:?} does not start with {prefix:?}", show(args));
        got
    }

    /// `template` against this algorithm's existing key and against a missing key.
    #[track_caller]
    fn expect_both(&mut self, algo: &str, template: &str, v: &[u8], want: &str) {
        for key in [format!("k:{algo}"), "missing".to_string()] {
            self.expect(&tpl(template, &key, v), want);
        }
    }
}

fn arity(cmd: &str) -> String {
    format!("ERR wrong number of arguments for '{}' command", cmd.to_ascii_lowercase())
}

/// Malformed counts (for limit, BURST and COST alike).
fn malformed_counts() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = [
        "-1", "-0", "1.5", "1.0", "1e3", "nan", "NaN", "inf", "-inf", "+5", "", " 5", "5 ", "0x10", "5abc", "١",
        "1,000", "５",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    v.push(b"\xff\xfe".to_vec());
    v.push(b"5\x00".to_vec());
    v.push(b"\x80".to_vec());
    v
}

/// Integers above 10^15 that fit an u64.
const TOO_LARGE: [&str; 5] =
    ["1000000000000001", "9999999999999999", "9223372036854775807", "9223372036854775808", "18446744073709551615"];

/// Integers above 10^15 that overflow an u64 (2^64 and beyond).
const OVERFLOWING: [&str; 3] =
    ["18446744073709551616", "99999999999999999999", "340282366920938463463374607431768211456"];

// ---------------------------------------------------------------- arity

#[test]
fn wrong_arity_answers_the_servers_arity_error() {
    let mut fx = Fx::new();
    for (cmd, algo, _) in LIMITERS {
        for name in [cmd.to_string(), cmd.to_ascii_lowercase()] {
            for rest in ["", "K", "K 1", "K 10s"] {
                let line = format!("{name} {rest}");
                fx.expect(&tpl(&line, &format!("k:{algo}"), b""), &arity(cmd));
                fx.expect(&tpl(&line, "missing", b""), &arity(cmd));
            }
        }
    }
    for rest in ["", "K", "K 1", "K 1 1", "K 1 1 1 1 1", "K 1 1 1 1 1 1"] {
        fx.expect(&tpl(&format!("CL.THROTTLE {rest}"), "k:gcra", b""), &arity("cl.throttle"));
        fx.expect(&tpl(&format!("CL.THROTTLE {rest}"), "missing", b""), &arity("cl.throttle"));
    }
    for cmd in ["RL.INFO", "RL.RESET"] {
        for rest in ["", "K extra", "K a b"] {
            fx.expect(&tpl(&format!("{cmd} {rest}"), "k:gcra", b""), &arity(cmd));
        }
    }
    for rest in ["", "K", "K payload PXAT", "K payload PXAT 1 extra"] {
        fx.expect(&tpl(&format!("RL.SETSTATE {rest}"), "k:gcra", b""), &arity("rl.setstate"));
    }
    fx.expect(&words("RL.MULTI"), &arity("rl.multi"));
}

// ---------------------------------------------------------------- counts

#[test]
fn limit_burst_and_cost_out_of_range_are_refused_naming_them() {
    let mut fx = Fx::new();
    for (cmd, algo, rate) in LIMITERS {
        let mut positions = vec![
            (format!("{cmd} K @ 10s"), "limit", false),
            (format!("{cmd} K 5 10s COST @"), "COST", true),
            (format!("{cmd} K 5 10s DRYRUN COST @ PARTIAL"), "COST", true),
        ];
        if rate {
            positions.push((format!("{cmd} K 5 10s BURST @"), "BURST", false));
            positions.push((format!("{cmd} K 5 10s COST 1 BURST @ DRYRUN"), "BURST", false));
        }
        for (template, name, zero_ok) in &positions {
            let (plain, bound) = if *zero_ok {
                (
                    format!("ERR {name} must be a non-negative integer"),
                    format!("ERR {name} must be a non-negative integer no larger than 1000000000000000"),
                )
            } else {
                (
                    format!("ERR {name} must be a positive integer"),
                    format!("ERR {name} must be a positive integer no larger than 1000000000000000"),
                )
            };
            for v in malformed_counts() {
                fx.expect_both(algo, template, &v, &plain);
            }
            if !zero_ok {
                for v in ["0", "00", "000000"] {
                    fx.expect_both(algo, template, v.as_bytes(), &plain);
                }
            }
            for v in TOO_LARGE {
                fx.expect_both(algo, template, v.as_bytes(), &bound);
            }
        }
    }
    // The bounds themselves are accepted (checked with a peek on a missing key: no write).
    for (cmd, _, rate) in LIMITERS {
        let r = limiter(&mut fx.c, &format!("{cmd} fresh 1000000000000000 1s COST 0"));
        let head = (r.allowed, r.limit, r.remaining, r.retry_after_ms, r.reset_after_ms);
        assert_eq!(head, (0, 1_000_000_000_000_000, 1_000_000_000_000_000, -1, 0), "{cmd}");
        let r = limiter(&mut fx.c, &format!("{cmd} fresh 1 10s COST 1000000000000000 DRYRUN"));
        assert_eq!((r.allowed, r.limit, r.remaining, r.retry_after_ms), (0, 1, 1, -1), "{cmd}");
        if rate {
            let r = limiter(&mut fx.c, &format!("{cmd} fresh 1 1us BURST 1000000000000000 COST 0"));
            assert_eq!((r.allowed, r.limit, r.remaining), (0, 1_000_000_000_000_000, 1_000_000_000_000_000), "{cmd}");
        }
    }
    fx.snapshot_unchanged();
}

impl Fx {
    /// The accepted-input checks above must not have written anything either.
    fn snapshot_unchanged(&mut self) {
        let (dbsize, dumps) = self.state();
        assert_eq!(dbsize, self.dbsize);
        assert!(dumps == self.dumps);
    }
}

/// Documented: values above 10^15 get the "no larger than 1000000000000000" message. This
/// includes values that overflow 64 bits (2^64 and beyond).
#[test]
fn counts_overflowing_u64_report_the_bound() {
    let mut fx = Fx::new();
    let mut failures = Vec::new();
    let mut huge = vec![b'9'; 1 << 20];
    huge[0] = b'1';
    for (cmd, algo, rate) in LIMITERS {
        let mut positions =
            vec![(format!("{cmd} K @ 10s"), "ERR limit must be a positive integer no larger than 1000000000000000")];
        positions.push((
            format!("{cmd} K 5 10s COST @"),
            "ERR COST must be a non-negative integer no larger than 1000000000000000",
        ));
        if rate {
            positions.push((
                format!("{cmd} K 5 10s BURST @"),
                "ERR BURST must be a positive integer no larger than 1000000000000000",
            ));
        }
        for (template, want) in &positions {
            let mut values: Vec<Vec<u8>> = OVERFLOWING.iter().map(|v| v.as_bytes().to_vec()).collect();
            values.push(huge.clone());
            for v in values {
                for key in [format!("k:{algo}"), "missing".to_string()] {
                    let args = tpl(template, &key, &v);
                    let got = fx.bad(&args);
                    if got != *want {
                        failures.push(format!("`{}` → {got:?}", show(&args)));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} inputs above 10^15 did not get the documented message, e.g.:\n{}",
        failures.len(),
        failures.iter().take(6).cloned().collect::<Vec<_>>().join("\n")
    );
}

// ---------------------------------------------------------------- periods and windows

#[test]
fn malformed_or_too_long_periods_and_windows_are_refused() {
    let mut fx = Fx::new();
    let malformed = [
        "0", "00", "0s", "0ms", "0us", "0m", "0h", "0d", "-1", "-1s", "1.5", "1.5s", "nan", "inf", "+5", "+5s", "",
        "s", "ms", "us", "d", "5x", "5sec", "5ns", "5y", "5w", "5 s", " 5", "5s ", "1e3", "5S5", "5msx", "5mss",
        "0x10", "5s5s", "s5", "-0", "١s",
    ];
    let too_large = [
        "36526d",
        "876601h",
        "52596001m",
        "3155760001",
        "3155760001s",
        "3155760000001ms",
        "3155760000000001us",
        "9223372036854775807",
        "9223372036854775807d",
        "9223372036854775808us",
        "18446744073709551615ms",
    ];
    for (cmd, algo, rate) in LIMITERS {
        let name = if rate { "period" } else { "window" };
        for template in [format!("{cmd} K 5 @"), format!("{cmd} K 5 @ COST 0"), format!("{cmd} K 5 @ DRYRUN")] {
            for v in malformed {
                let shown = v.replace('١', "??");
                fx.expect_both(
                    algo,
                    &template,
                    v.as_bytes(),
                    &format!("ERR invalid {name} '{shown}': {PERIOD_FORMAT}"),
                );
            }
            for v in too_large {
                fx.expect_both(
                    algo,
                    &template,
                    v.as_bytes(),
                    &format!("ERR invalid {name} '{v}': at most 100 years (36525d)"),
                );
            }
            // 2^64 does not fit any integer type: either message is fine, it names the argument.
            for v in ["18446744073709551616", "18446744073709551616s", "99999999999999999999999d"] {
                for key in [format!("k:{algo}"), "missing".into()] {
                    fx.expect_prefix(&tpl(&template, &key, v.as_bytes()), &format!("ERR invalid {name} '{v}': "));
                }
            }
            // Bytes that are not UTF-8 (or not printable): still one clean error line.
            for v in [&b"\xff\xfe"[..], b"5\xff", b"5\x00s", b"5\r\ns", "5µs".as_bytes()] {
                for key in [format!("k:{algo}"), "missing".into()] {
                    let got = fx.expect_prefix(&tpl(&template, &key, v), &format!("ERR invalid {name} '"));
                    assert!(got.ends_with(&format!("': {PERIOD_FORMAT}")), "{got}");
                    assert!(!got.contains('\r') && !got.contains('\n') && !got.contains('\0'), "{got:?}");
                }
            }
        }
        // Every unit, any case, up to exactly 100 years, is accepted (peek: nothing written).
        for v in [
            "1us",
            "1US",
            "1ms",
            "1Ms",
            "1s",
            "1S",
            "1",
            "1m",
            "1M",
            "1h",
            "1H",
            "1d",
            "1D",
            "36525d",
            "876600h",
            "52596000m",
            "3155760000",
            "3155760000s",
            "3155760000000ms",
            "3155760000000000us",
            "007s",
        ] {
            let r = limiter(&mut fx.c, &format!("{cmd} fresh 5 {v} COST 0"));
            let head = (r.allowed, r.limit, r.remaining, r.retry_after_ms, r.reset_after_ms);
            assert_eq!(head, (0, 5, 5, -1, 0), "{cmd} period {v}");
        }
    }
    fx.snapshot_unchanged();
}

// ---------------------------------------------------------------- options

#[test]
fn unknown_repeated_or_valueless_options_are_refused() {
    let mut fx = Fx::new();
    for (cmd, algo, rate) in LIMITERS {
        // Unknown options (shown as given).
        for opt in ["FOO", "foo", "BURSTY", "COST5", "-", "DRY", "PARTIALS", "NX", "EX", "1", "DRY-RUN"] {
            for template in
                [format!("{cmd} K 5 10s @"), format!("{cmd} K 5 10s COST 1 @"), format!("{cmd} K 5 10s @ DRYRUN")]
            {
                fx.expect_both(algo, &template, opt.as_bytes(), &format!("ERR unknown option '{opt}'"));
            }
        }
        fx.expect_both(algo, &format!("{cmd} K 5 10s @"), b"", "ERR unknown option ''");
        fx.expect_both(algo, &format!("{cmd} K 5 10s COST 1 2"), b"", "ERR unknown option '2'");
        fx.expect_both(algo, &format!("{cmd} K 5 10s DRYRUN 1"), b"", "ERR unknown option '1'");
        for v in [&b"\xff"[..], b"COST\x00", b"DRY RUN"] {
            for key in [format!("k:{algo}"), "missing".into()] {
                let got = fx.expect_prefix(&tpl(&format!("{cmd} K 5 10s @"), &key, v), "ERR unknown option '");
                assert!(!got.contains('\0'), "{got:?}");
            }
        }
        // Repeated options, any case.
        let mut repeats = vec![
            ("COST 1 COST 1", "COST"),
            ("cost 1 Cost 2", "COST"),
            ("COST 1 DRYRUN COST 0", "COST"),
            ("DRYRUN DRYRUN", "DRYRUN"),
            ("dryrun COST 1 DryRun", "DRYRUN"),
            ("PARTIAL PARTIAL", "PARTIAL"),
            ("partial DRYRUN PARTIAL", "PARTIAL"),
        ];
        if rate {
            repeats.push(("BURST 2 BURST 2", "BURST"));
            repeats.push(("burst 2 COST 1 Burst 3", "BURST"));
        }
        for (opts, name) in repeats {
            fx.expect_both(
                algo,
                &format!("{cmd} K 5 10s {opts}"),
                b"",
                &format!("ERR option {name} given more than once"),
            );
        }
        // An option missing its value.
        fx.expect_both(algo, &format!("{cmd} K 5 10s COST"), b"", "ERR COST needs a value");
        fx.expect_both(algo, &format!("{cmd} K 5 10s DRYRUN cost"), b"", "ERR COST needs a value");
        fx.expect_both(algo, &format!("{cmd} K 5 10s COST DRYRUN"), b"", "ERR COST must be a non-negative integer");
        if rate {
            fx.expect_both(algo, &format!("{cmd} K 5 10s BURST"), b"", "ERR BURST needs a value");
            fx.expect_both(algo, &format!("{cmd} K 5 10s COST 1 burst"), b"", "ERR BURST needs a value");
            fx.expect_both(algo, &format!("{cmd} K 5 10s BURST PARTIAL"), b"", "ERR BURST must be a positive integer");
        } else {
            // BURST is not an option of window commands, with or without a value.
            let want = format!("ERR BURST is not an option of {cmd}");
            for opts in ["BURST 2", "burst 2", "BURST", "COST 1 Burst 5", "BURST 0", "DRYRUN BURST x"] {
                fx.expect_both(algo, &format!("{cmd} K 5 10s {opts}"), b"", &want);
                fx.expect_both(algo, &format!("{} K 5 10s {opts}", cmd.to_ascii_lowercase()), b"", &want);
            }
        }
    }
}

// ---------------------------------------------------------------- wrong types

#[test]
fn wrongtype_on_other_types() {
    let mut fx = Fx::new();
    for key in OTHER_TYPES {
        // A string says why it is the wrong type: an integer string without the TTL redis-cell
        // gives its keys is not one of them (those: tests/cell_interop.rs).
        let expect = |fx: &mut Fx, args: &[Vec<u8>]| match key {
            "t:string" | "t:intstring" => drop(fx.expect_prefix(args, "WRONGTYPE ")),
            _ => fx.expect(args, WRONGTYPE),
        };
        for (cmd, _, rate) in LIMITERS {
            for opts in ["", "COST 0", "DRYRUN", "COST 3 PARTIAL"] {
                expect(&mut fx, &tpl(&format!("{cmd} K 5 10s {opts}"), key, b""));
            }
            if rate {
                expect(&mut fx, &tpl(&format!("{cmd} K 5 10s BURST 7"), key, b""));
            }
            let algo = cmd.trim_start_matches("RL.");
            expect(&mut fx, &tpl(&format!("RL.MULTI 1 K {algo} 5 10s"), key, b""));
            expect(&mut fx, &tpl(&format!("RL.MULTI 2 k:gcra K GCRA 2 36525d {algo} 5 10s"), key, b""));
        }
        expect(&mut fx, &tpl("RL.INFO K", key, b""));
        expect(&mut fx, &tpl("RL.RESET K", key, b""));
        expect(&mut fx, &tpl("RL.RETURN K 1", key, b""));
    }
    // CL.THROTTLE: other types are the wrong type; a string must hold redis-cell's integer.
    for key in ["t:list", "t:hash", "t:set", "t:zset"] {
        for q in ["", "0", "1", "3"] {
            fx.expect(&tpl(&format!("CL.THROTTLE K 4 1 10 {q}"), key, b""), WRONGTYPE);
        }
    }
    for q in ["", "0", "1"] {
        fx.expect_prefix(&tpl(&format!("CL.THROTTLE K 4 1 10 {q}"), "t:string", b""), "WRONGTYPE");
        fx.expect_prefix(&tpl(&format!("CL.THROTTLE K 4 1 10 {q}"), "t:intstring", b""), "WRONGTYPE");
    }
}

#[test]
fn a_key_of_another_algorithm_answers_wrongtype_naming_both() {
    let mut fx = Fx::new();
    for (_, stored, _) in LIMITERS {
        let key = format!("k:{stored}");
        for (cmd, requested, rate) in LIMITERS {
            if requested == stored {
                continue;
            }
            let want = format!("WRONGTYPE key holds {stored} state, not {requested} (RL.RESET it to change algorithm)");
            for opts in ["", "COST 0", "DRYRUN", "COST 9 PARTIAL"] {
                fx.expect(&tpl(&format!("{cmd} K 2 36525d {opts}"), &key, b""), &want);
            }
            if rate {
                fx.expect(&tpl(&format!("{cmd} K 2 36525d BURST 2"), &key, b""), &want);
            }
            let word = cmd.trim_start_matches("RL.");
            fx.expect(&tpl(&format!("RL.MULTI 1 K {word} 2 36525d"), &key, b""), &want);
            fx.expect(&tpl(&format!("RL.MULTI 2 fresh K GCRA 1 1s {word} 2 36525d"), &key, b""), &want);
        }
        if stored != "gcra" {
            let want = format!("WRONGTYPE key holds {stored} state, not gcra (RL.RESET it to change algorithm)");
            for q in ["", "0", "1"] {
                fx.expect(&tpl(&format!("CL.THROTTLE K 1 2 3155760000 {q}"), &key, b""), &want);
            }
        }
    }
}

// ---------------------------------------------------------------- CL.THROTTLE and RL.MULTI arguments

#[test]
fn cl_throttle_argument_errors() {
    let mut fx = Fx::new();
    let mut cases: Vec<(String, &str)> = Vec::new();
    for v in ["-1", "1.5", "nan", "+5", "", "x", "1000000000000000", "18446744073709551616"] {
        cases.push(("CL.THROTTLE K @ 1 10".to_string(), v));
    }
    for v in ["0", "-1", "1.5", "inf", "", "1000000000000001"] {
        cases.push(("CL.THROTTLE K 4 @ 10".to_string(), v));
    }
    for v in ["0", "-1", "1.5", "1s", "10ms", "", "3155760001"] {
        cases.push(("CL.THROTTLE K 4 1 @".to_string(), v));
    }
    for v in ["-1", "1.5", "x", "", "1000000000000001"] {
        cases.push(("CL.THROTTLE K 4 1 10 @".to_string(), v));
    }
    for (template, v) in cases {
        let name = match template.split(' ').position(|w| w == "@") {
            Some(2) => "max_burst",
            Some(3) => "count_per_period",
            Some(4) => "period",
            _ => "quantity",
        };
        for key in ["k:gcra", "missing", "t:intstring"] {
            fx.expect_prefix(&tpl(&template, key, v.as_bytes()), &format!("ERR {name} "));
        }
    }
}

#[test]
fn rl_multi_argument_errors() {
    let mut fx = Fx::new();
    let exact = [
        ("RL.MULTI 1 K GCRA 0 1s", "ERR limit must be a positive integer"),
        ("RL.MULTI 1 K GCRA 1.5 1s", "ERR limit must be a positive integer"),
        (
            "RL.MULTI 1 K GCRA 1000000000000001 1s",
            "ERR limit must be a positive integer no larger than 1000000000000000",
        ),
        (
            "RL.MULTI 1 K GCRA 1 5x",
            "ERR invalid period '5x': expected a positive integer with an optional unit us, ms, s, m, h or d",
        ),
        (
            "RL.MULTI 1 K SLIDING 1 0",
            "ERR invalid window '0': expected a positive integer with an optional unit us, ms, s, m, h or d",
        ),
        ("RL.MULTI 1 K FIXED 1 36526d", "ERR invalid window '36526d': at most 100 years (36525d)"),
        ("RL.MULTI 1 K GCRA 1 1s BURST 0", "ERR BURST must be a positive integer"),
        ("RL.MULTI 1 K LEAKY 1 1s BURST", "ERR BURST needs a value"),
        ("RL.MULTI 1 K GCRA 1 1s COST -1", "ERR COST must be a non-negative integer"),
        ("RL.MULTI 1 K GCRA 1 1s COST", "ERR COST needs a value"),
        ("RL.MULTI 1 K GCRA 1 1s COST 1 COST 1", "ERR option COST given more than once"),
        ("RL.MULTI 1 K GCRA 1 1s DRYRUN DRYRUN", "ERR option DRYRUN given more than once"),
        ("RL.MULTI 1 K GCRA 1 1s FOO", "ERR unknown option 'FOO'"),
        ("RL.MULTI 1 K TOKENBUCKET 1 1s BURST 2 BURST 2", "ERR option BURST given more than once"),
    ];
    for (line, want) in exact {
        for key in ["k:gcra", "missing"] {
            fx.expect(&tpl(line, key, b""), want);
        }
    }
    let prefixed = [
        ("RL.MULTI 0 K GCRA 1 1s", "ERR "),
        ("RL.MULTI -1 K GCRA 1 1s", "ERR "),
        ("RL.MULTI x K GCRA 1 1s", "ERR "),
        ("RL.MULTI 3 K GCRA 1 1s", "ERR "),
        ("RL.MULTI 2 K K GCRA 1 1s GCRA 1 1s", "ERR "),
        ("RL.MULTI 1 K", "ERR "),
        ("RL.MULTI 1 K GCRA 1", "ERR "),
        ("RL.MULTI 1 K FOO 1 1s", "ERR "),
        ("RL.MULTI 2 K other GCRA 1 1s", "ERR "),
        ("RL.MULTI 1 K GCRA 1 1s GCRA 1 1s", "ERR "),
        ("RL.MULTI 1 K SLIDING 1 1s BURST 2", "ERR BURST is not an option of"),
    ];
    for (line, prefix) in prefixed {
        for key in ["k:gcra", "missing"] {
            fx.expect_prefix(&tpl(line, key, b""), prefix);
        }
    }
}

// ---------------------------------------------------------------- RL.DEBUG

#[test]
fn debug_refused_without_debug_clock() {
    let s = Server::start_with(Opts { debug_clock: false, ..Opts::default() });
    let c = s.conn();
    let mut fx = Fx { s, c, keys: vec!["k".into()], dbsize: 0, dumps: Vec::new() };
    // The commands work on the real clock.
    let r = ints(fx.ok("RL.GCRA k 1 1d"));
    assert_eq!(r, vec![1, 1, 0, -1, 86_400_000]);
    fx.snapshot();
    for line in [
        "RL.DEBUG CLOCK SET 1700000000000000",
        "RL.DEBUG CLOCK ADVANCE 1000000",
        "RL.DEBUG CLOCK ADVANCE -1000000",
        "RL.DEBUG CLOCK REAL",
        "RL.DEBUG CLOCK GET",
        "RL.DEBUG CLOCK FOO",
    ] {
        let got = fx.expect_prefix(&words(line), "ERR ");
        assert!(got.contains("DEBUG_CLOCK"), "`{line}`: {got}");
    }
    // Too few arguments may be refused for their number first; an error either way.
    for line in ["RL.DEBUG", "RL.DEBUG FOO"] {
        fx.expect_prefix(&words(line), "ERR ");
    }
    // The clock was not touched: still limited at the real time.
    let r = limiter(&mut fx.c, "RL.GCRA k 1 1d COST 0");
    assert_eq!((r.allowed, r.limit, r.remaining), (0, 1, 0));
}

#[test]
fn malformed_rl_debug_is_refused_and_leaves_the_clock() {
    let mut fx = Fx::new();
    for line in [
        "RL.DEBUG",
        "RL.DEBUG FOO",
        "RL.DEBUG CLOCK",
        "RL.DEBUG CLOCK SET",
        "RL.DEBUG CLOCK SET abc",
        "RL.DEBUG CLOCK SET 1.5",
        "RL.DEBUG CLOCK SET -1",
        "RL.DEBUG CLOCK SET 99999999999999999999",
        "RL.DEBUG CLOCK SET 1 2",
        "RL.DEBUG CLOCK ADVANCE x",
        "RL.DEBUG CLOCK ADVANCE 9223372036854775807",
        "RL.DEBUG CLOCK ADVANCE -9223372036854775807",
        "RL.DEBUG CLOCK GET now",
        "RL.DEBUG CLOCK REAL now",
        "RL.DEBUG CLOCK JUMP 1",
    ] {
        fx.expect_prefix(&words(line), "ERR ");
    }
    assert_eq!(fx.ok("RL.DEBUG CLOCK GET"), Value::Int(T0), "a bad RL.DEBUG moved the clock");
}

// ---------------------------------------------------------------- RL.SETSTATE

#[test]
fn setstate_rejects_garbage() {
    let mut fx = Fx::new();
    // A raw state (not `Rng::new`): the same garbage as ever.
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut payloads: Vec<Vec<u8>> =
        vec![Vec::new(), b"garbage".to_vec(), vec![0; 64], vec![0xff; 64], vec![1], vec![1, 1]];
    payloads.extend((0..=255u8).map(|b| vec![b]));
    for _ in 0..150 {
        let n = (rng.next() % 200) as usize;
        payloads.push(rng.bytes(n));
    }
    // The right version byte and an algorithm tag, followed by garbage of every small length.
    for tag in [1u8, 2, 3, 4, 5, 6, 7, 0x81, 0x80] {
        for n in [0usize, 1, 7, 8, 16, 23, 24, 31, 32, 40, 41, 42, 43, 48, 56, 64, 100] {
            let mut p = vec![1, tag];
            p.extend(rng.bytes(n));
            payloads.push(p);
        }
    }
    let targets = ["k:gcra", "k:slidinglog", "k:fixed", "missing", "t:list", "t:string"];
    for (i, p) in payloads.iter().enumerate() {
        let key = targets[i % targets.len()];
        let args = vec![b"RL.SETSTATE".to_vec(), key.as_bytes().to_vec(), p.clone()];
        fx.expect_prefix(&args, "ERR ");
        if i % 7 == 0 {
            let mut with_pxat = args.clone();
            with_pxat.extend([b"PXAT".to_vec(), b"1700000000000".to_vec()]);
            fx.expect_prefix(&with_pxat, "ERR ");
        }
    }
    // A garbage expiry option.
    for (opt, at) in [("PXAT", "soon"), ("PXAT", "1.5"), ("EXAT", "1"), ("FOO", "1")] {
        let args = vec![
            b"RL.SETSTATE".to_vec(),
            b"missing".to_vec(),
            b"garbage".to_vec(),
            opt.as_bytes().to_vec(),
            at.as_bytes().to_vec(),
        ];
        fx.expect_prefix(&args, "ERR ");
    }
}

// ---------------------------------------------------------------- big arguments

#[test]
fn one_megabyte_arguments_are_refused_without_being_echoed() {
    let mut fx = Fx::new();
    let mb = vec![b'x'; 1 << 20];
    for (cmd, algo, rate) in LIMITERS {
        let name = if rate { "period" } else { "window" };
        fx.expect_both(algo, &format!("{cmd} K @ 10s"), &mb, "ERR limit must be a positive integer");
        fx.expect_both(algo, &format!("{cmd} K 5 10s COST @"), &mb, "ERR COST must be a non-negative integer");
        if rate {
            fx.expect_both(algo, &format!("{cmd} K 5 10s BURST @"), &mb, "ERR BURST must be a positive integer");
        }
        for key in [format!("k:{algo}"), "missing".into()] {
            // The error names the argument without echoing a megabyte back.
            let got = fx.expect_prefix(&tpl(&format!("{cmd} K 5 @"), &key, &mb), &format!("ERR invalid {name} 'xxxx"));
            assert!(got.len() < 300, "error echoes {} bytes", got.len());
            let got = fx.expect_prefix(&tpl(&format!("{cmd} K 5 10s @"), &key, &mb), "ERR unknown option 'xxxx");
            assert!(got.len() < 300, "error echoes {} bytes", got.len());
        }
    }
    for key in ["k:gcra", "missing"] {
        fx.expect_prefix(&tpl("CL.THROTTLE K @ 1 10", key, &mb), "ERR max_burst ");
        fx.expect_prefix(&tpl("CL.THROTTLE K 1 1 10 @", key, &mb), "ERR quantity ");
        fx.expect_prefix(&tpl("RL.SETSTATE K @", key, &mb), "ERR ");
        let got = fx.expect_prefix(&tpl("RL.MULTI 1 K @ 1 1s", key, &mb), "ERR ");
        assert!(got.len() < 300, "error echoes {} bytes", got.len());
    }
    // A 1 MB key name is just a key.
    let big_key = String::from_utf8(mb.clone()).unwrap();
    let r = ints(run(&mut fx.c, &tpl("RL.GCRA K 1 1d", &big_key, b"")));
    assert_eq!(r, vec![1, 1, 0, -1, 86_400_000]);
    let r = ints(run(&mut fx.c, &tpl("RL.GCRA K 1 1d", &big_key, b"")));
    assert_eq!(r, vec![0, 1, 0, 86_400_000, 86_400_000]);
    assert_eq!(run(&mut fx.c, &tpl("RL.RESET K", &big_key, b"")), Value::Int(1));
    fx.snapshot_unchanged();
    assert!(fx.s.alive());
}
