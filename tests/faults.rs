//! Fault injection: clocks stepping backwards and jumping forwards (DEBUG_CLOCK), kill -9 under
//! load with the AOF on, states with extreme parameters through DUMP/RESTORE and RDB reloads,
//! and RDB files written by earlier encoding versions (tests/fixtures/rdb-v<N>/).
//!
//! `RL_LONG=1` runs more rounds. Regenerate the v1 fixture (only when the encoding changes
//! *and* the version is bumped; never rewrite an old version's file) with
//! `cargo test --release --test faults generate_rdb_fixtures -- --ignored`.

mod common;
#[path = "common/robust.rs"]
mod robust;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::resp::{Reply, Resp};
use common::{hex, now_ms, unhex, Opts, Rng, Server};
use redis_ratelimit_core::spec::Spec;
use redis_ratelimit_core::{Decision, Nanos, Request, MAX_COUNT, NANOS_PER_MICRO, NANOS_PER_MILLI, NANOS_PER_SEC};
use robust::*;

const T0_US: i64 = 1_700_000_000_000_000;
/// The debug clock's upper end (the sliding log's timestamp range, year 2255).
const MAX_US: i64 = (1 << 53) - 1;
const DAY_US: i64 = 86_400_000_000;
const YEAR_US: i64 = 36_525 * DAY_US / 100;

fn ok(r: &Reply) {
    assert_eq!(r, &Reply::Status(b"OK".to_vec()), "expected OK");
}

fn uncompressed() -> Opts {
    Opts { extra: vec![("rdbcompression".into(), "no".into())], ..Opts::default() }
}

/// One limiter under test: command, key, arguments after the key, the core's spec.
#[derive(Clone)]
struct Lim {
    cmd: &'static str,
    key: String,
    args: Vec<String>,
    spec: Spec,
}

impl Lim {
    /// The six limiters and CL.THROTTLE with small capacities and the given time unit.
    fn all(prefix: &str, rng: &mut Rng) -> Vec<Lim> {
        let mut v = Vec::new();
        for cmd in LIMITERS {
            let limit = rng.range(1, 8) as u64;
            // Periods of minutes and more: TTLs run on the server's real clock, so a short one
            // could expire while the debug clock stands still, and the core (the model) would
            // not know.
            let period_ms = *rng.pick(&[60_000i64, 3_600_000, 86_400_000]);
            let mut args = vec![limit.to_string(), format!("{period_ms}ms")];
            let burst = if is_bucket(cmd) && rng.chance(50) {
                let b = rng.range(1, 10) as u64;
                args.extend(["BURST".to_string(), b.to_string()]);
                Some(b)
            } else {
                None
            };
            v.push(Lim {
                cmd,
                key: format!("{prefix}:{cmd}"),
                args,
                spec: spec_of(cmd, limit, period_ms * NANOS_PER_MILLI, burst),
            });
        }
        let (mb, count, secs) = (rng.range(0, 6) as u64, rng.range(1, 5) as u64, rng.range(60, 7200));
        v.push(Lim {
            cmd: "CL.THROTTLE",
            key: format!("{prefix}:CL.THROTTLE"),
            args: vec![mb.to_string(), count.to_string(), secs.to_string()],
            spec: throttle_spec(mb, count, secs),
        });
        v
    }

    fn capacity(&self) -> u64 {
        capacity(&self.spec)
    }

    /// The time unit to step by: one emission interval or one window (µs).
    fn unit_us(&self) -> i64 {
        match self.spec {
            Spec::Gcra(r) | Spec::TokenBucket(r) | Spec::Leaky(r) => {
                (r.period.as_i64() / r.limit as i64 / NANOS_PER_MICRO).max(1)
            }
            Spec::Sliding(w) | Spec::Fixed(w) | Spec::SlidingLog(w) => w.window.as_i64() / NANOS_PER_MICRO,
        }
    }

    fn argv(&self, key: &str, cost: u64, dryrun: bool) -> Vec<String> {
        let mut a = vec![self.cmd.to_string(), key.to_string()];
        a.extend(self.args.iter().cloned());
        if self.cmd == "CL.THROTTLE" {
            a.push(cost.to_string());
        } else {
            a.extend(["COST".to_string(), cost.to_string()]);
            if dryrun {
                a.push("DRYRUN".into());
            }
        }
        a
    }

    /// Calls the server and the model at `now_us`; the replies must be identical.
    fn call(&self, c: &mut Resp, model: &mut Model, key: &str, now_us: i64, cost: u64, dryrun: bool) -> Decision {
        let argv = self.argv(key, cost, dryrun);
        let refs: Vec<&str> = argv.iter().map(|s| s.as_str()).collect();
        let r = c.c(&refs);
        let d = model.check(&self.spec, now_us, Request::new(cost), dryrun);
        let (got, want) = if self.cmd == "CL.THROTTLE" {
            (throttle_ints(&r), throttle_ints_of(&d, cost))
        } else {
            (limiter_ints(&r, self.cmd == "RL.LEAKY"), decision_ints(&d, self.cmd == "RL.LEAKY"))
        };
        let got = got.unwrap_or_else(|e| panic!("{argv:?} at {now_us}: {e}"));
        assert_eq!(got, want, "{argv:?} at {now_us}: server vs core");
        d
    }
}

