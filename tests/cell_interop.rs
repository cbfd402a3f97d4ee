//! Keys redis-cell left (a string holding the theoretical arrival time in ns) and the native
//! commands (issue 10): RL.GCRA, RL.MULTI, RL.INFO and RL.RESET read such a key as CL.THROTTLE
//! does, a call that writes takes it over (replicated as RL.SETSTATE), and a state written by
//! RL.GCRA is read by CL.THROTTLE. Also: RL.SETSTATE without PXAT keeps the key's TTL, and
//! CL.THROTTLE's rounding of retry_after / reset_after to seconds is exactly as documented.

mod common;

use common::resp::{Reply, Resp};
use common::{redis_cell_keys, redis_cell_set, text, wait_replica_synced, Opts, Server};

const NOW_US: i64 = 1_700_000_000_000_000;
const NOW_NS: i64 = NOW_US * 1000;

fn ok(r: Reply) -> Reply {
    assert!(!r.is_error(), "unexpected error {:?}", r.error_text());
    r
}

/// A redis-cell key: `tat_ns` as a decimal string with the TTL redis-cell gives it (the clock
/// at NOW_US).
fn cell_key(c: &mut Resp, key: &str, tat_ns: i64) {
    let set = redis_cell_set(key, tat_ns, NOW_NS);
    ok(c.c(&set.iter().map(String::as_str).collect::<Vec<_>>()));
}

/// The module value's bytes (DUMP without the RDB version and CRC).
fn body(c: &mut Resp, key: &str) -> Vec<u8> {
    let d = c.c(&["DUMP", key]);
    let d = d.bulk().unwrap_or_else(|| panic!("DUMP {key}: {d:?}"));
    d[..d.len() - 10].to_vec()
}

/// With REDIS_CELL_KEYS, every native reader agrees with CL.THROTTLE on a redis-cell key, and
/// the first write takes it over with the same state CL.THROTTLE would have stored.
#[test]
fn native_commands_read_and_take_over_redis_cell_keys() {
    let s = Server::start_with(redis_cell_keys());
    let mut c = Resp::connect(s.port);
    c.clock_set(NOW_US);
    // 10 per 60 s with max_burst 4 (capacity 5): an arrival time 18 s ahead leaves 2 units.
    let tat = NOW_NS + 18_000_000_000;
    for k in ["by_cell", "by_gcra", "by_multi", "peek_gcra", "peek_multi", "info", "reset"] {
        cell_key(&mut c, k, tat);
    }
    // Peeks first: nothing is written, and the view equals CL.THROTTLE's.
    let cell_peek = ok(c.c(&["CL.THROTTLE", "by_cell", "4", "10", "60", "0"])).ints().unwrap();
    assert_eq!(cell_peek, vec![0, 5, 2, -1, 18]);
    let gcra_peek = ok(c.c(&["RL.GCRA", "peek_gcra", "10", "60s", "BURST", "5", "DRYRUN"])).ints().unwrap();
    assert_eq!(gcra_peek, vec![1, 5, 1, -1, 24_000], "DRYRUN of one unit on a redis-cell key");
    let multi_peek = ok(c.c(&["RL.MULTI", "1", "peek_multi", "GCRA", "10", "60s", "BURST", "5", "COST", "0"]));
    assert_eq!(multi_peek.multi().limits, [vec![0, 5, 2, -1, 18_000]]);
    for k in ["by_cell", "peek_gcra", "peek_multi"] {
        assert_eq!(c.c(&["TYPE", k]), Reply::Status(b"string".to_vec()), "{k}: a peek takes nothing over");
    }
    // RL.INFO: what redis-cell stores, no more.
    let i = ok(c.c(&["RL.INFO", "info"])).rl_info().expect("RL.INFO info");
    assert_eq!(i.names(), vec!["algorithm", "source", "tat_us", "ttl_ms"]);
    assert_eq!(i.algorithm(), "gcra");
    assert_eq!(i.get("source").map(text), Some("redis-cell".to_string()));
    assert_eq!(i.int("tat_us"), tat / 1000);
    let ttl = i.int("ttl_ms");
    assert!(ttl > 0 && ttl <= 600_000, "ttl_ms {ttl}");
    // Admitted calls: each takes its key over with exactly the state CL.THROTTLE stores.
    let a = ok(c.c(&["CL.THROTTLE", "by_cell", "4", "10", "60"])).ints().unwrap();
    assert_eq!(a, vec![0, 5, 1, -1, 24]);
    let b = ok(c.c(&["RL.GCRA", "by_gcra", "10", "60s", "BURST", "5"])).ints().unwrap();
    assert_eq!(b, vec![1, 5, 1, -1, 24_000]);
    let m = ok(c.c(&["RL.MULTI", "1", "by_multi", "GCRA", "10", "60s", "BURST", "5"]));
    assert_eq!(m.multi().limits, [vec![1, 5, 1, -1, 24_000]]);
    let reference = body(&mut c, "by_cell");
    for k in ["by_cell", "by_gcra", "by_multi"] {
        assert_eq!(c.c(&["TYPE", k]), Reply::Status(b"ratelimit".to_vec()), "{k} taken over");
        assert_eq!(body(&mut c, k), reference, "{k}: the same state as CL.THROTTLE's");
    }
    // RL.RESET deletes a redis-cell key.
    assert_eq!(c.c(&["RL.RESET", "reset"]), Reply::Int(1));
    assert_eq!(c.c(&["EXISTS", "reset"]), Reply::Int(0));
    // Other algorithms: the usual mismatch; a string that is not an arrival time: WRONGTYPE.
    cell_key(&mut c, "other", tat);
    for cmd in [
        &["RL.TOKENBUCKET", "other", "10", "1m"][..],
        &["RL.SLIDINGLOG", "other", "10", "1m"],
        &["RL.MULTI", "1", "other", "FIXED", "1", "1s"],
    ] {
        let e = c.c(cmd).error_text().unwrap_or_default();
        assert!(e.starts_with("WRONGTYPE key holds gcra state"), "{cmd:?}: {e}");
    }
    ok(c.c(&["SET", "text", "hello"]));
    for cmd in [
        &["RL.GCRA", "text", "1", "1s"][..],
        &["RL.INFO", "text"],
        &["RL.RESET", "text"],
        &["CL.THROTTLE", "text", "1", "1", "1"],
    ] {
        assert!(c.c(cmd).error_text().unwrap_or_default().starts_with("WRONGTYPE"), "{cmd:?}");
    }
    assert_eq!(c.c(&["GET", "text"]), Reply::Bulk(Some(b"hello".to_vec())));
}

