//! Every state the module writes loads again, against real redis-servers (issue 17.1): the
//! reproduction from the issue (a sliding counter set over its limit, then checked under another
//! window) through DUMP/RESTORE, DEBUG RELOAD, a replica and an AOF restart; forged RL.SETSTATE
//! payloads brought into range as the core's decoder brings them. And RL.RETURN on a leaky bucket
//! (issue 17.4): refused, so no request is handed a slot another already holds; nor by a lowered
//! BURST, which keeps the queue's drain instant.

mod common;

use common::{
    clock_set, err_text, limiter, payload, pexpiretime, rl_info_int, unhex, wait_replica_synced, Opts, Server,
};
use redis::{Connection, Value};
use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::{fixed, gcra, sliding, token_bucket, Nanos, Rate, Window, MAX_COUNT, NANOS_PER_SEC};

/// The instant: 1800000000 s, a multiple of 2 h.
const T_US: i64 = 1_800_000_000_000_000;
/// RL.SETSTATE accepted this: a sliding counter, limit 10^15 per 1 h, at the window of T_US,
/// previous = current = 2·10^15.
const OVERFULL_SLIDING: &str = "01030080c6a47e8d030000a0b8304603000020a107000000000000008d49fd1a070000008d49fd1a0700";

fn setstate(c: &mut Connection, key: &str, payload: &[u8]) {
    let r: redis::RedisResult<String> = redis::cmd("RL.SETSTATE").arg(key).arg(payload).query(c);
    assert_eq!(r.map_err(|e| err_text(&e)).as_deref(), Ok("OK"), "RL.SETSTATE {key}");
}

fn restore(c: &mut Connection, key: &str, payload: &[u8]) -> Result<String, String> {
    redis::cmd("RESTORE").arg(key).arg(0).arg(payload).arg("REPLACE").query(c).map_err(|e| err_text(&e))
}

#[test]
fn an_overfull_sliding_counter_under_another_window_stays_loadable() {
    let mut primary = Server::start_with(Opts { appendonly: true, ..Default::default() });
    let replica = Server::start_with(Opts { replica_of: Some(primary.port), ..Default::default() });
    wait_replica_synced(&primary, &replica);
    let mut p = primary.conn();
    clock_set(&mut p, T_US);
    setstate(&mut p, "k", &unhex(OVERFULL_SLIDING));
    // Another window: the estimate (prev + curr = 4·10^15) is carried at most at 2·10^15.
    let r = limiter(&mut p, &["RL.SLIDING", "k", "1000000000000000", "2h"]);
    assert_eq!((r.allowed, r.limit, r.remaining, r.reset_after_ms), (0, MAX_COUNT as i64, 0, 14_400_000), "{r:?}");
    assert!(r.retry_after_ms > 0, "{r:?}");
    // DUMP / RESTORE: the same state (it used to be `ERR Bad data format`).
    let d = payload(&mut p, "k");
    assert_eq!(restore(&mut p, "k2", &d).as_deref(), Ok("OK"), "RESTORE of the key's DUMP");
    assert_eq!(payload(&mut p, "k2"), d);
    assert_eq!(rl_info_int(&mut p, "k", "current"), 2 * MAX_COUNT as i64);
    assert_eq!(rl_info_int(&mut p, "k", "window_us"), 7_200_000_000);
    // The replica took the replicated state (a refused RL.SETSTATE logs a CRITICAL line and
    // leaves the replica without the change).
    wait_replica_synced(&primary, &replica);
    let mut r = replica.conn();
    assert_eq!(payload(&mut r, "k"), d, "the replica holds another state");
    assert_eq!(payload(&mut r, "k2"), d);
    assert!(!replica.log().contains("CRITICAL"), "replica log:\n{}", replica.log());
    // DEBUG RELOAD (RDB save and load) keeps both keys.
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut p).unwrap();
    assert_eq!(payload(&mut p, "k"), d, "DEBUG RELOAD");
    assert_eq!(payload(&mut p, "k2"), d);
    // An AOF replay: a restart loads the AOF.
    primary.restart();
    let mut p = primary.conn();
    assert_eq!(payload(&mut p, "k"), d, "after the AOF replay");
    assert_eq!(payload(&mut p, "k2"), d);
}