fn assert_stored(c: &mut Resp, key: &str, model: &Model, what: &str) {
    let dump = c.c(&["DUMP", key]);
    match model.encoded() {
        Some(enc) => {
            let d = dump.bulk().unwrap_or_else(|| panic!("{what}: {key} missing, the core holds a state"));
            assert!(contains(d, &enc), "{what}: {key} holds another state than the core's {}", hex(&enc));
        }
        None => assert!(dump.is_nil(), "{what}: {key} exists, the core has no state"),
    }
}

// ---------------------------------------------------------------------------------------------
// Clock faults.

#[test]
fn clock_stepping_backwards_never_hands_out_capacity() {
    let server = Server::start_with(uncompressed());
    let mut c = Resp::connect(server.port);
    let seed = seed(0xBAC4_3A2D);
    let mut rng = Rng::new(seed);
    let rounds = if long() { 300 } else { 40 };
    let (mut calls, mut back_steps, mut admitted_back) = (0u64, 0u64, 0u64);
    for round in 0..rounds {
        for lim in Lim::all(&format!("back{round}"), &mut rng) {
            let key = lim.key.clone();
            let mut model = Model::default();
            let u = lim.unit_us();
            let mut now = T0_US + rng.range(0, 1000 * u);
            // Some traffic going forward.
            for _ in 0..rng.range(0, 12) {
                now += rng.range(0, 2 * u);
                c.clock_set(now);
                lim.call(&mut c, &mut model, &key, now, rng.range(0, 2) as u64, false);
                calls += 1;
            }
            // T: far enough that the key is back to fresh, then one admitted call, so the state
            // knows T.
            now += 1000 * u + 10 * YEAR_US * (rng.chance(10) as i64);
            let t = now;
            c.clock_set(t);
            let first = lim.call(&mut c, &mut model, &key, t, 1, false);
            assert_eq!(first.allowed, 1, "{key}: fresh call at T not admitted");
            for _ in 0..rng.range(0, lim.capacity() as i64) {
                lim.call(&mut c, &mut model, &key, t, 1, false);
            }
            let r_t = lim.call(&mut c, &mut model, &key, t, 0, false).remaining;
            calls += 3;
            // Step back and take all there is.
            let back = match rng.below(7) {
                0 => 1,
                1 => rng.range(1, u),
                2 => u,
                3 => rng.range(u, 10 * u),
                4 => DAY_US,
                5 => YEAR_US,
                _ => t, // to the epoch
            };
            let t_back = t - back;
            c.clock_set(t_back);
            back_steps += 1;
            let peek = lim.call(&mut c, &mut model, &key, t_back, 0, false);
            assert!(peek.remaining <= r_t, "{key}: {} available {back} µs back, {r_t} at T", peek.remaining);
            let mut taken = 0;
            for _ in 0..lim.capacity() + 2 {
                let d = lim.call(&mut c, &mut model, &key, t_back, 1, false);
                calls += 1;
                if d.allowed == 0 {
                    break;
                }
                taken += d.allowed;
            }
            admitted_back += taken;
            assert!(taken <= r_t, "{key}: {taken} units admitted {back} µs back, only {r_t} were available at T");
            assert_stored(&mut c, &key, &model, "after stepping back");
            // Back at T: what was taken in the past is gone at T too.
            c.clock_set(t);
            let again = lim.call(&mut c, &mut model, &key, t, 0, false);
            calls += 1;
            assert!(
                again.remaining <= r_t - taken,
                "{key}: {} available at T after {taken} taken {back} µs back (had {r_t})",
                again.remaining
            );
        }
    }
    assert!(server.alive());
    let log = server.log();
    assert!(!log.contains("panicked") && !log.contains("internal error"), "{log}");
    println!(
        "clock back: seed {seed}, calls {calls}, backward steps {back_steps} (1 µs .. to the epoch), units admitted in the past {admitted_back}, \
         mismatches with the core: 0, extra capacity: 0, errors: 0, crashes: 0"
    );
}

