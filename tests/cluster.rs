//! Redis Cluster tests: routing (MOVED / ASK followed by a cluster client, MOVED from a wrong
//! node, replicas refusing checks), resharding one slot (DUMP and expiry of every algorithm's
//! state carried by MIGRATE), a manual failover (the promoted replica holds byte-identical state
//! and keeps limiting), and load across reshards and a failover that never admits more than the
//! limits allow.
//!
//! Each test starts its own 3-primary / 3-replica cluster (`Cluster::start(3, 1)`) and prints
//! one line of figures (`cluster figures [...]`); see them with
//! `cargo test --release --test cluster -- --nocapture`. docs/operations.md summarises them.

mod common;

use common::{
    clock_get, err_text, keyslot, now_us, payload, pexpiretime, rl_info, run, text, try_run, Args, CellReply, Cluster,
    LimiterReply, MultiReply, RlInfo, Server,
};
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ConnectionLike, ErrorKind, ServerErrorKind, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// RL.INFO without `ttl_ms` (it runs on the real clock); panics when the key is missing.
fn state_info<C: ConnectionLike>(con: &mut C, key: &str) -> RlInfo {
    rl_info(con, key).unwrap_or_else(|| panic!("RL.INFO {key}: no such key")).without_ttl()
}

fn role(n: &Server) -> String {
    common::info_field(&n.info("replication"), "role").unwrap_or_default().to_string()
}

fn myid(n: &Server) -> String {
    text(&run(&mut n.conn(), &["CLUSTER", "MYID"]))
}

/// The port of the primary serving `slot` according to `n`'s own view (CLUSTER SLOTS).
fn slot_owner_seen_by(n: &Server, slot: i64) -> Option<u16> {
    let mut con = n.conn();
    let Ok(Value::Array(ranges)) = try_run(&mut con, &["CLUSTER", "SLOTS"]) else { return None };
    for r in ranges {
        let Value::Array(items) = r else { continue };
        if let (Value::Int(lo), Value::Int(hi), Value::Array(p)) = (&items[0], &items[1], &items[2]) {
            if *lo <= slot && slot <= *hi {
                if let Value::Int(port) = p[1] {
                    return Some(port as u16);
                }
            }
        }
    }
    None
}

/// The replica currently following `primary`.
fn replica_of<'a>(c: &'a Cluster, primary: &Server) -> &'a Server {
    let want = format!("master_port:{}", primary.port);
    c.nodes
        .iter()
        .find(|n| {
            let info = n.info("replication");
            info.contains("role:slave") && info.lines().any(|l| l.trim() == want)
        })
        .unwrap_or_else(|| panic!("no replica follows port {}", primary.port))
}

/// Waits (up to 5 s) until `from` has an outgoing cluster-bus link to `to` (CLUSTER LINKS): a
/// manual failover's MFSTART is silently not sent while the replica has no link to its primary.
fn wait_link(from: &Server, to: &Server) {
    let to_id = myid(to);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let links = run(&mut from.conn(), &["CLUSTER", "LINKS"]);
        let Value::Array(links) = links else { panic!("CLUSTER LINKS: {links:?}") };
        let linked = links.iter().any(|l| {
            let Value::Array(kv) = l else { return false };
            let field = |name: &str| kv.chunks(2).find(|p| text(&p[0]) == name).map(|p| text(&p[1]));
            field("direction").as_deref() == Some("to") && field("node").as_deref() == Some(to_id.as_str())
        });
        if linked {
            return;
        }
        assert!(Instant::now() < deadline, "node {} has no cluster link to {}", from.port, to.port);
        sleep(Duration::from_millis(20));
    }
}

/// Waits (up to 10 s) until every node's view (CLUSTER REPLICAS) has `replica` as a replica of
/// `primary`. Right after cluster creation the primary may not know yet: it then ignores the
/// replica's manual-failover request (MFSTART) and the failover times out after 5 s.
fn wait_known_replica(c: &Cluster, primary: &Server, replica: &Server) {
    let (pid, rid) = (myid(primary), myid(replica));
    let deadline = Instant::now() + Duration::from_secs(10);
    for n in &c.nodes {
        loop {
            let known = match try_run(&mut n.conn(), &["CLUSTER", "REPLICAS", &pid]) {
                Ok(Value::Array(lines)) => lines.iter().any(|l| text(l).starts_with(&rid)),
                _ => false,
            };
            if known {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {} does not see {} as a replica of {}",
                n.port,
                replica.port,
                primary.port
            );
            sleep(Duration::from_millis(20));
        }
    }
}

/// Pins the module clock (RL.DEBUG CLOCK SET) of every node to the same instant.
fn pin_clock(c: &Cluster, at_us: i64) {
    for n in &c.nodes {
        run(&mut n.conn(), &["RL.DEBUG", "CLOCK", "SET", &at_us.to_string()]);
    }
}

fn cluster_conn(c: &Cluster) -> ClusterConnection {
    let urls: Vec<String> = c.nodes.iter().map(|n| n.url()).collect();
    let client = ClusterClient::builder(urls)
        .retries(32)
        .min_retry_wait(10)
        .max_retry_wait(200)
        .connection_timeout(Duration::from_secs(5))
        // No response timeout: see common::watchdog.
        .build()
        .expect("cluster client");
    client.get_connection().expect("cluster connection")
}

