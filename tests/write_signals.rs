//! A call that writes nothing must not look like a write (issue 10): it must not abort another
//! client's WATCH/EXEC, send CLIENT TRACKING invalidations, fire keyspace notifications other
//! than the documented `rl.limited`, or change the key in any way (DUMP, expiry, a redis-cell
//! string's encoding). Every call that writes must do all of the first two (positive controls).

mod common;

use common::resp::{Reply, Resp};
use common::Server;
use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::spec::Update;
use redis_ratelimit_core::{gcra, Nanos, Rate, NANOS_PER_SEC};

/// One path: commands that prepare the key, then the call under test. `{k}` stands for the key
/// (`{k2}` for a second one, `{state}` for a RL.SETSTATE payload).
struct Case {
    name: &'static str,
    setup: &'static [&'static str],
    call: &'static str,
    writes: bool,
}

const NOW_US: &str = "1700000000000000";

/// A redis-cell key: its arrival time in ns as an integer string (int-encoded by Redis), with
/// the TTL redis-cell gives it (ending then). 30 s ahead: nearly everything is available.
const CELL_SET: &str = "SET {k} 1700000030000000000 PX 30000";
/// A redis-cell arrival time far ahead: every call is limited.
const CELL_SET_FULL: &str = "SET {k} 1700000500000000000 PX 500000";