#[test]
fn clock_jumping_forward_is_like_elapsed_time() {
    let server = Server::start_with(uncompressed());
    let mut c = Resp::connect(server.port);
    let seed = seed(0xF0_4A2D);
    let mut rng = Rng::new(seed);
    let rounds = if long() { 100 } else { 15 };
    let mut jumps = 0;
    for round in 0..rounds {
        for lim in Lim::all(&format!("fwd{round}"), &mut rng) {
            let (ka, kb) = (format!("{}:a", lim.key), format!("{}:b", lim.key));
            let (mut ma, mut mb) = (Model::default(), Model::default());
            let u = lim.unit_us();
            let mut now = T0_US + rng.range(0, 100 * u);
            // Identical histories.
            for _ in 0..rng.range(1, 10) {
                now += rng.range(0, u);
                c.clock_set(now);
                let cost = rng.range(0, 3) as u64;
                lim.call(&mut c, &mut ma, &ka, now, cost, false);
                lim.call(&mut c, &mut mb, &kb, now, cost, false);
            }
            let jump = match rng.below(6) {
                0 => rng.range(1, u),
                1 => rng.range(u, 20 * u),
                2 => DAY_US,
                3 => YEAR_US,
                4 => 100 * YEAR_US,
                _ => MAX_US - now,
            };
            let end = now + jump;
            // B walks there in small steps, peeking (RL.INFO and COST 0) on the way.
            let steps = rng.range(1, 20);
            for s in 1..steps {
                let t = now + jump / steps * s;
                ok(&c.c(&["RL.DEBUG", "CLOCK", "ADVANCE", &(jump / steps).to_string()]));
                lim.call(&mut c, &mut mb, &kb, t, 0, false);
                assert!(!c.c(&["RL.INFO", &kb]).is_error());
            }
            // A jumps there at once.
            c.clock_set(end);
            let cost = rng.range(1, 3) as u64;
            let da = lim.call(&mut c, &mut ma, &ka, end, cost, false);
            let db = lim.call(&mut c, &mut mb, &kb, end, cost, false);
            assert_eq!(da, db, "{}: jump of {jump} µs vs {steps} steps", lim.key);
            let (a, b) = (c.c(&["DUMP", &ka]), c.c(&["DUMP", &kb]));
            assert_eq!(a, b, "{}: state after a jump of {jump} µs differs from stepping there", lim.key);
            assert_stored(&mut c, &ka, &ma, "after the jump");
            // Past the reset time the key is exactly a fresh one.
            if jump > 2 * u + (lim.capacity() as i64 + 3) * u {
                let kc = format!("{}:c", lim.key);
                let mut mc = Model::default();
                let dc = lim.call(&mut c, &mut mc, &kc, end, cost, false);
                let dump_c = c.c(&["DUMP", &kc]);
                assert_eq!(da, dc, "{}: after a jump of {jump} µs the key does not answer like a fresh one", lim.key);
                if da.allowed > 0 {
                    assert_eq!(a, dump_c, "{}: after a jump of {jump} µs the state is not a fresh key's", lim.key);
                }
            }
            jumps += 1;
        }
    }
    assert!(server.alive());
    println!("clock forward: seed {seed}, jumps {jumps} (1 µs .. to year 2255), jump ≡ stepping ≡ core, crashes: 0");
}

// ---------------------------------------------------------------------------------------------
// A parameter change (operator reconfigures a limit) on a key that is currently limited.