/// Moves one hash slot from `src` to `dst` by hand, as redis-cli --cluster reshard does for
/// each slot: SETSLOT IMPORTING on the destination, MIGRATING on the source, MIGRATE the keys
/// (`batch` keys per MIGRATE call, `pause` between steps so that clients hit the ASK window),
/// then SETSLOT NODE on the destination, the source and every other primary. Waits until every
/// node (replicas included) sees the new owner. Returns the number of keys moved.
fn migrate_slot(c: &Cluster, slot: i64, src: &Server, dst: &Server, batch: usize, pause: Duration) -> usize {
    let (src_id, dst_id) = (myid(src), myid(dst));
    let slot_s = slot.to_string();
    let (mut s, mut d) = (src.conn(), dst.conn());
    run(&mut d, &["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &src_id]);
    run(&mut s, &["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &dst_id]);
    sleep(pause);
    let mut moved = 0;
    loop {
        let keys: Vec<String> = match run(&mut s, &["CLUSTER", "GETKEYSINSLOT", &slot_s, &batch.to_string()]) {
            Value::Array(a) => a.iter().map(text).collect(),
            other => panic!("GETKEYSINSLOT: {other:?}"),
        };
        if keys.is_empty() {
            break;
        }
        let port = dst.port.to_string();
        let mut args: Vec<&str> = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        let r = run(&mut s, &args);
        assert!(matches!(r, Value::Okay) || text(&r) == "OK", "MIGRATE replied {r:?}");
        moved += keys.len();
        sleep(pause);
    }
    // Destination first (it bumps its config epoch), then the source, then the others.
    let mut order: Vec<&Server> = vec![dst, src];
    for p in c.current_primaries() {
        if p.port != dst.port && p.port != src.port {
            order.push(p);
        }
    }
    for n in order {
        run(&mut n.conn(), &["CLUSTER", "SETSLOT", &slot_s, "NODE", &dst_id]);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for n in &c.nodes {
        while slot_owner_seen_by(n, slot) != Some(dst.port) {
            assert!(Instant::now() < deadline, "node {} does not see slot {slot} on {}", n.port, dst.port);
            sleep(Duration::from_millis(20));
        }
    }
    moved
}

/// Nodes that died or logged a crash (Redis crash report, Rust panic, assertion).
fn crashes(c: &Cluster) -> usize {
    c.nodes
        .iter()
        .filter(|n| {
            let log = n.log();
            let crashed = ["crashed by signal", "panicked", "ASSERTION FAILED", "Guru Meditation"]
                .iter()
                .any(|m| log.contains(m));
            if crashed || !n.alive() {
                eprintln!("node {} crashed or is down:\n{}", n.port, log);
                true
            } else {
                false
            }
        })
        .count()
}

struct Figures {
    name: &'static str,
    ops: u64,
    keys: usize,
    faults: usize,
    crashes: usize,
    over: u64,
    extra: String,
}

impl Figures {
    fn print(&self) {
        println!(
            "cluster figures [{}]: ops sent {}, keys {}, faults injected {}, crashes: {}, over-admissions: {}{}",
            self.name, self.ops, self.keys, self.faults, self.crashes, self.over, self.extra
        );
        assert_eq!(self.crashes, 0, "crashes");
        assert_eq!(self.over, 0, "over-admissions");
    }
}

/// The seven limiter commands with small test parameters (capacity 10, long periods so that
/// TTLs, which run on the real clock, outlast the test) and the algorithm RL.INFO reports.
struct Limiter {
    cmd: &'static str,
    /// Arguments after the key.
    args: &'static [&'static str],
    algo: &'static str,
}

const LIMITERS: &[Limiter] = &[
    Limiter { cmd: "RL.GCRA", args: &["10", "1h"], algo: "gcra" },
    Limiter { cmd: "RL.TOKENBUCKET", args: &["10", "1h"], algo: "tokenbucket" },
    Limiter { cmd: "RL.LEAKY", args: &["10", "1h"], algo: "leaky" },
    Limiter { cmd: "RL.SLIDING", args: &["10", "1h"], algo: "sliding" },
    Limiter { cmd: "RL.FIXED", args: &["10", "1d"], algo: "fixed" },
    Limiter { cmd: "RL.SLIDINGLOG", args: &["10", "1h"], algo: "slidinglog" },
    // max_burst 9 → capacity 10; 10 per hour.
    Limiter { cmd: "CL.THROTTLE", args: &["9", "10", "3600"], algo: "gcra" },
];

fn limiter_args<'a>(l: &'a Limiter, key: &'a str) -> Vec<&'a str> {
    let mut a = vec![l.cmd, key];
    a.extend_from_slice(l.args);
    a
}

/// Checks the reply of the first call on a fresh key.
fn check_fresh_reply(l: &Limiter, key: &str, v: &Value) {
    if l.cmd == "CL.THROTTLE" {
        assert_eq!(CellReply::of(v), [0, 10, 9, -1, 360], "{} {key}", l.cmd);
        return;
    }
    let r = LimiterReply::of(v);
    assert_eq!(r.delay_ms.is_some(), l.cmd == "RL.LEAKY", "{} {key}: {r:?}", l.cmd);
    assert_eq!((r.allowed, r.limit, r.remaining, r.retry_after_ms), (1, 10, 9, -1), "{} {key}: {r:?}", l.cmd);
    assert!(r.reset_after_ms > 0, "{} {key}: reset_after {r:?}", l.cmd);
    if l.cmd == "RL.LEAKY" {
        assert_eq!(r.delay_ms, Some(0), "first request into an empty leaky bucket waits 0 ms");
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Routing
// ---------------------------------------------------------------------------------------------

/// A cluster client sends every command on many keys, with and without hash tags; every reply
/// is valid and every key lives on the primary serving its slot. A node that does not serve a
/// key's slot answers MOVED for every module command; a replica answers MOVED for checks, also
/// in READONLY mode, while serving RL.INFO there.
#[test]
fn routing_follows_moved_and_keys_land_on_their_slot_owner() {
    let c = Cluster::start(3, 1);
    let mut cc = cluster_conn(&c);
    let mut ops = 0u64;
    let mut keys: Vec<String> = Vec::new();
    const PER_CMD: usize = 60;

    for (li, l) in LIMITERS.iter().enumerate() {
        for i in 0..PER_CMD {
            // Half plain keys (spread over all slots), half hash-tagged per tenant.
            let key = if i % 2 == 0 {
                format!("rt:{}:{li}:{i}", l.algo)
            } else {
                format!("{{tenant{}}}:{}:{li}:{i}", i % 7, l.algo)
            };
            let v = run(&mut cc, &limiter_args(l, &key));
            check_fresh_reply(l, &key, &v);
            let info = state_info(&mut cc, &key);
            assert_eq!(info.algorithm(), l.algo, "RL.INFO {key}");
            ops += 2;
            keys.push(key);
        }
    }
    // RL.RESET through the cluster client: every third key.
    let mut reset = 0;
    for key in keys.iter().step_by(3) {
        assert_eq!(run(&mut cc, &["RL.RESET", key]), Value::Int(1), "RL.RESET {key}");
        assert_eq!(run(&mut cc, &["RL.RESET", key]), Value::Int(0), "second RL.RESET {key}");
        assert_eq!(run(&mut cc, &["RL.INFO", key]), Value::Nil, "RL.INFO after reset");
        ops += 3;
        reset += 1;
    }
    // RL.MULTI: the redis crate routes an unknown command by its first argument (numkeys here),
    // so this also exercises MOVED being followed for a multi-key module command.
    let moved_start: u64 = c.nodes.iter().map(|n| errorstat(n, "MOVED")).sum();
    for t in 0..10 {
        let (a, b) = (format!("{{m{t}}}:ip"), format!("{{m{t}}}:user"));
        let v = run(&mut cc, &["RL.MULTI", "2", &a, &b, "GCRA", "10", "1h", "SLIDINGLOG", "5", "1h"]);
        assert!(matches!(v, Value::Array(_)), "RL.MULTI: {v:?}");
        let m = MultiReply::of(&v);
        assert_eq!(m.limits.len(), 2, "RL.MULTI reply {v:?}");
        assert_eq!(m.allowed, 1, "RL.MULTI admitted {v:?}");
        ops += 1;
        keys.push(a);
        keys.push(b);
    }
    // Routed explicitly by its first key (the fix for clients that route by the first
    // argument): answered by the owner directly, so the owners see no MOVED-ed attempt.
    let moved_before: u64 = c.nodes.iter().map(|n| errorstat(n, "MOVED")).sum();
    let multi_redirected = moved_before - moved_start;
    for t in 10..20 {
        let (a, b) = (format!("{{m{t}}}:ip"), format!("{{m{t}}}:user"));
        let mut cmd = redis::cmd("RL.MULTI");
        cmd.arg(2).arg(&a).arg(&b).arg(&["GCRA", "10", "1h", "SLIDINGLOG", "5", "1h"]);
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(&a, SlotAddr::Master)));
        let v = cc.route_command(&cmd, route).expect("RL.MULTI routed by its first key");
        assert!(matches!(v, Value::Array(_)), "RL.MULTI: {v:?}");
        assert_eq!(MultiReply::of(&v).allowed, 1, "RL.MULTI admitted {v:?}");
        ops += 1;
        keys.push(a);
        keys.push(b);
    }
    let moved_after: u64 = c.nodes.iter().map(|n| errorstat(n, "MOVED")).sum();
    assert_eq!(moved_after, moved_before, "explicitly routed RL.MULTI calls were redirected");
    let live = keys.len() - reset;

    // Every key is on its slot's primary; all three primaries got keys; nothing is elsewhere.
    let primaries: Vec<&Server> = c.current_primaries();
    assert_eq!(primaries.len(), 3);
    let mut per_primary = BTreeMap::new();
    let mut total = 0i64;
    for p in &primaries {
        let n = match run(&mut p.conn(), &["DBSIZE"]) {
            Value::Int(n) => n,
            v => panic!("DBSIZE {v:?}"),
        };
        assert!(n > 0, "primary {} holds no key: routing did not spread the keys", p.port);
        per_primary.insert(p.port, n);
        total += n;
    }
    assert_eq!(total as usize, live, "keys on the primaries {per_primary:?} vs created {live}");
    for (i, key) in keys.iter().enumerate() {
        if i % 3 == 0 && i < LIMITERS.len() * PER_CMD {
            continue; // reset
        }
        let owner = c.primary_for_key(key.as_bytes());
        assert_eq!(run(&mut owner.conn(), &["EXISTS", key]), Value::Int(1), "{key} not on {}", owner.port);
    }
    // Hash-tagged keys of one tenant share a slot.
    for t in 0..7 {
        let slots: std::collections::BTreeSet<i64> = keys
            .iter()
            .filter(|k| k.starts_with(&format!("{{tenant{t}}}:")))
            .map(|k| keyslot(&mut c.nodes[0].conn(), k))
            .collect();
        assert_eq!(slots.len(), 1, "tenant{t} keys span slots {slots:?}");
    }

    // A wrong node answers MOVED <slot> <owner> for every module command.
    let mut moved = 0;
    let probe_keys = ["rt:probe:1", "rt:probe:2", "{tenant1}:probe", "{tenantX}:probe", "zz"];
    for key in probe_keys {
        let slot = keyslot(&mut c.nodes[0].conn(), key);
        let owner = c.primary_for_key(key.as_bytes());
        let wrong = primaries.iter().find(|p| p.port != owner.port).unwrap();
        let mut con = wrong.conn();
        let other = format!("{key}:2"); // for RL.MULTI: same tag only when the key has one
        let multi_keys: Vec<&str> = if key.starts_with('{') { vec![key, &other] } else { vec![key] };
        let mut cmds: Vec<Vec<&str>> = LIMITERS.iter().map(|l| limiter_args(l, key)).collect();
        cmds.push(vec!["RL.INFO", key]);
        cmds.push(vec!["RL.RESET", key]);
        cmds.push(vec!["RL.SETSTATE", key, "not-a-payload"]);
        let n = multi_keys.len().to_string();
        let mut m = vec!["RL.MULTI", n.as_str()];
        m.extend(multi_keys.iter().copied());
        for _ in 0..multi_keys.len() {
            m.extend(["GCRA", "10", "1s"]);
        }
        cmds.push(m);
        for args in &cmds {
            let e = try_run(&mut con, args).expect_err(&format!("{} on a wrong node must be refused", args.join(" ")));
            assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::Moved), "{}: {}", args.join(" "), err_text(&e));
            let (addr, s) = e.redirect_node().expect("MOVED target");
            assert_eq!(s as i64, slot, "{}: MOVED slot", args.join(" "));
            assert_eq!(addr, format!("127.0.0.1:{}", owner.port), "{}: MOVED address", args.join(" "));
            moved += 1;
            ops += 1;
        }
        assert_eq!(run(&mut con, &["DBSIZE"]), Value::Int(per_primary[&wrong.port]), "a refused command wrote");
    }

    // Replicas: checks are writes, so a replica answers MOVED to its primary, also after
    // READONLY; RL.INFO (readonly) is served by a READONLY replica with the primary's state.
    let key = "{tenant1}:gcra:0:1"; // created above, not reset
    let owner = c.primary_for_key(key.as_bytes());
    let replica = replica_of(&c, owner);
    common::wait_replica_synced(owner, replica);
    let mut rc = replica.conn();
    let e = try_run(&mut rc, &["RL.GCRA", key, "10", "60s"]).expect_err("a replica must not run a check");
    assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::Moved), "{}", err_text(&e));
    run(&mut rc, &["READONLY"]);
    for l in LIMITERS {
        let e = try_run(&mut rc, &limiter_args(l, key)).expect_err("a READONLY replica must not run a check");
        assert_eq!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::Moved),
            "{} on a READONLY replica: {}",
            l.cmd,
            err_text(&e)
        );
        assert_eq!(e.redirect_node().unwrap().0, format!("127.0.0.1:{}", owner.port));
        ops += 1;
    }
    let e = try_run(&mut rc, &["RL.MULTI", "1", key, "GCRA", "10", "1h"]).expect_err("RL.MULTI on a replica");
    assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::Moved), "RL.MULTI on a READONLY replica: {}", err_text(&e));
    ops += 1;
    let on_replica = state_info(&mut rc, key);
    let on_primary = state_info(&mut owner.conn(), key);
    assert_eq!(on_replica.names(), on_primary.names(), "RL.INFO on the READONLY replica");
    // The parameters (tat_us and available move with the real clock between the two reads).
    for field in ["algorithm", "limit", "period_us", "burst"] {
        let want = on_primary.get(field).unwrap_or_else(|| panic!("RL.INFO {key} has no {field}: {on_primary:?}"));
        assert_eq!(on_replica.get(field), Some(want), "RL.INFO {field} on the READONLY replica");
    }
    ops += 2;

    let crashed = crashes(&c);
    Figures {
        name: "routing",
        ops,
        keys: keys.len(),
        faults: 0,
        crashes: crashed,
        over: 0,
        extra: format!(
            ", MOVED replies checked {moved}, keys per primary {per_primary:?}, \
             RL.MULTI redirected when routed by numkeys {multi_redirected}/10, when routed by its first key 0/10"
        ),
    }
    .print();
}