/// By default only CL.THROTTLE, the drop-in, reads a key redis-cell left: the RL.* commands
/// answer WRONGTYPE (naming REDIS_CELL_KEYS) and leave it as it is. Only a key that is exactly
/// what redis-cell writes is one: its arrival time as `u64::to_string` writes it, with a TTL
/// that ends at that instant (within 60 s); any other integer string is WRONGTYPE for every
/// command, CL.THROTTLE included.
#[test]
fn only_cl_throttle_reads_redis_cell_keys_by_default() {
    let s = Server::start();
    let mut c = Resp::connect(s.port);
    c.clock_set(NOW_US);
    let tat = NOW_NS + 18_000_000_000;
    cell_key(&mut c, "cell", tat);
    for cmd in [
        &["RL.GCRA", "cell", "10", "60s", "BURST", "5"][..],
        &["RL.GCRA", "cell", "10", "60s", "DRYRUN"],
        &["RL.MULTI", "1", "cell", "GCRA", "10", "60s"],
        &["RL.INFO", "cell"],
        &["RL.RESET", "cell"],
        &["RL.RETURN", "cell", "1"],
    ] {
        let e = c.c(cmd).error_text().unwrap_or_default();
        assert!(e.starts_with("WRONGTYPE") && e.contains("REDIS_CELL_KEYS"), "{cmd:?}: {e}");
    }
    assert_eq!(c.c(&["GET", "cell"]), Reply::Bulk(Some(tat.to_string().into_bytes())));
    assert_eq!(ok(c.c(&["CL.THROTTLE", "cell", "4", "10", "60", "0"])).ints().unwrap(), vec![0, 5, 2, -1, 18]);

    // Integer strings that are not what redis-cell writes: WRONGTYPE for CL.THROTTLE as well.
    let ttl = |ms: i64| ms.to_string();
    for (value, px) in [
        (tat.to_string(), None),                                     // no TTL
        (tat.to_string(), Some(ttl(18_000 + 61_000))),               // a TTL ending 61 s after it
        ((NOW_NS + 120_000_000_000).to_string(), Some(ttl(30_000))), // a TTL ending 90 s before it
        (format!("0{tat}"), Some(ttl(18_000))),                      // not as u64::to_string writes it
        (format!("+{tat}"), Some(ttl(18_000))),
        ("-7".to_string(), Some(ttl(18_000))),
        ("42".to_string(), Some(ttl(60_000))), // an INCR counter with its window
        ("18446744073709551615".to_string(), Some(ttl(18_000))), // beyond any i64 instant
    ] {
        let mut set = vec!["SET", "odd", &value];
        if let Some(px) = &px {
            set.extend(["PX", px]);
        }
        ok(c.c(&set));
        let e = c.c(&["CL.THROTTLE", "odd", "4", "10", "60"]).error_text().unwrap_or_default();
        assert!(e.starts_with("WRONGTYPE") && e.contains("not a redis-cell arrival time"), "{value} {px:?}: {e}");
        assert_eq!(c.c(&["GET", "odd"]), Reply::Bulk(Some(value.clone().into_bytes())), "{value} untouched");
    }
    // Within the slack either side (clock readings, a script's start time): a redis-cell key.
    for px in [18_000 + 59_000, 30_000, 18_000] {
        ok(c.c(&["SET", "near", &tat.to_string(), "PX", &px.to_string()]));
        let r = ok(c.c(&["CL.THROTTLE", "near", "4", "10", "60", "0"])).ints().unwrap();
        assert_eq!(r, vec![0, 5, 2, -1, 18], "TTL {px} ms");
    }
}