/// "Parameters may change between calls on a key (new ones apply)". A client that is limited
/// under the new parameters and waits exactly retry_after_ms must then be admitted.
#[test]
fn parameter_change_retry_after_is_honest() {
    let server = Server::start();
    let mut c = Resp::connect(server.port);
    // (command, old arguments that use the key up, new arguments: a faster rate / shorter window)
    let cases: [(&str, &str, &str); 6] = [
        ("RL.GCRA", "10 1m COST 10", "1000 1m"),
        ("RL.TOKENBUCKET", "10 1m COST 10", "1000 1m"),
        ("RL.LEAKY", "10 1m COST 10", "1000 1m"),
        ("RL.FIXED", "10 1h COST 10", "10 1s"),
        ("RL.SLIDING", "10 1h COST 10", "10 1s"),
        ("RL.SLIDINGLOG", "10 1h COST 10", "10 1s"),
    ];
    let mut broken = Vec::new();
    for (cmd, old, new) in cases {
        let key = format!("pc:{cmd}");
        let mut now = T0_US;
        c.clock_set(now);
        let mut a: Vec<&str> = vec![cmd, &key];
        a.extend(old.split(' '));
        let r = limiter_reply(&c.c(&a), cmd == "RL.LEAKY").unwrap();
        assert_eq!(r.allowed, 10, "{cmd} {old}: {r:?}");
        let mut b: Vec<&str> = vec![cmd, &key];
        b.extend(new.split(' '));
        let mut polls = Vec::new();
        for _ in 0..4 {
            let r = limiter_reply(&c.c(&b), cmd == "RL.LEAKY").unwrap();
            polls.push(format!("t+{}ms {:?}", (now - T0_US) / 1000, r.ints()));
            if r.allowed > 0 {
                break;
            }
            now += r.retry_after_ms * 1000;
            c.clock_set(now);
        }
        println!("parameter change {cmd}: {old} then {new}: {}", polls.join(" → "));
        if polls.len() > 2 {
            broken.push(format!(
                "{cmd} {key} {old}, then {cmd} {key} {new} at retry_after_ms each time: {}",
                polls.join(" → ")
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "after a parameter change, waiting retry_after_ms does not get a limited key admitted \
         (limited calls keep the old parameters' state):\n{}",
        broken.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Extreme parameters: every state the module writes can be loaded back.

fn restores(c: &mut Resp, key: &str) -> Result<(), String> {
    let d = c.c(&["DUMP", key]);
    let d = d.bulk().ok_or_else(|| format!("{key}: no DUMP ({d:?})"))?.to_vec();
    let r = c.cmd(&[b"RESTORE", b"__copy__", b"0", &d, b"REPLACE"]);
    if let Some(e) = r.error_text() {
        return Err(format!("{key}: its own DUMP does not RESTORE: {e}; RL.INFO {:?}", c.c(&["RL.INFO", key]).pairs()));
    }
    let back = c.c(&["DUMP", "__copy__"]);
    if back.bulk() != Some(&d[..]) {
        return Err(format!("{key}: RESTORE changed the state"));
    }
    Ok(())
}

#[test]
fn states_with_extreme_parameters_survive_dump_restore_and_reload() {
    let server = Server::start();
    let mut c = Resp::connect(server.port);
    let max = MAX_COUNT.to_string();
    let half = (MAX_COUNT / 2).to_string();
    let mut keys = Vec::new();
    let mut failures = Vec::new();
    // Today (real clock), year 2255 (the debug clock's end), the epoch.
    for (ci, clock) in [None, Some(MAX_US - 10 * YEAR_US), Some(1_000_000)].into_iter().enumerate() {
        match clock {
            None => ok(&c.c(&["RL.DEBUG", "CLOCK", "REAL"])),
            Some(us) => c.clock_set(us),
        }
        let mut calls: Vec<Vec<String>> = Vec::new();
        for cmd in ["RL.GCRA", "RL.TOKENBUCKET", "RL.LEAKY"] {
            for (period, cost) in [("36525d", &half), ("36525d", &max), ("1h", &max), ("1us", &max)] {
                calls.push([cmd, "", &max, period, "COST", cost].iter().map(|s| s.to_string()).collect());
            }
            calls.push([cmd, "", "1", "36525d", "BURST", "2"].iter().map(|s| s.to_string()).collect());
        }
        for cmd in ["RL.SLIDING", "RL.FIXED", "RL.SLIDINGLOG"] {
            for (period, cost) in [("36525d", &half), ("36525d", &max), ("1us", &max)] {
                calls.push([cmd, "", &max, period, "COST", cost].iter().map(|s| s.to_string()).collect());
            }
        }
        calls.push(
            ["CL.THROTTLE", "", &(MAX_COUNT - 1).to_string(), &max, "3155760000", &half]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        );
        for (i, mut a) in calls.into_iter().enumerate() {
            let key = format!("x:{ci}:{i}:{}", a[0]);
            a[1] = key.clone();
            let refs: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
            for _ in 0..2 {
                let r = c.c(&refs);
                if r.is_error() {
                    failures.push(format!("{a:?}: {r:?}"));
                }
            }
            // Keys that live long enough to be checked (a 1 µs period leaves a 1 ms TTL).
            let pttl = c.c(&["PTTL", &key]).int().unwrap();
            if pttl == -1 || pttl > 60_000 {
                keys.push(key);
            }
        }
    }
    for k in &keys {
        if let Err(e) = restores(&mut c, k) {
            failures.push(e);
        }
    }
    c.c(&["DEL", "__copy__"]);
    let before: Vec<Reply> = keys.iter().map(|k| c.c(&["DUMP", k])).collect();
    let reload = if failures.is_empty() { c.c(&["DEBUG", "RELOAD"]) } else { Reply::Status(b"skipped".to_vec()) };
    println!(
        "extreme parameters: {} keys, DUMP/RESTORE failures {}, DEBUG RELOAD {reload:?}",
        keys.len(),
        failures.len()
    );
    for f in &failures {
        eprintln!("FAILURE {f}");
    }
    assert!(
        failures.is_empty(),
        "{} states written by the module cannot be loaded back (first: {})",
        failures.len(),
        failures[0]
    );
    assert_eq!(reload, Reply::Status(b"OK".to_vec()), "DEBUG RELOAD:\n{}", server.log());
    let after: Vec<Reply> = keys.iter().map(|k| c.c(&["DUMP", k])).collect();
    assert_eq!(before, after, "DEBUG RELOAD changed states");
}

/// RL.SETSTATE validates each sliding-log commit on its own (units ≤ limit), but several
/// commits may add up to a log the decoder refuses: the key can then never be saved and
/// loaded again (RDB reload, DUMP/RESTORE, replica full sync).
#[test]
fn setstate_log_commits_keep_the_state_loadable() {
    let server = Server::start();
    let mut c = Resp::connect(server.port);
    use redis_ratelimit_core::sliding_log::Commit;
    use redis_ratelimit_core::spec::Update;
    use redis_ratelimit_core::Window;
    let win = Window::new(MAX_COUNT, Nanos::new(3_600 * NANOS_PER_SEC)).unwrap();
    let far = (now_ms() + 365 * 86_400_000).to_string();
    let mut replies = Vec::new();
    for i in 0..3 {
        let mut p = Vec::new();
        Update::Log(Commit { win, cutoff: 0, ts: T0_US + i, units: MAX_COUNT }).encode_into(&mut p);
        replies.push(c.cmd(&[b"RL.SETSTATE", b"log", &p, b"PXAT", far.as_bytes()]));
    }
    // Either a commit is refused, or the state stays loadable.
    let accepted = replies.iter().filter(|r| !r.is_error()).count();
    let restored = restores(&mut c, "log");
    println!("setstate log commits: replies {replies:?}, restore {restored:?}");
    assert!(
        accepted < 3 || restored.is_ok(),
        "3 RL.SETSTATE log commits of {MAX_COUNT} units each (limit {MAX_COUNT}) were accepted, and the key can no \
         longer be loaded: {}",
        restored.unwrap_err()
    );
    ok(&c.c(&["DEBUG", "RELOAD"]));
}

// ---------------------------------------------------------------------------------------------
// kill -9 under load, AOF on.

fn scan_keys(c: &mut Resp) -> Vec<String> {
    let mut cursor = "0".to_string();
    let mut keys = Vec::new();
    loop {
        let r = c.c(&["SCAN", &cursor, "COUNT", "1000"]);
        let a = r.array().unwrap();
        cursor = String::from_utf8(a[0].bulk().unwrap().to_vec()).unwrap();
        keys.extend(a[1].array().unwrap().iter().map(|k| String::from_utf8(k.bulk().unwrap().to_vec()).unwrap()));
        if cursor == "0" {
            return keys;
        }
    }
}

/// The command, arguments and algorithm name of the load traffic on key `k:<cmd>:<i>`.
fn load_args(cmd: &str) -> (Vec<&'static str>, &'static str) {
    match cmd {
        "RL.GCRA" => (vec!["1000", "1h", "BURST", "5000"], "gcra"),
        "RL.TOKENBUCKET" => (vec!["1000", "1h", "BURST", "5000"], "tokenbucket"),
        "RL.LEAKY" => (vec!["1000", "1h", "BURST", "5000"], "leaky"),
        "RL.SLIDING" => (vec!["5000", "1h"], "sliding"),
        "RL.FIXED" => (vec!["5000", "24h"], "fixed"),
        "RL.SLIDINGLOG" => (vec!["5000", "1h"], "slidinglog"),
        "CL.THROTTLE" => (vec!["4999", "1000", "3600"], "gcra"),
        _ => unreachable!(),
    }
}

#[test]
fn kill9_under_load_with_aof_everysec_loads_every_key() {
    let mut server = Server::start_with(Opts { appendonly: true, debug_clock: false, ..Opts::default() });
    let rounds = if long() { 5 } else { 1 };
    let seed = seed(0x4B11_1939);
    let cmds = ["RL.GCRA", "RL.TOKENBUCKET", "RL.LEAKY", "RL.SLIDING", "RL.FIXED", "RL.SLIDINGLOG", "CL.THROTTLE"];
    let mut total_ops = 0;
    let mut total_keys = 0;
    for round in 0..rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let (stop, ops, port) = (stop.clone(), ops.clone(), server.port);
                thread::spawn(move || {
                    let mut rng = Rng::new(seed ^ (round * 100 + t) as u64);
                    let mut c = Resp::connect(port);
                    while !stop.load(Ordering::Relaxed) {
                        let mut batch = Vec::new();
                        for _ in 0..50 {
                            let cmd = *rng.pick(&cmds);
                            let key = format!("k:{cmd}:{}", rng.below(40));
                            let (a, _) = load_args(cmd);
                            let mut argv: Vec<Vec<u8>> = vec![cmd.into(), key.into_bytes()];
                            argv.extend(a.iter().map(|s| s.as_bytes().to_vec()));
                            if cmd == "CL.THROTTLE" {
                                argv.push(rng.range(0, 3).to_string().into_bytes());
                            } else {
                                argv.extend(args!["COST", rng.range(0, 30).to_string()]);
                                if rng.chance(10) {
                                    argv.push(b"DRYRUN".to_vec());
                                }
                            }
                            if rng.chance(5) {
                                let i = rng.below(40);
                                argv = args![
                                    "RL.MULTI",
                                    "2",
                                    format!("m:{i}:a"),
                                    format!("m:{i}:b"),
                                    "GCRA",
                                    "1000",
                                    "1h",
                                    "SLIDINGLOG",
                                    "1000",
                                    "1h",
                                    "COST",
                                    "3"
                                ];
                            }
                            batch.push(argv);
                        }
                        match c.pipeline(&batch) {
                            Ok(replies) => {
                                for (a, r) in batch.iter().zip(&replies) {
                                    assert!(!r.is_error(), "{:?}: {r:?}", String::from_utf8_lossy(&a[0]));
                                }
                                ops.fetch_add(batch.len() as u64, Ordering::Relaxed);
                            }
                            Err(_) => return, // the server was killed
                        }
                    }
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(600));
        // An AOF rewrite in the middle of the load (base file with the RDB preamble, then
        // RL.SETSTATE in the incremental file).
        let mut c = Resp::connect(server.port);
        let rw = c.c(&["BGREWRITEAOF"]);
        assert!(!rw.is_error(), "{rw:?}");
        thread::sleep(Duration::from_millis(900));
        let sent = ops.load(Ordering::Relaxed);
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().expect("load thread");
        }
        let t = Instant::now();
        server.start_again();
        let restart = t.elapsed();
        let mut c = Resp::connect(server.port);
        let keys = scan_keys(&mut c);
        assert!(!keys.is_empty(), "no key survived");
        let mut checked = 0;
        let mut expired = 0;
        for k in &keys {
            let ty = c.c(&["TYPE", k]);
            if ty.bulk() == Some(&b"none"[..]) {
                expired += 1; // its TTL ran out since SCAN
                continue;
            }
            assert_eq!(ty.bulk(), Some(&b"ratelimit"[..]), "{k}: TYPE {ty:?}");
            let info = c.c(&["RL.INFO", k]);
            let algo = info.field("algorithm").unwrap_or_else(|| panic!("{k}: RL.INFO {info:?}"));
            let algo = algo.bulk().unwrap().to_vec();
            if let Some(cmd) = k.strip_prefix("k:").and_then(|r| r.split(':').next()) {
                let (a, name) = load_args(cmd);
                assert_eq!(algo, name.as_bytes(), "{k}: algorithm after reload");
                let mut argv: Vec<&str> = vec![cmd, k];
                argv.extend(a);
                let r = c.c(&argv);
                if cmd == "CL.THROTTLE" {
                    throttle_ints(&r).unwrap_or_else(|e| panic!("{k}: {e}"));
                } else {
                    limiter_ints(&r, cmd == "RL.LEAKY").unwrap_or_else(|e| panic!("{k}: {e}"));
                }
            } else {
                for cmd in ["RL.GCRA", "RL.SLIDINGLOG"] {
                    let r = c.c(&[cmd, k, "1000", "1h", "DRYRUN"]);
                    assert!(r.error_text().is_none_or(|e| e.starts_with("WRONGTYPE key holds")), "{k}: {r:?}");
                }
            }
            checked += 1;
        }
        // What was loaded from the AOF also survives an RDB round trip unchanged.
        let long_lived: Vec<&String> =
            keys.iter().filter(|k| c.c(&["PTTL", k]).int().is_some_and(|t| t > 10_000)).collect();
        let before: Vec<Reply> = long_lived.iter().map(|k| c.c(&["DUMP", k])).collect();
        ok(&c.c(&["DEBUG", "RELOAD"]));
        let after: Vec<Reply> = long_lived.iter().map(|k| c.c(&["DUMP", k])).collect();
        assert_eq!(before, after, "DEBUG RELOAD changed states loaded from the AOF");
        assert!(
            long_lived.len() * 2 > keys.len(),
            "most keys should live long: {} of {}",
            long_lived.len(),
            keys.len()
        );
        let log = server.log();
        assert!(!log.contains("Bad data format"), "{log}");
        assert!(!log.contains("panicked"), "{log}");
        println!(
            "kill -9 round {round}: ops sent {sent}, BGREWRITEAOF mid-load, faults injected: 1 (SIGKILL), restart {:.2} s, \
             keys loaded {} ({expired} expired since; all others answer RL.INFO and a limiter call), corrupt: 0",
            restart.as_secs_f64(),
            keys.len()
        );
        total_ops += sent;
        total_keys += checked;
    }
    println!("kill -9: rounds {rounds}, ops sent {total_ops}, keys checked {total_keys}, crashes: 0 (other than the injected ones)");
}

// ---------------------------------------------------------------------------------------------
// RDB files written by every encoding version.

fn fixture_dir(version: u32) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures").join(format!("rdb-v{version}"))
}

/// The clock the fixture's expectations were recorded at (µs).
const FIXTURE_CLOCK_US: i64 = 1_750_000_000_000_000;

/// The commands that build the fixture's keys, in order, each with the debug clock (µs) to run
/// it at. Every state lives for decades (TTLs are absolute in the RDB).
fn fixture_script() -> Vec<(i64, Vec<String>)> {
    let w = 36_525 * DAY_US; // one 100-year window
    let t = 1_700_000_000_000_000;
    let s = |a: &str| a.split(' ').map(String::from).collect::<Vec<_>>();
    let mut v = vec![
        (t, s("RL.GCRA fx:gcra 1 36525d BURST 1")),
        (t, s("RL.GCRA fx:gcra:max 1000000000000000 36525d COST 500000000000000")),
        (t, s("RL.TOKENBUCKET fx:tb 3 36525d")),
        (t + 1, s("RL.TOKENBUCKET fx:tb 3 36525d")),
        (t, s("RL.TOKENBUCKET fx:tb:max 1000000000000000 36525d COST 500000000000000")),
        (t, s("RL.LEAKY fx:leaky 2 36525d BURST 4")),
        (t + 5, s("RL.LEAKY fx:leaky 2 36525d BURST 4 COST 2")),
        (t, s("RL.SLIDING fx:sliding 100 36525d COST 7")),
        // A sliding counter with a previous window: window 0 ends in 2070.
        (w - DAY_US, s("RL.SLIDING fx:sliding:prev 100 36525d COST 40")),
        (w + DAY_US, s("RL.SLIDING fx:sliding:prev 100 36525d COST 9")),
        (t, s("RL.FIXED fx:fixed 10 36525d COST 3")),
        (t, s("RL.SLIDINGLOG fx:log 1000000000 36525d")),
        (t + 1, s("RL.SLIDINGLOG fx:log 1000000000 36525d COST 2")),
        (t + 1, s("RL.SLIDINGLOG fx:log 1000000000 36525d COST 3")),
        // Counts of 2047 and more live in the side FIFO ("big" entries).
        (t + 2, s("RL.SLIDINGLOG fx:log 1000000000 36525d COST 5000")),
        (t + 3, s("RL.SLIDINGLOG fx:log 1000000000 36525d COST 1")),
        (t + 4, s("RL.SLIDINGLOG fx:log 1000000000 36525d COST 999999999")),
        (t, s("CL.THROTTLE fx:cell 1 1 3155760000 1")),
        (t, s("RL.MULTI 2 fx:m:gcra fx:m:log GCRA 1 36525d BURST 2 SLIDINGLOG 5 36525d COST 2")),
    ];
    for i in 0..50 {
        v.push((t + 10 + i * 1000, s("RL.SLIDINGLOG fx:log:many 100 36525d")));
    }
    v
}

/// One DRYRUN (or peek) per key, answered from the loaded state at FIXTURE_CLOCK_US.
fn fixture_probes() -> Vec<Vec<String>> {
    let s = |a: &str| a.split(' ').map(String::from).collect::<Vec<_>>();
    vec![
        s("RL.GCRA fx:gcra 1 36525d BURST 1 DRYRUN"),
        s("RL.GCRA fx:gcra:max 1000000000000000 36525d DRYRUN COST 1000"),
        s("RL.TOKENBUCKET fx:tb 3 36525d DRYRUN"),
        s("RL.TOKENBUCKET fx:tb:max 1000000000000000 36525d DRYRUN COST 1000"),
        s("RL.LEAKY fx:leaky 2 36525d BURST 4 DRYRUN"),
        s("RL.SLIDING fx:sliding 100 36525d DRYRUN COST 5"),
        s("RL.SLIDING fx:sliding:prev 100 36525d DRYRUN"),
        s("RL.FIXED fx:fixed 10 36525d DRYRUN COST 2"),
        s("RL.SLIDINGLOG fx:log 1000000000 36525d DRYRUN COST 999990000"),
        s("RL.SLIDINGLOG fx:log:many 100 36525d DRYRUN COST 51"),
        s("CL.THROTTLE fx:cell 1 1 3155760000 0"),
        s("RL.GCRA fx:m:gcra 1 36525d BURST 2 DRYRUN"),
        s("RL.SLIDINGLOG fx:m:log 5 36525d DRYRUN"),
        s("RL.GCRA fx:persistent 7 1h DRYRUN"),
    ]
}

fn reply_text(r: &Reply) -> String {
    match r {
        Reply::Int(i) => i.to_string(),
        Reply::Bulk(Some(b)) | Reply::Status(b) => String::from_utf8_lossy(b).into_owned(),
        Reply::Array(Some(a)) => a.iter().map(reply_text).collect::<Vec<_>>().join(","),
        other => format!("{other:?}"),
    }
}

/// RL.INFO without ttl_ms (which moves with the real clock).
fn info_text(c: &mut Resp, key: &str) -> String {
    let p = c.c(&["RL.INFO", key]).pairs().unwrap_or_else(|| panic!("RL.INFO {key}"));
    p.iter().filter(|(k, _)| k != "ttl_ms").map(|(k, v)| format!("{k}={}", reply_text(v))).collect::<Vec<_>>().join(",")
}

/// Writes tests/fixtures/rdb-v1/{dump.rdb,expected.txt}. Run only to create a new version's
/// fixture; a committed one must never change (that is the point).
#[test]
#[ignore]
fn generate_rdb_fixtures() {
    let version = redis_ratelimit_core::codec::ENCODING_VERSION as u32;
    let server = Server::start();
    let mut c = Resp::connect(server.port);
    for (at, argv) in fixture_script() {
        c.clock_set(at);
        let refs: Vec<&str> = argv.iter().map(|s| s.as_str()).collect();
        let r = c.c(&refs);
        assert!(!r.is_error(), "{argv:?}: {r:?}");
    }
    // A key without a TTL, as RL.SETSTATE without PXAT leaves it.
    c.clock_set(1_700_000_000_000_000);
    let (_, u) = spec_of("RL.GCRA", 7, 3_600 * NANOS_PER_SEC, None)
        .check(None, Nanos::new(1_700_000_000_000_000 * NANOS_PER_MICRO), Request::new(3))
        .unwrap();
    let mut p = Vec::new();
    u.unwrap().encode_into(&mut p);
    ok(&c.cmd(&[b"RL.SETSTATE", b"fx:persistent", &p]));
    c.clock_set(FIXTURE_CLOCK_US);
    let mut keys = scan_keys(&mut c);
    keys.sort();
    let mut out = format!(
        "# RDB fixture of encoding version {version}, written by redis-server {} (generate_rdb_fixtures).\n\
         # Lines: clock_us <µs> | key <name> | dump <hex> | pexpiretime <ms> | info <RL.INFO without ttl_ms> | probe <args> => <reply>\n\
         clock_us {FIXTURE_CLOCK_US}\n",
        server.info("server").lines().find_map(|l| l.strip_prefix("redis_version:")).unwrap_or("?").trim()
    );
    for k in &keys {
        let d = c.c(&["DUMP", k]);
        let e = c.c(&["PEXPIRETIME", k]).int().unwrap();
        assert!(e == -1 || e > now_ms() + 40 * 365 * 86_400_000, "{k}: expires too soon ({e})");
        out += &format!("key {k}\ndump {}\npexpiretime {e}\ninfo {}\n", hex(d.bulk().unwrap()), info_text(&mut c, k));
    }
    for probe in fixture_probes() {
        let refs: Vec<&str> = probe.iter().map(|s| s.as_str()).collect();
        let r = c.c(&refs);
        assert!(!r.is_error(), "{probe:?}: {r:?}");
        out += &format!("probe {} => {}\n", probe.join(" "), reply_text(&r));
    }
    ok(&c.c(&["SAVE"]));
    let dir = fixture_dir(version);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(server.dir.join("dump.rdb"), dir.join("dump.rdb")).unwrap();
    std::fs::write(dir.join("expected.txt"), out).unwrap();
    println!("wrote {} ({} keys)", dir.display(), keys.len());
}

#[test]
fn rdb_fixtures_of_every_encoding_version_load() {
    let mut versions = 0;
    for version in 1..=redis_ratelimit_core::codec::ENCODING_VERSION as u32 {
        let dir = fixture_dir(version);
        let expected = std::fs::read_to_string(dir.join("expected.txt"))
            .unwrap_or_else(|e| panic!("{}: {e}: every encoding version needs its fixture", dir.display()));
        // dbfilename is a protected config in Redis 7: CONFIG SET needs this.
        let server = Server::start_with(Opts {
            extra: vec![("enable-protected-configs".into(), "yes".into())],
            ..Opts::default()
        });
        std::fs::copy(dir.join("dump.rdb"), server.dir.join("fixture.rdb")).unwrap();
        let mut c = Resp::connect(server.port);
        ok(&c.c(&["CONFIG", "SET", "dbfilename", "fixture.rdb"]));
        let r = c.c(&["DEBUG", "RELOAD", "NOSAVE"]);
        assert_eq!(r, Reply::Status(b"OK".to_vec()), "v{version}: loading the fixture failed\n{}", server.log());
        let mut clock = 0;
        let mut key = String::new();
        let mut keys = 0;
        for line in expected.lines().filter(|l| !l.starts_with('#')) {
            let (kind, rest) = line.split_once(' ').unwrap();
            match kind {
                "clock_us" => {
                    clock = rest.parse().unwrap();
                    c.clock_set(clock);
                }
                "key" => {
                    key = rest.to_string();
                    keys += 1;
                    assert_eq!(c.c(&["TYPE", &key]).bulk(), Some(&b"ratelimit"[..]), "v{version}: {key} did not load");
                }
                "dump" => {
                    let d = c.c(&["DUMP", &key]);
                    let want = unhex(rest);
                    let got = d.bulk().unwrap_or_else(|| panic!("v{version}: {key}: no DUMP"));
                    // The module's payload is byte-identical; so is the whole DUMP when this Redis
                    // writes the same RDB version (the 2 bytes before the CRC).
                    assert_eq!(
                        dump_body(got),
                        dump_body(&want),
                        "v{version}: {key}: state differs from the recorded one"
                    );
                    if got.len() >= 10
                        && want.len() >= 10
                        && got[got.len() - 10..got.len() - 8] == want[want.len() - 10..want.len() - 8]
                    {
                        assert_eq!(got, &want[..], "v{version}: {key}: DUMP");
                    }
                }
                "pexpiretime" => {
                    assert_eq!(
                        c.c(&["PEXPIRETIME", &key]).int(),
                        Some(rest.parse().unwrap()),
                        "v{version}: {key}: absolute expiry"
                    );
                }
                "info" => assert_eq!(info_text(&mut c, &key), rest, "v{version}: {key}: RL.INFO at {clock}"),
                "probe" => {
                    let (args, want) = rest.split_once(" => ").unwrap();
                    let argv: Vec<&str> = args.split(' ').collect();
                    assert_eq!(reply_text(&c.c(&argv)), want, "v{version}: {args}");
                }
                other => panic!("unknown line kind {other}"),
            }
        }
        assert_eq!(c.c(&["DBSIZE"]).int(), Some(keys), "v{version}: key count");
        // Loaded states are live: an admitted call, and a save + load round trip.
        let r = c.c(&["RL.SLIDINGLOG", "fx:log", "1000000000", "36525d"]);
        assert_eq!(limiter_reply(&r, false).unwrap().allowed, 1);
        ok(&c.c(&["CONFIG", "SET", "dbfilename", "dump.rdb"]));
        ok(&c.c(&["DEBUG", "RELOAD"]));
        assert_eq!(c.c(&["DBSIZE"]).int(), Some(keys));
        assert!(!server.log().contains("Bad data format"));
        println!("rdb fixture v{version}: {keys} keys loaded, DUMP / PEXPIRETIME / RL.INFO / probes as recorded");
        versions += 1;
    }
    assert!(versions >= 1);
}