// ---------------------------------------------------------------------------------------------
// 2. Reshard: one slot moves, state and expiry move with it
// ---------------------------------------------------------------------------------------------

/// Builds a live key of every algorithm (plus a large sliding log) in one slot with a scripted
/// history on `owner`'s pinned clock, which it advances; then sets every node's clock to the
/// owner's. Returns (key, command args).
fn build_slot_keys(c: &Cluster, owner: &Server, tag: &str, ops: &mut u64) -> Vec<(String, Vec<String>)> {
    let mut con = owner.conn();
    let specs: Vec<(String, Vec<String>)> = vec![
        ("gcra", vec!["RL.GCRA", "5", "1m", "BURST", "20"]),
        ("tb", vec!["RL.TOKENBUCKET", "5", "1m", "BURST", "20"]),
        ("leaky", vec!["RL.LEAKY", "5", "1m", "BURST", "20"]),
        ("sliding", vec!["RL.SLIDING", "100", "10m"]),
        ("fixed", vec!["RL.FIXED", "100", "1h"]),
        ("log", vec!["RL.SLIDINGLOG", "100", "10m"]),
        ("cl", vec!["CL.THROTTLE", "19", "5", "60"]),
        // A large log: 1000 entries of up to 3000 units (counts ≥ 2047 take a second word).
        ("biglog", vec!["RL.SLIDINGLOG", "10000000", "1h"]),
    ]
    .into_iter()
    .map(|(name, args)| {
        let key = format!("{{{tag}}}:{name}");
        let mut a: Vec<String> = vec![args[0].to_string(), key.clone()];
        a.extend(args[1..].iter().map(|s| s.to_string()));
        (key, a)
    })
    .collect();
    let mut rng = 0x1234_5678_9abc_def1u64;
    for round in 0..25 {
        for (key, args) in &specs {
            let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
            if key.ends_with(":biglog") {
                let mut p = redis::pipe();
                for _ in 0..40 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let cost = (1 + rng % 3000).to_string();
                    let mut cmd = a.cmd();
                    cmd.arg("COST").arg(cost);
                    p.add_command(cmd).ignore();
                    p.add_command(["RL.DEBUG", "CLOCK", "ADVANCE", "3"].cmd()).ignore();
                    *ops += 1;
                }
                let () = p.query(&mut con).expect("big log pipeline");
                continue;
            }
            let v = run(&mut con, &a);
            *ops += 1;
            assert!(matches!(v, Value::Array(_)), "{key}: {v:?}");
            // One limited call per key now and then (writes nothing).
            if a[0] != "CL.THROTTLE" && round % 5 == 4 {
                a.extend(["COST", "1000000000"]);
                run(&mut con, &a);
                *ops += 1;
            }
        }
        // Distinct instants between rounds (token-bucket refills, GCRA instants, log entries).
        run(&mut con, &["RL.DEBUG", "CLOCK", "ADVANCE", "37123"]);
    }
    let now = clock_get(&mut con);
    pin_clock(c, now);
    specs
}