/// The other direction: a state RL.GCRA wrote is the state CL.THROTTLE decides on.
#[test]
fn cl_throttle_reads_what_rl_gcra_wrote() {
    let s = Server::start();
    let mut c = Resp::connect(s.port);
    c.clock_set(NOW_US);
    for _ in 0..3 {
        ok(c.c(&["RL.GCRA", "k", "10", "60s", "BURST", "5"]));
    }
    ok(c.c(&["COPY", "k", "twin"]));
    let native = ok(c.c(&["RL.GCRA", "twin", "10", "60s", "BURST", "5"])).limiter();
    let cell = ok(c.c(&["CL.THROTTLE", "k", "4", "10", "60"])).cell();
    let seen = (cell.limited, cell.limit, cell.remaining);
    assert_eq!(seen, (0, 5, native.remaining), "CL.THROTTLE {cell:?} vs RL.GCRA {native:?}");
    assert_eq!(body(&mut c, "k"), body(&mut c, "twin"));
}

/// A replica holds exactly what the primary holds after native commands take over redis-cell
/// keys (the take-over is replicated as RL.SETSTATE, which replaces the string).
#[test]
fn take_over_is_replicated_exactly() {
    let p = Server::start_with(redis_cell_keys());
    let r = Server::start_with(Opts { replica_of: Some(p.port), ..redis_cell_keys() });
    wait_replica_synced(&p, &r);
    let mut c = Resp::connect(p.port);
    c.clock_set(NOW_US);
    let keys = ["g", "m", "t"];
    for k in keys {
        cell_key(&mut c, k, NOW_NS + 6_000_000_000);
    }
    ok(c.c(&["RL.GCRA", "g", "10", "60s", "BURST", "5"]));
    ok(c.c(&["RL.MULTI", "1", "m", "GCRA", "10", "60s"]));
    ok(c.c(&["CL.THROTTLE", "t", "4", "10", "60"]));
    wait_replica_synced(&p, &r);
    let mut rc = Resp::connect(r.port);
    for k in keys {
        assert_eq!(rc.c(&["TYPE", k]), Reply::Status(b"ratelimit".to_vec()), "{k} on the replica");
        assert_eq!(body(&mut rc, k), body(&mut c, k), "{k}: replica DUMP");
        assert_eq!(rc.c(&["PEXPIRETIME", k]), c.c(&["PEXPIRETIME", k]), "{k}: replica expiry");
    }
}