const CASES: &[Case] = &[
    // ---- calls that write nothing ----
    Case { name: "GCRA DRYRUN", setup: &["RL.GCRA {k} 10 1h"], call: "RL.GCRA {k} 10 1h DRYRUN", writes: false },
    Case { name: "GCRA COST 0", setup: &["RL.GCRA {k} 10 1h"], call: "RL.GCRA {k} 10 1h COST 0", writes: false },
    Case { name: "GCRA limited", setup: &["RL.GCRA {k} 1 1h"], call: "RL.GCRA {k} 1 1h", writes: false },
    Case {
        name: "TOKENBUCKET DRYRUN",
        setup: &["RL.TOKENBUCKET {k} 10 1h"],
        call: "RL.TOKENBUCKET {k} 10 1h DRYRUN",
        writes: false,
    },
    Case {
        name: "TOKENBUCKET COST 0",
        setup: &["RL.TOKENBUCKET {k} 10 1h"],
        call: "RL.TOKENBUCKET {k} 10 1h COST 0",
        writes: false,
    },
    Case {
        name: "TOKENBUCKET limited",
        setup: &["RL.TOKENBUCKET {k} 1 1h"],
        call: "RL.TOKENBUCKET {k} 1 1h",
        writes: false,
    },
    Case { name: "LEAKY DRYRUN", setup: &["RL.LEAKY {k} 10 1h"], call: "RL.LEAKY {k} 10 1h DRYRUN", writes: false },
    Case { name: "LEAKY COST 0", setup: &["RL.LEAKY {k} 10 1h"], call: "RL.LEAKY {k} 10 1h COST 0", writes: false },
    Case { name: "LEAKY limited", setup: &["RL.LEAKY {k} 1 1h"], call: "RL.LEAKY {k} 1 1h", writes: false },
    Case {
        name: "SLIDING DRYRUN",
        setup: &["RL.SLIDING {k} 10 1h"],
        call: "RL.SLIDING {k} 10 1h DRYRUN",
        writes: false,
    },
    Case {
        name: "SLIDING COST 0",
        setup: &["RL.SLIDING {k} 10 1h"],
        call: "RL.SLIDING {k} 10 1h COST 0",
        writes: false,
    },
    Case { name: "SLIDING limited", setup: &["RL.SLIDING {k} 1 1h"], call: "RL.SLIDING {k} 1 1h", writes: false },
    Case { name: "FIXED DRYRUN", setup: &["RL.FIXED {k} 10 1h"], call: "RL.FIXED {k} 10 1h DRYRUN", writes: false },
    Case { name: "FIXED COST 0", setup: &["RL.FIXED {k} 10 1h"], call: "RL.FIXED {k} 10 1h COST 0", writes: false },
    Case { name: "FIXED limited", setup: &["RL.FIXED {k} 1 1h"], call: "RL.FIXED {k} 1 1h", writes: false },
    Case {
        name: "SLIDINGLOG DRYRUN",
        setup: &["RL.SLIDINGLOG {k} 10 1h"],
        call: "RL.SLIDINGLOG {k} 10 1h DRYRUN",
        writes: false,
    },
    Case {
        name: "SLIDINGLOG COST 0",
        setup: &["RL.SLIDINGLOG {k} 10 1h"],
        call: "RL.SLIDINGLOG {k} 10 1h COST 0",
        writes: false,
    },
    Case {
        name: "SLIDINGLOG limited",
        setup: &["RL.SLIDINGLOG {k} 1 1h"],
        call: "RL.SLIDINGLOG {k} 1 1h",
        writes: false,
    },
    Case { name: "DRYRUN on a missing key", setup: &[], call: "RL.GCRA {k} 10 1h DRYRUN", writes: false },
    Case { name: "RL.RESET of a missing key", setup: &[], call: "RL.RESET {k}", writes: false },
    Case { name: "RL.INFO", setup: &["RL.GCRA {k} 10 1h"], call: "RL.INFO {k}", writes: false },
    Case {
        name: "RL.MULTI DRYRUN",
        setup: &["RL.GCRA {k} 10 1h"],
        call: "RL.MULTI 2 {k} {k2} GCRA 10 1h SLIDINGLOG 5 1h DRYRUN",
        writes: false,
    },
    Case {
        name: "RL.MULTI COST 0",
        setup: &["RL.GCRA {k} 10 1h"],
        call: "RL.MULTI 2 {k} {k2} GCRA 10 1h FIXED 5 1h COST 0",
        writes: false,
    },
    Case {
        name: "RL.MULTI limited",
        setup: &["RL.GCRA {k} 1 1h"],
        call: "RL.MULTI 2 {k} {k2} GCRA 1 1h FIXED 5 1h",
        writes: false,
    },
    Case {
        name: "CL.THROTTLE peek",
        setup: &["CL.THROTTLE {k} 5 10 3600"],
        call: "CL.THROTTLE {k} 5 10 3600 0",
        writes: false,
    },
    Case {
        name: "CL.THROTTLE limited",
        setup: &["CL.THROTTLE {k} 0 1 3600"],
        call: "CL.THROTTLE {k} 0 1 3600",
        writes: false,
    },
    Case {
        name: "CL.THROTTLE peek on a redis-cell key",
        setup: &[CELL_SET],
        call: "CL.THROTTLE {k} 5 10 3600 0",
        writes: false,
    },
    Case {
        name: "CL.THROTTLE limited on a redis-cell key",
        setup: &[CELL_SET_FULL],
        call: "CL.THROTTLE {k} 0 1 60",
        writes: false,
    },
    Case {
        name: "RL.GCRA DRYRUN on a redis-cell key",
        setup: &[CELL_SET],
        call: "RL.GCRA {k} 10 1h DRYRUN",
        writes: false,
    },
    Case {
        name: "RL.GCRA limited on a redis-cell key",
        setup: &[CELL_SET_FULL],
        call: "RL.GCRA {k} 1 1m",
        writes: false,
    },
    Case { name: "RL.INFO of a redis-cell key", setup: &[CELL_SET], call: "RL.INFO {k}", writes: false },
    Case { name: "WRONGTYPE on a list", setup: &["RPUSH {k} a"], call: "RL.GCRA {k} 10 1h", writes: false },
    Case { name: "WRONGTYPE on a string", setup: &["SET {k} hello"], call: "CL.THROTTLE {k} 5 10 60", writes: false },
    Case { name: "algorithm mismatch", setup: &["RL.FIXED {k} 10 1h"], call: "RL.GCRA {k} 10 1h", writes: false },
    Case { name: "argument error", setup: &["RL.GCRA {k} 10 1h"], call: "RL.GCRA {k} 0 1h", writes: false },
    Case {
        name: "RL.RETURN all refilled meanwhile",
        setup: &["RL.GCRA {k} 10 1h"],
        call: "RL.RETURN {k} 1 AGE 3600000",
        writes: false,
    },
    Case {
        name: "RL.RETURN into a passed window",
        setup: &["RL.FIXED {k} 10 1h"],
        call: "RL.RETURN {k} 1 AGE 3600000",
        writes: false,
    },
    Case {
        name: "RL.RETURN refused (sliding log)",
        setup: &["RL.SLIDINGLOG {k} 10 1h"],
        call: "RL.RETURN {k} 1",
        writes: false,
    },
    Case { name: "RL.RETURN of a missing key", setup: &[], call: "RL.RETURN {k} 1", writes: false },
    Case { name: "RL.RETURN on a redis-cell key", setup: &[CELL_SET], call: "RL.RETURN {k} 1", writes: false },
    // ---- calls that write ----
    Case { name: "GCRA admitted", setup: &["RL.GCRA {k} 10 1h"], call: "RL.GCRA {k} 10 1h", writes: true },
    Case {
        name: "SLIDINGLOG admitted",
        setup: &["RL.SLIDINGLOG {k} 10 1h"],
        call: "RL.SLIDINGLOG {k} 10 1h",
        writes: true,
    },
    Case { name: "admitted on a missing key", setup: &[], call: "RL.FIXED {k} 10 1h", writes: true },
    Case { name: "RL.RESET of a key", setup: &["RL.GCRA {k} 10 1h"], call: "RL.RESET {k}", writes: true },
    Case {
        name: "RL.RETURN credited",
        setup: &["RL.FIXED {k} 10 1h COST 3"],
        call: "RL.RETURN {k} 1 AGE 0",
        writes: true,
    },
    Case { name: "RL.RESET of a redis-cell key", setup: &[CELL_SET], call: "RL.RESET {k}", writes: true },
    Case {
        name: "RL.MULTI admitted",
        setup: &["RL.GCRA {k} 10 1h"],
        call: "RL.MULTI 2 {k} {k2} GCRA 10 1h FIXED 5 1h",
        writes: true,
    },
    Case {
        name: "CL.THROTTLE admitted",
        setup: &["CL.THROTTLE {k} 5 10 3600"],
        call: "CL.THROTTLE {k} 5 10 3600",
        writes: true,
    },
    Case {
        name: "CL.THROTTLE takes over a redis-cell key",
        setup: &[CELL_SET],
        call: "CL.THROTTLE {k} 5 10 3600",
        writes: true,
    },
    Case { name: "RL.GCRA takes over a redis-cell key", setup: &[CELL_SET], call: "RL.GCRA {k} 10 1h", writes: true },
    Case { name: "RL.SETSTATE", setup: &["RL.GCRA {k} 10 1h"], call: "RL.SETSTATE {k} {state}", writes: true },
    Case {
        name: "limited with new parameters (converted state kept)",
        setup: &["RL.GCRA {k} 2 1h", "RL.GCRA {k} 2 1h"],
        call: "RL.GCRA {k} 1 1h",
        writes: true,
    },
];