/// Moves exactly one slot holding every algorithm's state to another primary with
/// CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE … KEYS … and SETSLOT NODE: on the new owner every
/// key's DUMP is byte-identical, its expiry the same instant (MIGRATE sends the remaining TTL, so
/// the absolute expiry may move later by the migration's latency: checked ≤ 50 ms, printed),
/// RL.INFO and the next decision identical; the new owner's replica holds the same; the old
/// owner no longer has the keys and redirects.
#[test]
fn reshard_moves_state_and_expiry_exactly() {
    let c = Cluster::start(3, 1);
    let t0 = now_us() / 1000 * 1000;
    pin_clock(&c, t0);
    let tag = "rs";
    let probe = format!("{{{tag}}}:x");
    let slot = keyslot(&mut c.nodes[0].conn(), &probe);
    let src = c.primary_for_key(probe.as_bytes());
    let dst = c.current_primaries().into_iter().find(|p| p.port != src.port).unwrap();
    let mut ops = 0u64;
    let mut keys = build_slot_keys(&c, src, tag, &mut ops);
    let mut sc = src.conn();
    // A key left by redis-cell (a string holding the arrival time in ns): migrates as a string
    // and is taken over by CL.THROTTLE on the new owner.
    let cell = format!("{{{tag}}}:cell");
    let now_ns = clock_get(&mut sc) * 1000;
    let set = common::redis_cell_set(&cell, now_ns + 2_000_000_000, now_ns);
    run(&mut sc, &set.iter().map(String::as_str).collect::<Vec<_>>());
    keys.push((cell.clone(), vec![]));

    // Record the source's view.
    let mut before = Vec::new();
    for (key, args) in &keys {
        let d = payload(&mut sc, key);
        let exp = pexpiretime(&mut sc, key);
        assert!(exp > 0, "{key} has no expiry");
        let (info, dry) = if args.is_empty() {
            (RlInfo(Vec::new()), Value::Nil)
        } else {
            let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
            if a[0] != "CL.THROTTLE" {
                a.push("DRYRUN");
            } else {
                a.push("0"); // quantity 0 peeks
            }
            ops += 2;
            (state_info(&mut sc, key), run(&mut sc, &a))
        };
        before.push((d, exp, info, dry));
    }
    let src_keys_before = match run(&mut sc, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]) {
        Value::Int(n) => n as usize,
        v => panic!("{v:?}"),
    };
    assert_eq!(src_keys_before, keys.len(), "keys in slot {slot}");

    let moved = migrate_slot(&c, slot, src, dst, 100, Duration::ZERO);
    assert_eq!(moved, keys.len());

    // The new owner holds identical bytes and the same expiry; the old one nothing.
    let mut dc = dst.conn();
    let mut drift = Vec::new();
    for ((key, args), (d, exp, info, dry)) in keys.iter().zip(&before) {
        assert_eq!(&payload(&mut dc, key), d, "{key}: DUMP differs after the reshard");
        let e2 = pexpiretime(&mut dc, key);
        assert!((0..=50).contains(&(e2 - exp)), "{key}: expiry {exp} became {e2}");
        drift.push(e2 - exp);
        if !args.is_empty() {
            assert_eq!(&state_info(&mut dc, key), info, "{key}: RL.INFO differs after the reshard");
            let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
            a.push(if a[0] != "CL.THROTTLE" { "DRYRUN" } else { "0" });
            assert_eq!(&run(&mut dc, &a), dry, "{key}: the next decision differs after the reshard");
            ops += 2;
        }
        let e = try_run(&mut sc, &["EXISTS", key]).expect_err("the old owner must redirect");
        assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::Moved), "{key} on the old owner: {}", err_text(&e));
    }
    assert_eq!(
        run(&mut sc, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]),
        Value::Int(0),
        "keys of slot {slot} left on the old owner"
    );
    // The new owner's replica got the keys with the new owner's absolute expiry.
    let drep = replica_of(&c, dst);
    common::wait_replica_synced(dst, drep);
    let mut rc = drep.conn();
    run(&mut rc, &["READONLY"]);
    for (key, _) in &keys {
        assert_eq!(payload(&mut rc, key), payload(&mut dc, key), "{key}: replica of the new owner");
        assert_eq!(pexpiretime(&mut rc, key), pexpiretime(&mut dc, key), "{key}: replica expiry");
    }

    // Commands keep working through a cluster client (MOVED followed) and on the old owner
    // they are redirected.
    let e = try_run(&mut sc, &["RL.GCRA", &keys[0].0, "5", "1m", "BURST", "20"]).expect_err("old owner");
    assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::Moved), "{}", err_text(&e));
    let mut cc = cluster_conn(&c);
    for (key, args) in &keys {
        if args.is_empty() {
            // The redis-cell string is taken over by the first admitted CL.THROTTLE.
            let v = CellReply::of(&run(&mut cc, &["CL.THROTTLE", key, "19", "5", "60"]));
            assert_eq!(v.limited, 0, "CL.THROTTLE on the migrated redis-cell key: {v:?}");
            assert_eq!(text(&run(&mut dc, &["TYPE", key])), "ratelimit");
        } else {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            run(&mut cc, &a);
        }
        ops += 1;
    }
    let identical = drift.iter().filter(|d| **d == 0).count();
    let crashed = crashes(&c);
    Figures {
        name: "reshard",
        ops,
        keys: keys.len(),
        faults: 1,
        crashes: crashed,
        over: 0,
        extra: format!(
            ", slot {slot} {}→{}, DUMP identical {}/{}, PEXPIRETIME identical {identical}/{} (max drift {} ms)",
            src.port,
            dst.port,
            keys.len(),
            keys.len(),
            keys.len(),
            drift.iter().max().unwrap()
        ),
    }
    .print();
}