/// RL.SETSTATE without PXAT leaves the key's TTL as it is, whatever the key held before.
#[test]
fn setstate_without_pxat_keeps_the_ttl() {
    let s = Server::start();
    let mut c = Resp::connect(s.port);
    c.clock_set(NOW_US);
    ok(c.c(&["RL.GCRA", "src", "10", "60s"]));
    // A whole-state payload, taken from what the module replicates for `src`: RL.SETSTATE of
    // the same state onto other keys.
    let payload = setstate_payload(&mut c);
    ok(c.c(&["SET", "str", "hello", "PX", "500000"]));
    ok(c.c(&["RPUSH", "list", "a"]));
    ok(c.c(&["PEXPIRE", "list", "400000"]));
    ok(c.c(&["SET", "cell", &NOW_NS.to_string(), "PX", "300000"]));
    ok(c.c(&["RL.GCRA", "own", "10", "60s"]));
    ok(c.c(&["PEXPIRE", "own", "200000"]));
    for k in ["str", "list", "cell", "own"] {
        let before = c.c(&["PEXPIRETIME", k]);
        assert!(before.int().unwrap() > 0);
        assert_eq!(c.cmd(&[b"RL.SETSTATE", k.as_bytes(), &payload]), Reply::Status(b"OK".to_vec()), "{k}");
        assert_eq!(c.c(&["TYPE", k]), Reply::Status(b"ratelimit".to_vec()));
        assert_eq!(c.c(&["PEXPIRETIME", k]), before, "{k}: RL.SETSTATE without PXAT keeps the TTL");
    }
    // A key without a TTL stays without one.
    ok(c.c(&["SET", "plain", "x"]));
    assert_eq!(c.cmd(&[b"RL.SETSTATE", b"plain", &payload]), Reply::Status(b"OK".to_vec()));
    assert_eq!(c.c(&["PEXPIRETIME", "plain"]), Reply::Int(-1));
}

/// The payload of the RL.SETSTATE the module propagates for an admitted check, read from the
/// AOF-free replication stream via a replica would be heavier: the module's codec is public.
fn setstate_payload(_c: &mut Resp) -> Vec<u8> {
    use redis_ratelimit_core::codec::State;
    use redis_ratelimit_core::spec::Update;
    use redis_ratelimit_core::{gcra, Nanos, Rate, NANOS_PER_SEC};
    let rate = Rate::new(10, Nanos::new(60 * NANOS_PER_SEC), 10).unwrap();
    let mut out = Vec::new();
    Update::Replace(State::Gcra(gcra::State { rate, tat: (NOW_NS as i128 + 6 * NANOS_PER_SEC as i128) * 10 }))
        .encode_into(&mut out);
    out
}

/// CL.THROTTLE reports seconds as redis-cell does: whole seconds, plus one when at least one
/// full millisecond is left over. A wait under 1 ms beyond whole seconds is dropped, so the
/// reported retry_after can be early by less than 1 ms (0 means: within the next millisecond).
#[test]
fn cl_throttle_seconds_rounding_is_as_documented() {
    let s = Server::start();
    let mut c = Resp::connect(s.port);
    // 1 per second, no burst: admitted at NOW, the next unit is due at NOW + 1 s.
    c.clock_set(NOW_US);
    assert_eq!(ok(c.c(&["CL.THROTTLE", "r", "0", "1", "1"])).ints().unwrap(), vec![0, 1, 0, -1, 1]);
    // (µs after NOW, expected retry_after_s): wait = 1 s − elapsed.
    for (after_us, retry_s) in [(1, 1), (998_999, 1), (999_000, 1), (999_001, 0), (999_500, 0), (999_999, 0)] {
        c.clock_set(NOW_US + after_us);
        let r = ok(c.c(&["CL.THROTTLE", "r", "0", "1", "1", "1"])).cell();
        assert_eq!(r.limited, 1, "limited {after_us} µs after");
        assert_eq!(r.retry_after_s, retry_s, "retry_after {after_us} µs after: wait {} µs", 1_000_000 - after_us);
        assert_eq!(r.reset_after_s, retry_s, "reset_after equals retry_after here");
    }
    c.clock_set(NOW_US + 1_000_000);
    assert_eq!(ok(c.c(&["CL.THROTTLE", "r", "0", "1", "1"])).cell().limited, 0, "admitted when due");
    // 2.0005 s → 2, 2.000999 s → 2 and 2.001 s → 3 (a longer period).
    c.clock_set(NOW_US);
    ok(c.c(&["CL.THROTTLE", "p", "0", "1", "5"]));
    for (after_us, retry_s) in [(2_999_500, 2), (2_999_001, 2), (2_999_000, 3)] {
        c.clock_set(NOW_US + after_us);
        assert_eq!(ok(c.c(&["CL.THROTTLE", "p", "0", "1", "5"])).cell().retry_after_s, retry_s, "{after_us} µs after");
    }
}