fn words(cmd: &str, k: &str, k2: &str, state_of_k2: &[u8]) -> Vec<Vec<u8>> {
    cmd.split(' ')
        .map(|w| match w {
            "{k}" => k.as_bytes().to_vec(),
            "{k2}" => k2.as_bytes().to_vec(),
            "{state}" => state_of_k2.to_vec(),
            _ => w.as_bytes().to_vec(),
        })
        .collect()
}

fn run(c: &mut Resp, args: &[Vec<u8>]) -> Reply {
    let v: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    c.cmd(&v)
}

/// Replies and pushes read up to the PONG of a PING (RESP3 pushes arrive before it).
fn pushes_until_pong(c: &mut Resp) -> Vec<Reply> {
    c.send_raw(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut out = Vec::new();
    loop {
        match c.read().unwrap() {
            Reply::Status(s) if s == b"PONG" => return out,
            other => out.push(other),
        }
    }
}

fn mentions(r: &Reply, key: &[u8]) -> bool {
    match r {
        Reply::Bulk(Some(b)) | Reply::Status(b) => b == key,
        Reply::Array(Some(a)) => a.iter().any(|x| mentions(x, key)),
        _ => false,
    }
}

/// What a call may not change when it writes nothing.
fn fingerprint(c: &mut Resp, key: &str) -> Vec<Reply> {
    ["DUMP", "PEXPIRETIME", "TYPE", "OBJECT ENCODING"]
        .iter()
        .map(|cmd| {
            let mut a: Vec<&str> = cmd.split(' ').collect();
            a.push(key);
            c.c(&a)
        })
        .collect()
}

#[test]
fn only_writes_signal_watch_and_tracking() {
    // (REDIS_CELL_KEYS: the RL.* commands read keys redis-cell left, as CL.THROTTLE does.)
    let s = Server::start_with(common::redis_cell_keys());
    let mut cmd = Resp::connect(s.port);
    let mut watcher = Resp::connect(s.port);
    let mut tracker = Resp::connect(s.port);
    assert!(matches!(tracker.c(&["HELLO", "3"]), Reply::Map(_)));
    // BCAST: every modified key is reported, whoever reads it.
    assert_eq!(tracker.c(&["CLIENT", "TRACKING", "ON", "BCAST"]), Reply::Status(b"OK".to_vec()));
    assert_eq!(cmd.c(&["RL.DEBUG", "CLOCK", "SET", NOW_US]), Reply::Status(b"OK".to_vec()));
    let mut failures = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let (k, k2) = (format!("w{i}"), format!("w{i}b"));
        for line in case.setup {
            let r = run(&mut cmd, &words(line, &k, &k2, b""));
            assert!(!r.is_error(), "{}: setup {line}: {r:?}", case.name);
        }
        let payload = if case.call.contains("{state}") { state_payload() } else { Vec::new() };
        let call = words(case.call, &k, &k2, &payload);
        let before = fingerprint(&mut cmd, &k);
        pushes_until_pong(&mut tracker); // setup's own invalidations
        assert_eq!(watcher.c(&["WATCH", &k]), Reply::Status(b"OK".to_vec()));
        let reply = run(&mut cmd, &call);
        let after = fingerprint(&mut cmd, &k);
        let invalidated = pushes_until_pong(&mut tracker).iter().any(|p| mentions(p, k.as_bytes()));
        assert_eq!(watcher.c(&["MULTI"]), Reply::Status(b"OK".to_vec()));
        assert_eq!(watcher.c(&["PING"]), Reply::Status(b"QUEUED".to_vec()));
        let exec = watcher.c(&["EXEC"]);
        let aborted = exec.is_nil();
        println!("{}: reply {reply:?}, EXEC aborted {aborted}, invalidated {invalidated}", case.name);
        if aborted != case.writes || invalidated != case.writes {
            failures.push(format!(
                "{}: writes {} but EXEC aborted {aborted}, tracking invalidated {invalidated} (reply {reply:?})",
                case.name, case.writes
            ));
        }
        if !case.writes && before != after {
            failures.push(format!("{}: the key changed: {before:?} → {after:?}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} paths signal wrongly:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

/// A valid RL.SETSTATE payload: a whole GCRA state, encoded by the module's own codec.
fn state_payload() -> Vec<u8> {
    let rate = Rate::new(10, Nanos::new(3_600 * NANOS_PER_SEC), 10).unwrap();
    let state = State::Gcra(gcra::State { rate, tat: 1_700_000_360 * NANOS_PER_SEC as i128 * 10 });
    let mut out = Vec::new();
    Update::Replace(state).encode_into(&mut out);
    out
}

#[test]
fn a_redis_cell_string_keeps_its_encoding_when_nothing_is_written() {
    // (REDIS_CELL_KEYS: the RL.* commands read keys redis-cell left, as CL.THROTTLE does.)
    let s = Server::start_with(common::redis_cell_keys());
    let mut c = Resp::connect(s.port);
    c.c(&["RL.DEBUG", "CLOCK", "SET", NOW_US]);
    for (setup, call) in [
        (CELL_SET, "CL.THROTTLE cell 5 10 3600 0"),
        (CELL_SET_FULL, "CL.THROTTLE cell 0 1 60"),
        (CELL_SET, "RL.GCRA cell 10 1h DRYRUN"),
        (CELL_SET, "RL.INFO cell"),
        (CELL_SET_FULL, "RL.MULTI 1 cell GCRA 1 1m"),
    ] {
        run(&mut c, &words(setup, "cell", "", b""));
        assert_eq!(c.c(&["OBJECT", "ENCODING", "cell"]), Reply::Bulk(Some(b"int".to_vec())));
        let r = run(&mut c, &words(call, "cell", "", b""));
        assert!(!r.is_error(), "{call}: {r:?}");
        assert_eq!(c.c(&["OBJECT", "ENCODING", "cell"]), Reply::Bulk(Some(b"int".to_vec())), "after {call}");
        assert_eq!(c.c(&["TYPE", "cell"]), Reply::Status(b"string".to_vec()), "after {call}");
    }
}

/// Keyspace notifications: a call that writes nothing fires none, except `rl.limited` on a
/// limited call (documented, module event class `d`).
#[test]
fn non_writes_fire_no_keyspace_events_but_rl_limited() {
    // (REDIS_CELL_KEYS: the RL.* commands read keys redis-cell left, as CL.THROTTLE does.)
    let s = Server::start_with(common::redis_cell_keys());
    let mut c = Resp::connect(s.port);
    c.c(&["RL.DEBUG", "CLOCK", "SET", NOW_US]);
    assert_eq!(c.c(&["CONFIG", "SET", "notify-keyspace-events", "KEA"]), Reply::Status(b"OK".to_vec()));
    let mut sub = Resp::connect(s.port);
    assert!(sub.c(&["PSUBSCRIBE", "__keyspace@0__:*"]).array().is_some());
    let mut expected_limited = 0;
    for (i, case) in CASES.iter().filter(|c| !c.writes).enumerate() {
        let (k, k2) = (format!("n{i}"), format!("n{i}b"));
        for line in case.setup {
            run(&mut c, &words(line, &k, &k2, b""));
        }
        // Mark the end of the setup's own events.
        c.c(&["SET", "mark", &k]);
        let r = run(&mut c, &words(case.call, &k, &k2, b""));
        c.c(&["SET", "mark", "end"]);
        let limited = case.name.contains("limited");
        expected_limited += limited as usize;
        // Read events up to the setup's mark, then everything up to the end mark.
        while !event_is(&sub.read().unwrap(), "mark", "set") {}
        let mut events = Vec::new();
        loop {
            let e = sub.read().unwrap();
            if event_is(&e, "mark", "set") {
                break;
            }
            events.push(e);
        }
        let names: Vec<String> = events.iter().map(event_name).collect();
        let want: Vec<String> = if limited { vec![format!("{k}:rl.limited")] } else { vec![] };
        let want_multi: Vec<String> =
            if limited { vec![format!("{k}:rl.limited"), format!("{k2}:rl.limited")] } else { vec![] };
        assert!(names == want || names == want_multi, "{}: events {names:?} (reply {r:?})", case.name);
    }
    assert!(expected_limited > 0);
}

fn event_is(e: &Reply, key: &str, event: &str) -> bool {
    event_name(e) == format!("{key}:{event}")
}

/// "key:event" of a pmessage.
fn event_name(e: &Reply) -> String {
    let a = e.array().unwrap_or(&[]);
    match (a.get(2).and_then(|c| c.bulk()), a.get(3).and_then(|p| p.bulk())) {
        (Some(channel), Some(payload)) => {
            let channel = String::from_utf8_lossy(channel);
            format!("{}:{}", channel.trim_start_matches("__keyspace@0__:"), String::from_utf8_lossy(payload))
        }
        _ => format!("{e:?}"),
    }
}