// ---------------------------------------------------------------------------------------------
// 3. Manual failover
// ---------------------------------------------------------------------------------------------

/// Sends `keys`' commands round-robin from `threads` cluster clients until `finish`, which
/// returns the units admitted per key, the ops sent and the errors seen.
struct Hammer {
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<String>>>,
    admitted: Arc<Mutex<BTreeMap<String, u64>>>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Hammer {
    fn start(c: &Cluster, keys: &[(String, Vec<String>)], threads: usize) -> Hammer {
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let admitted = Arc::new(Mutex::new(keys.iter().map(|(k, _)| (k.clone(), 0u64)).collect::<BTreeMap<_, _>>()));
        let handles = (0..threads)
            .map(|t| {
                let (stop, ops, errors, admitted) = (stop.clone(), ops.clone(), errors.clone(), admitted.clone());
                let keys = keys.to_vec();
                let mut cc = cluster_conn(c);
                std::thread::spawn(move || {
                    let mut i = t;
                    let mut local: BTreeMap<String, u64> = BTreeMap::new();
                    while !stop.load(Ordering::Relaxed) {
                        let (key, args) = &keys[i % keys.len()];
                        i += 1;
                        let a: Vec<&str> = args.iter().map(String::as_str).collect();
                        ops.fetch_add(1, Ordering::Relaxed);
                        match try_run(&mut cc, &a) {
                            Ok(v) => {
                                let got = if a[0] == "CL.THROTTLE" {
                                    (CellReply::of(&v).limited == 0) as u64
                                } else {
                                    LimiterReply::of(&v).allowed as u64
                                };
                                *local.entry(key.clone()).or_default() += got;
                            }
                            Err(e) => {
                                errors.lock().unwrap().push(format!("{}: {}", a.join(" "), err_text(&e)));
                                sleep(Duration::from_millis(5));
                            }
                        }
                    }
                    let mut all = admitted.lock().unwrap();
                    for (k, n) in local {
                        *all.get_mut(&k).unwrap() += n;
                    }
                })
            })
            .collect();
        Hammer { stop, ops, errors, admitted, handles }
    }

    fn finish(self) -> (BTreeMap<String, u64>, u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles {
            h.join().expect("hammer thread panicked");
        }
        let admitted = self.admitted.lock().unwrap().clone();
        let errors = self.errors.lock().unwrap().clone();
        (admitted, self.ops.load(Ordering::Relaxed), errors)
    }
}

/// Keys of every algorithm on one primary; after WAIT the replica holds them; CLUSTER FAILOVER on
/// the replica; once the roles have swapped the new primary holds byte-identical DUMPs and the
/// same absolute expiries, makes the same next decisions, and keeps limiting. Meanwhile cluster
/// clients hammer capped keys on the same primary (module clocks pinned, so nothing refills):
/// the total admitted across the failover never exceeds the capacity.
#[test]
fn manual_failover_keeps_exact_state() {
    let c = Cluster::start(3, 1);
    let t0 = now_us() / 1000 * 1000;
    pin_clock(&c, t0);
    let tag = "fo";
    let probe = format!("{{{tag}}}:x");
    let old = c.primary_for_key(probe.as_bytes());
    let new = replica_of(&c, old);
    let mut ops = 0u64;
    let mut keys = build_slot_keys(&c, old, tag, &mut ops);
    let mut pc = old.conn();
    // Untagged keys on the same primary, one per algorithm, in other slots.
    let mut i = 0;
    for l in LIMITERS {
        let key = loop {
            let k = format!("fo:{}:{i}", l.algo);
            i += 1;
            if c.primary_for_key(k.as_bytes()).port == old.port {
                break k;
            }
        };
        let a: Vec<String> = limiter_args(l, &key).iter().map(|s| s.to_string()).collect();
        let ar: Vec<&str> = a.iter().map(String::as_str).collect();
        for _ in 0..3 {
            run(&mut pc, &ar);
            ops += 1;
        }
        keys.push((key, a));
    }
    let acked = run(&mut pc, &["WAIT", "1", "1000"]);
    assert_eq!(acked, Value::Int(1), "WAIT: the replica did not acknowledge");
    let mut before = Vec::new();
    let mut rc = new.conn();
    run(&mut rc, &["READONLY"]);
    for (key, args) in &keys {
        let d = payload(&mut pc, key);
        let e = pexpiretime(&mut pc, key);
        assert_eq!(payload(&mut rc, key), d, "{key}: replica before the failover");
        assert_eq!(pexpiretime(&mut rc, key), e, "{key}: replica expiry before the failover");
        let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
        a.push(if a[0] != "CL.THROTTLE" { "DRYRUN" } else { "0" });
        before.push((d, e, state_info(&mut pc, key), run(&mut pc, &a)));
        ops += 2;
    }

    // Capped keys hammered through the failover (clock pinned: capacity is the exact bound).
    let hot: Vec<(String, Vec<String>, u64)> = vec![
        ("RL.SLIDINGLOG", vec!["40", "1h"], 40),
        ("RL.GCRA", vec!["1", "1h", "BURST", "30"], 30),
        ("RL.TOKENBUCKET", vec!["1", "1h", "BURST", "30"], 30),
        ("RL.LEAKY", vec!["1", "1h", "BURST", "30"], 30),
        ("RL.FIXED", vec!["25", "1h"], 25),
        ("RL.SLIDING", vec!["25", "1h"], 25),
        ("CL.THROTTLE", vec!["29", "1", "3600"], 30),
    ]
    .into_iter()
    .map(|(cmd, rest, cap)| {
        let key = format!("{{{tag}}}:hot:{}", cmd.to_lowercase());
        let mut a = vec![cmd.to_string(), key.clone()];
        a.extend(rest.into_iter().map(str::to_string));
        (key, a, cap)
    })
    .collect();
    let hot_keys: Vec<(String, Vec<String>)> = hot.iter().map(|(k, a, _)| (k.clone(), a.clone())).collect();
    let hammer = Hammer::start(&c, &hot_keys, 3);
    sleep(Duration::from_millis(100));

    wait_link(new, old);
    wait_link(old, new);
    wait_known_replica(&c, old, new);
    // A manual failover gives up after 5 s (CLUSTER_MF_TIMEOUT) if the replica cannot catch
    // up in time, e.g. on a loaded machine; nothing changes then, and it is asked again.
    let t_fo = Instant::now();
    let mut attempts = 0;
    'failover: loop {
        attempts += 1;
        run(&mut rc, &["CLUSTER", "FAILOVER"]);
        let deadline = Instant::now() + Duration::from_secs(7);
        while Instant::now() < deadline {
            if role(new) == "master" && role(old) == "slave" {
                break 'failover;
            }
            sleep(Duration::from_millis(20));
        }
        let tail: Vec<String> = new.log().lines().rev().take(15).map(str::to_string).collect();
        let ptail: Vec<String> = old.log().lines().rev().take(10).map(str::to_string).collect();
        eprintln!("old primary log (newest first):\n{}", ptail.join("\n"));
        let votes: Vec<String> = c
            .nodes
            .iter()
            .flat_map(|n| {
                n.log()
                    .lines()
                    .filter(|l| l.contains("ailover auth"))
                    .map(|l| format!("{}: {l}", n.port))
                    .collect::<Vec<_>>()
            })
            .collect();
        eprintln!(
            "failover attempt {attempts}: roles did not swap within 7 s; replica log (newest first):\n{}\nvotes:\n{}",
            tail.join("\n"),
            votes.join("\n")
        );
        assert!(
            attempts < 3,
            "roles did not swap after {attempts} CLUSTER FAILOVER: {} is {}, {} is {}",
            new.port,
            role(new),
            old.port,
            role(old)
        );
    }
    let swap_ms = t_fo.elapsed().as_millis();
    c.wait_ok(Duration::from_secs(20));
    sleep(Duration::from_millis(200));
    let (admitted, hammer_ops, errors) = hammer.finish();
    ops += hammer_ops;
    assert_eq!(c.primary_for_key(probe.as_bytes()).port, new.port, "slot not served by the promoted replica");