#[test]
fn setstate_brings_forged_values_into_range_as_loading_does() {
    let primary = Server::start();
    let replica = Server::start_with(Opts { replica_of: Some(primary.port), ..Default::default() });
    wait_replica_synced(&primary, &replica);
    let mut p = primary.conn();
    clock_set(&mut p, T_US);
    let rate = Rate::new(10, Nanos::new(60 * NANOS_PER_SEC), 10).unwrap();
    let win = Window::new(10, Nanos::new(60 * NANOS_PER_SEC)).unwrap();
    let forged = [
        ("gcra", State::Gcra(gcra::State { rate, tat: 1 << 115 })),
        ("tb", State::TokenBucket(token_bucket::State { rate, tokens: -(1 << 100), last: Nanos::new(T_US * 1_000) })),
        ("fixed", State::Fixed(fixed::State { win, index: i64::MAX, count: 2 * MAX_COUNT })),
        ("sliding", State::Sliding(sliding::State { win, index: i64::MIN, prev: 2 * MAX_COUNT, curr: 1 })),
    ];
    for (key, s) in &forged {
        let encoded = s.encode();
        let loaded = State::decode(&encoded).expect("the decoder accepts it");
        assert_ne!(loaded.encode(), encoded, "{key}: the forged value is out of range");
        setstate(&mut p, key, &encoded);
        // The key holds what the decoder made of the payload: the same DUMP as setting the
        // in-range state itself.
        let twin = format!("{key}:in-range");
        setstate(&mut p, &twin, &loaded.encode());
        let d = payload(&mut p, key);
        assert_eq!(d, payload(&mut p, &twin), "{key}");
        assert_eq!(restore(&mut p, &format!("{key}:restored"), &d).as_deref(), Ok("OK"), "{key}");
        // Calls on it write loadable states.
        let algo = match s {
            State::Gcra(_) => "RL.GCRA",
            State::TokenBucket(_) => "RL.TOKENBUCKET",
            State::Fixed(_) => "RL.FIXED",
            _ => "RL.SLIDING",
        };
        for args in [["10", "60s"], ["1000000000000000", "2h"]] {
            let mut cmd = redis::cmd(algo);
            cmd.arg(*key).arg(args[0]).arg(args[1]);
            let _: Value = cmd.query(&mut p).unwrap();
            let d = payload(&mut p, key);
            assert_eq!(restore(&mut p, &format!("{key}:after"), &d).as_deref(), Ok("OK"), "{key} after {algo}");
        }
    }
    wait_replica_synced(&primary, &replica);
    let mut r = replica.conn();
    for (key, _) in &forged {
        assert_eq!(payload(&mut r, key), payload(&mut p, key), "replica: {key}");
    }
    assert!(!replica.log().contains("CRITICAL"), "replica log:\n{}", replica.log());
    // The reproduction's sliding counter is in range already: its DUMP is the payload's state.
    setstate(&mut p, "repro", &unhex(OVERFULL_SLIDING));
    assert_eq!(rl_info_int(&mut p, "repro", "previous"), 2 * MAX_COUNT as i64);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut p).unwrap();
    for (key, _) in &forged {
        payload(&mut p, key);
    }
}

#[test]
fn leaky_return_is_refused_and_no_slot_is_given_twice() {
    let s = Server::start();
    let mut c = s.conn();
    clock_set(&mut c, T_US);
    let delay =
        |c: &mut Connection| limiter(c, &["RL.LEAKY", "q", "1", "1s", "BURST", "10"]).delay_ms.expect("delay_ms");
    assert_eq!([delay(&mut c), delay(&mut c), delay(&mut c)], [0, 1000, 2000]);
    let before = payload(&mut c, "q");
    let r: redis::RedisResult<i64> = redis::cmd("RL.RETURN").arg("q").arg(1).arg("AGE").arg(0).query(&mut c);
    assert_eq!(
        r.map_err(|e| err_text(&e)),
        Err("ERR RL.RETURN does not support the leaky bucket: every queue slot is promised to an admitted request"
            .to_string())
    );
    assert_eq!(payload(&mut c, "q"), before, "a refused return writes nothing");
    // The next request queues after C (it used to get C's slot: delay 2000 twice).
    assert_eq!(delay(&mut c), 3000);
}

/// RL.LEAKY keeps its queue's promises through a change of parameters (issue 17.4, the same bug
/// through another door): 50 requests queued at 1/s with BURST 100 (delays 0–49 s), then BURST
/// 10. The call at BURST 10 used to be admitted with delay 0, in the slot of the first request.
#[test]
fn leaky_lowered_burst_keeps_the_promised_slots() {
    let s = Server::start();
    let mut c = s.conn();
    clock_set(&mut c, T_US);
    let deep = ["RL.LEAKY", "q", "1", "1s", "BURST", "100"];
    let shallow = ["RL.LEAKY", "q", "1", "1s", "BURST", "10"];
    for k in 0..50 {
        assert_eq!(limiter(&mut c, &deep).delay_ms, Some(k * 1000), "request {k}");
    }
    let before = payload(&mut c, "q");
    let expiry = pexpiretime(&mut c, "q");
    // 50 s of queue, of which 9 s fit at BURST 10: limited until it has drained for 41 s.
    assert_eq!(limiter(&mut c, &shallow), [0, 10, 0, 41_000, 50_000, -1]);
    assert_eq!(payload(&mut c, "q"), before, "a limited call writes nothing");
    assert_eq!(pexpiretime(&mut c, "q"), expiry, "nor touches the expiry");
    clock_set(&mut c, T_US + 41_000_000 - 1_000);
    assert_eq!(limiter(&mut c, &shallow), [0, 10, 0, 1, 9_001, -1], "1 ms before retry_after");
    // At retry_after: the old drain slot (+50 s), then the queue is 10 deep again.
    clock_set(&mut c, T_US + 41_000_000);
    assert_eq!(limiter(&mut c, &shallow), [1, 10, 0, -1, 10_000, 9_000]);
    assert_eq!(limiter(&mut c, &shallow), [0, 10, 0, 1_000, 10_000, -1]);
    // BURST 100 again: behind it, one interval apart.
    assert_eq!(limiter(&mut c, &deep).delay_ms, Some(10_000));
    let d = payload(&mut c, "q");
    assert_eq!(restore(&mut c, "q:copy", &d).as_deref(), Ok("OK"));
}