    // Identical state on the new primary (and on the demoted old one, now its replica).
    let mut nc = new.conn();
    common::wait_replica_synced(new, old);
    let mut oc = old.conn();
    run(&mut oc, &["READONLY"]);
    for ((key, args), (d, e, info, dry)) in keys.iter().zip(&before) {
        assert_eq!(&payload(&mut nc, key), d, "{key}: DUMP differs on the new primary");
        assert_eq!(pexpiretime(&mut nc, key), *e, "{key}: expiry differs on the new primary");
        assert_eq!(&payload(&mut oc, key), d, "{key}: DUMP differs on the demoted primary");
        assert_eq!(&state_info(&mut nc, key), info, "{key}: RL.INFO differs on the new primary");
        let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
        a.push(if a[0] != "CL.THROTTLE" { "DRYRUN" } else { "0" });
        assert_eq!(&run(&mut nc, &a), dry, "{key}: next decision differs on the new primary");
        ops += 2;
    }
    // Commands keep working there, through a cluster client; the demoted node redirects.
    let mut cc = cluster_conn(&c);
    for (key, args) in &keys {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let v = run(&mut cc, &a);
        assert!(matches!(v, Value::Array(_)), "{key}: {v:?}");
        ops += 1;
    }
    let e = try_run(&mut oc, &["RL.GCRA", &keys[0].0, "5", "1m", "BURST", "20"]).expect_err("demoted primary");
    assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::Moved), "{}", err_text(&e));
    // Capped keys: never more than the capacity in total, and the new primary's state agrees.
    let mut over = 0;
    let mut summary = Vec::new();
    for (key, args, cap) in &hot {
        let got = admitted[key];
        summary.push(format!("{}={got}/{cap}", args[0].to_lowercase()));
        if got > *cap {
            eprintln!("OVER-ADMISSION on {key}: {got} admitted, capacity {cap}");
            over += got - cap;
        }
        assert_eq!(got, *cap, "{key}: the hammer should have used the whole capacity");
    }
    let log_units = state_info(&mut nc, &hot[0].0).int("units") as u64;
    assert_eq!(log_units, admitted[&hot[0].0], "sliding log on the new primary remembers every admitted unit");
    let crashed = crashes(&c);
    Figures {
        name: "failover",
        ops,
        keys: keys.len() + hot.len(),
        faults: 1,
        crashes: crashed,
        over,
        extra: format!(
            ", roles swapped in {swap_ms} ms ({attempts} CLUSTER FAILOVER), DUMP+PEXPIRETIME identical {}/{}, client errors {} {:?}, admitted {}",
            keys.len(),
            keys.len(),
            errors.len(),
            errors.iter().take(3).collect::<Vec<_>>(),
            summary.join(" ")
        ),
    }
    .print();
}

// ---------------------------------------------------------------------------------------------
// 4. Load across reshards
// ---------------------------------------------------------------------------------------------

/// Cluster clients hammer one slot's keys (every algorithm, the module on the real clock) while
/// that slot migrates twice, one key per MIGRATE with pauses so that clients also take the ASK
/// path. Admitted units never exceed what each limit allows over the elapsed real time, and the
/// final owner's sliding log holds exactly the units the clients were granted.
#[test]
fn load_across_reshards_never_over_admits() {
    let c = Cluster::start(3, 1);
    let tag = "hot";
    let probe = format!("{{{tag}}}:x");
    let slot = keyslot(&mut c.nodes[0].conn(), &probe);
    // (command, arguments after the key); the bound each may admit is computed below.
    let specs: Vec<(&str, Vec<&str>)> = vec![
        ("RL.SLIDINGLOG", vec!["50", "60s"]),
        ("RL.GCRA", vec!["5", "1s", "BURST", "20"]),
        ("RL.TOKENBUCKET", vec!["5", "1s", "BURST", "20"]),
        ("RL.LEAKY", vec!["5", "1s", "BURST", "20"]),
        ("CL.THROTTLE", vec!["19", "5", "1"]),
        ("RL.FIXED", vec!["30", "1h"]),
        ("RL.SLIDING", vec!["30", "1h"]),
    ];
    let keys: Vec<(String, Vec<String>)> = specs
        .iter()
        .map(|(cmd, rest)| {
            let key = format!("{{{tag}}}:{}", cmd.to_lowercase());
            let mut a = vec![cmd.to_string(), key.clone()];
            a.extend(rest.iter().map(|s| s.to_string()));
            (key, a)
        })
        .collect();

    let primaries: Vec<&Server> = c.current_primaries();
    let a = c.primary_for_key(probe.as_bytes());
    let others: Vec<&Server> = primaries.iter().copied().filter(|p| p.port != a.port).collect();
    let (b, d) = (others[0], others[1]);
    let stats_before: Vec<u64> = [a, b, d].iter().map(|n| calls(n, "rl.slidinglog")).collect();

    let t_start_us = now_us();
    let t_start = Instant::now();
    let hammer = Hammer::start(&c, &keys, 4);
    sleep(Duration::from_millis(300));
    let moved1 = migrate_slot(&c, slot, a, b, 1, Duration::from_millis(40));
    sleep(Duration::from_millis(300));
    let moved2 = migrate_slot(&c, slot, b, d, 1, Duration::from_millis(40));
    sleep(Duration::from_millis(300));
    let (admitted, ops, errors) = hammer.finish();
    let elapsed = t_start.elapsed();
    let t_end_us = now_us();

    let secs = elapsed.as_secs_f64();
    let hours_touched = |w_us: i64| ((t_end_us / w_us) - (t_start_us / w_us) + 1) as u64;
    let mut over = 0;
    let mut summary = Vec::new();
    for (key, args) in &keys {
        let got = admitted[key];
        let bound = match args[0].as_str() {
            "RL.SLIDINGLOG" => 50,
            // BURST at once, then 5 per second: over [start, end] at most 20 + 5 × elapsed.
            "RL.GCRA" | "RL.TOKENBUCKET" | "RL.LEAKY" | "CL.THROTTLE" => 20 + (5.0 * secs).ceil() as u64,
            // 30 per window, per window touched by the run.
            "RL.FIXED" | "RL.SLIDING" => 30 * hours_touched(3_600_000_000),
            other => unreachable!("{other}"),
        };
        summary.push(format!("{}={got}/{bound}", args[0].to_lowercase()));
        if got > bound {
            eprintln!("OVER-ADMISSION on {key}: {got} admitted, at most {bound} allowed in {secs:.3} s");
            over += got - bound;
        }
        assert!(got > 0, "{key}: nothing admitted");
    }
    assert_eq!(admitted[&keys[0].0], 50, "the sliding log admits exactly its limit in a 60 s window");
    // The final owner's state accounts for every admitted unit.
    let mut dc = d.conn();
    let info = state_info(&mut dc, &keys[0].0);
    assert_eq!(info.int("units"), 50, "sliding log on the final owner: {info:?}");
    if hours_touched(3_600_000_000) == 1 {
        let fixed = state_info(&mut dc, "{hot}:rl.fixed");
        assert_eq!(fixed.int("count") as u64, admitted["{hot}:rl.fixed"], "fixed window count");
    }
    // All three owners served checks; clients followed ASK (during migration) and MOVED.
    let stats_after: Vec<u64> = [a, b, d].iter().map(|n| calls(n, "rl.slidinglog")).collect();
    for (i, n) in [a, b, d].iter().enumerate() {
        assert!(stats_after[i] > stats_before[i], "node {} never served the slot", n.port);
    }
    let asking: u64 = [b, d].iter().map(|n| calls(n, "asking")).sum();
    assert!(errors.is_empty(), "client errors across the reshards: {:?}", &errors[..errors.len().min(5)]);
    let crashed = crashes(&c);
    Figures {
        name: "load-across-reshards",
        ops,
        keys: keys.len(),
        faults: 2,
        crashes: crashed,
        over,
        extra: format!(
            ", {:.2} s, keys moved {}+{}, ASK redirects followed {asking}, client errors {}, admitted/bound {}",
            secs,
            moved1,
            moved2,
            errors.len(),
            summary.join(" ")
        ),
    }
    .print();
}

/// `calls=` of `cmdstat_<name>` in INFO commandstats (0 when absent).
fn calls(n: &Server, name: &str) -> u64 {
    let info = n.info("commandstats");
    let prefix = format!("cmdstat_{name}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// `count=` of `errorstat_<code>` in INFO errorstats (0 when absent).
fn errorstat(n: &Server, code: &str) -> u64 {
    let info = n.info("errorstats");
    let prefix = format!("errorstat_{code}:count=");
    info.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}
