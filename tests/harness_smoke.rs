//! Smoke tests for the test harness in tests/common: servers start with the
//! module loaded, restart/kill9 keep data as configured, replicas sync, a
//! small cluster comes up, and replies decode by field name.

mod common;

use common::{
    raw_cmd, wait_replica_synced, Cluster, LimiterReply, MultiReply, Opts, RlInfo, Rng, Server, LIMITER_FIELDS,
};
use redis::Value;
use std::time::{Duration, Instant};

fn bulk(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// MODULE LIST as a list of (name, args) pairs.
fn module_list(server: &Server) -> Vec<(String, Vec<String>)> {
    let mut con = server.conn();
    let v: Value = redis::cmd("MODULE").arg("LIST").query(&mut con).unwrap();
    let Value::Array(mods) = v else { panic!("MODULE LIST: unexpected reply {v:?}") };
    mods.iter()
        .map(|m| {
            let Value::Array(fields) = m else { panic!("MODULE LIST entry {m:?}") };
            let mut name = String::new();
            let mut args = Vec::new();
            for kv in fields.chunks(2) {
                match bulk(&kv[0]).as_deref() {
                    Some("name") => name = bulk(&kv[1]).unwrap_or_default(),
                    Some("args") => {
                        if let Value::Array(a) = &kv[1] {
                            args = a.iter().filter_map(bulk).collect();
                        }
                    }
                    _ => {}
                }
            }
            (name, args)
        })
        .collect()
}

#[test]
fn module_is_loaded_with_debug_clock() {
    let s = Server::start();
    let mods = module_list(&s);
    let rl = mods
        .iter()
        .find(|(n, _)| n == "ratelimit")
        .unwrap_or_else(|| panic!("no module named ratelimit in MODULE LIST: {mods:?}\n{}", s.log()));
    assert_eq!(rl.1, vec!["DEBUG_CLOCK".to_string()], "module args");
    assert!(s.alive());
    assert!(s.dir.is_dir());
    assert!(s.url().contains(&s.port.to_string()));
}

#[test]
fn module_loads_without_debug_clock_when_asked() {
    let s = Server::start_with(Opts { debug_clock: false, ..Default::default() });
    let mods = module_list(&s);
    let rl = mods.iter().find(|(n, _)| n == "ratelimit").expect("ratelimit module");
    assert!(rl.1.is_empty(), "expected no module args, got {:?}", rl.1);
}

#[test]
fn extra_directives_are_applied() {
    let s = Server::start_with(Opts {
        extra: vec![("maxmemory".into(), "10mb".into()), ("hz".into(), "50".into())],
        ..Default::default()
    });
    let mut con = s.conn();
    let v: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("maxmemory").query(&mut con).unwrap();
    assert_eq!(v, vec!["maxmemory".to_string(), (10 * 1024 * 1024).to_string()]);
    assert_eq!(s.config_get("hz"), "50");
}

#[test]
fn restart_keeps_aof_data() {
    let mut s = Server::start_with(Opts { appendonly: true, ..Default::default() });
    let port = s.port;
    {
        let mut con = s.conn();
        let _: () = redis::cmd("SET").arg("k").arg("v1").query(&mut con).unwrap();
    }
    s.restart();
    assert_eq!(s.port, port);
    let mut con = s.conn();
    let v: Option<String> = redis::cmd("GET").arg("k").query(&mut con).unwrap();
    assert_eq!(v.as_deref(), Some("v1"), "log:\n{}", s.log());
    // The module is loaded again after the restart.
    assert!(module_list(&s).iter().any(|(n, _)| n == "ratelimit"));
}

#[test]
fn kill9_then_start_again_with_fsync_always() {
    let mut s = Server::start_with(Opts {
        appendonly: true,
        extra: vec![("appendfsync".into(), "always".into())],
        ..Default::default()
    });
    {
        let mut con = s.conn();
        let _: () = redis::cmd("SET").arg("k").arg("v2").query(&mut con).unwrap();
    }
    s.kill9();
    assert!(!s.alive());
    s.start_again();
    assert!(s.alive());
    let mut con = s.conn();
    let v: Option<String> = redis::cmd("GET").arg("k").query(&mut con).unwrap();
    assert_eq!(v.as_deref(), Some("v2"), "log:\n{}", s.log());
}

#[test]
fn replica_syncs_a_plain_key() {
    let primary = Server::start();
    let replica = Server::start_with(Opts { replica_of: Some(primary.port), ..Default::default() });
    {
        let mut con = primary.conn();
        let _: () = redis::cmd("SET").arg("rk").arg("rv").query(&mut con).unwrap();
    }
    wait_replica_synced(&primary, &replica);
    let mut con = replica.conn();
    let v: Option<String> = redis::cmd("GET").arg("rk").query(&mut con).unwrap();
    assert_eq!(v.as_deref(), Some("rv"));
}

#[test]
fn raw_cmd_sends_binary_args() {
    let s = Server::start();
    let mut con = s.conn();
    let key: &[u8] = b"bin\x00\xffkey";
    let r = raw_cmd(&mut con, &[b"SET", key, b"\x01\x02"]).unwrap();
    assert_eq!(r, Value::Okay);
    let r = raw_cmd(&mut con, &[b"GET", key]).unwrap();
    assert_eq!(r, Value::BulkString(vec![1, 2]));
    let err = raw_cmd(&mut con, &[b"NO.SUCH.COMMAND"]).unwrap_err();
    assert!(err.to_string().to_lowercase().contains("unknown command"), "{err}");
}

#[test]
fn drop_stops_server_and_removes_dir() {
    let s = Server::start();
    let (port, dir) = (s.port, s.dir.clone());
    drop(s);
    assert!(!dir.exists(), "{} still exists", dir.display());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "port {port} still open");
}

#[test]
fn startup_failure_panics_with_log() {
    let r = std::panic::catch_unwind(|| {
        Server::start_with(Opts {
            extra: vec![("maxmemory-policy".into(), "not-a-policy".into())],
            ..Default::default()
        })
    });
    let err = r.err().expect("start with a bad directive should panic");
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(msg.contains("exited during startup"), "{msg}");
    assert!(msg.contains("maxmemory-policy"), "panic message should include the server's error: {msg}");
}

/// Runs in the normal `cargo test`; takes a few seconds.
#[test]
fn cluster_of_3_primaries_and_3_replicas_comes_up() {
    let t = Instant::now();
    let c = Cluster::start(3, 1);
    let took = t.elapsed();
    eprintln!("cluster (3 primaries, 3 replicas) ready in {took:?}");
    assert_eq!(c.nodes.len(), 6);
    let mut roles = (0, 0);
    for n in &c.nodes {
        let mut con = n.conn();
        let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut con).unwrap();
        assert!(info.contains("cluster_state:ok"), "node {}:\n{info}", n.port);
        assert!(module_list(n).iter().any(|(m, _)| m == "ratelimit"));
        let repl = n.info("replication");
        if repl.contains("role:master") {
            roles.0 += 1;
        } else {
            roles.1 += 1;
        }
    }
    assert_eq!(roles, (3, 3));
    // A key written on its slot's primary is readable there.
    let p = c.primary_for_key(b"{user1}");
    let mut con = p.conn();
    let _: () = redis::cmd("SET").arg("{user1}").arg("x").query(&mut con).unwrap();
    let v: String = redis::cmd("GET").arg("{user1}").query(&mut con).unwrap();
    assert_eq!(v, "x");
    assert!(took < Duration::from_secs(30), "cluster startup took {took:?}");
}

// ---------------------------------------------------------------- replies by name (no server)

fn bulk_of(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

/// A RESP3 map of integers under the given names.
fn int_map(names: &[&str], values: &[i64]) -> Value {
    Value::Map(names.iter().zip(values).map(|(n, v)| (bulk_of(n), Value::Int(*v))).collect())
}

fn int_array(values: &[i64]) -> Value {
    Value::Array(values.iter().map(|v| Value::Int(*v)).collect())
}

#[test]
fn limiter_replies_decode_by_field_name_from_resp2_and_resp3() {
    let r = LimiterReply::of(&int_array(&[1, 5, 4, -1, 200]));
    let fields = (r.allowed, r.limit, r.remaining, r.retry_after_ms, r.reset_after_ms, r.delay_ms);
    assert_eq!(fields, (1, 5, 4, -1, 200, None));
    // A whole reply compares with its RESP2 integers, the field count included.
    assert_eq!(r, [1, 5, 4, -1, 200]);
    assert_ne!(r, [1, 5, 4, -1, 200, 0]);
    assert_eq!(r.ints(), vec![1, 5, 4, -1, 200]);
    let leaky = LimiterReply::of(&int_array(&[0, 2, 0, 1000, 4000, -1]));
    assert_eq!((leaky.retry_after_ms, leaky.delay_ms), (1000, Some(-1)));
    // RESP3: the same fields from a map, whose keys must be the field names in order.
    assert_eq!(LimiterReply::of(&int_map(&LIMITER_FIELDS, &[0, 2, 0, 1000, 4000, -1])), leaky);
    assert_eq!(LimiterReply::of(&int_map(&LIMITER_FIELDS[..5], &[1, 5, 4, -1, 200])), r);
    let swapped = ["limit", "allowed", "remaining", "retry_after_ms", "reset_after_ms"];
    assert!(LimiterReply::from_value(&int_map(&swapped, &[1, 5, 4, -1, 200])).is_err());
    // Four or seven fields, a non-integer field, another type: not a limiter reply.
    assert!(LimiterReply::from_value(&int_array(&[1, 5, 4, -1])).is_err());
    assert!(LimiterReply::from_value(&int_array(&[1, 5, 4, -1, 200, 0, 0])).is_err());
    let with_nil = Value::Array(vec![Value::Int(1), Value::Int(5), Value::Int(4), Value::Int(-1), Value::Nil]);
    assert!(LimiterReply::from_value(&with_nil).is_err());
    assert!(LimiterReply::from_value(&Value::Int(1)).is_err());
}

#[test]
fn rl_multi_and_rl_info_replies_decode_by_field_name() {
    let limits = [int_array(&[0, 1, 0, 10_000, 10_000]), int_array(&[0, 2, 1, -1, 5_000, -1])];
    let mut resp2 = vec![Value::Int(0), Value::Int(10_000)];
    resp2.extend(limits.iter().cloned());
    let m = MultiReply::of(&Value::Array(resp2));
    assert_eq!((m.allowed, m.retry_after_ms), (0, 10_000));
    assert_eq!(m.limits, [vec![0, 1, 0, 10_000, 10_000], vec![0, 2, 1, -1, 5_000, -1]]);
    let resp3 = |names: [&str; 3]| {
        Value::Map(vec![
            (bulk_of(names[0]), Value::Int(0)),
            (bulk_of(names[1]), Value::Int(10_000)),
            (bulk_of(names[2]), Value::Array(limits.to_vec())),
        ])
    };
    assert_eq!(MultiReply::of(&resp3(["allowed", "retry_after_ms", "limits"])), m);
    assert!(MultiReply::from_value(&resp3(["allowed", "retry", "limits"])).is_err());
    assert!(MultiReply::from_value(&int_array(&[1, -1])).is_err());

    let info = Value::Array(vec![bulk_of("algorithm"), bulk_of("gcra"), bulk_of("tat_us"), Value::Int(7)]);
    let info = RlInfo::of(&info).expect("not nil");
    assert_eq!(info.names(), ["algorithm", "tat_us"]);
    assert_eq!((info.algorithm().as_str(), info.int("tat_us")), ("gcra", 7));
    assert_eq!(info.get("ttl_ms"), None);
    assert_eq!(RlInfo::of(&Value::Nil), None);
}

#[test]
fn rng_is_the_same_sequence_for_the_same_seed() {
    let (mut a, mut b) = (Rng::new(42), Rng::new(42));
    let xs: Vec<u64> = (0..8).map(|_| a.next()).collect();
    assert_eq!(xs, (0..8).map(|_| b.next()).collect::<Vec<_>>());
    assert_ne!(xs[0], Rng::new(43).next());
    // xorshift64* from a raw state: the first output of state 1.
    assert_eq!(Rng(1).next(), 0x47E4_CE4B_896C_DD1D);
    assert_eq!(a.below(0), 0);
    assert!((0..1000).all(|_| (3..=9).contains(&a.range(3, 9))));
}

/// A server never outlives its test process, even one that leaves without dropping it (a
/// server in a `static`, `process::exit`, a killed test binary): tests/common spawns every
/// server to die with the process (`spawn_owned`). The test binary runs this test again as a
/// child that starts a server, prints its pid and exits at once.
#[test]
fn a_server_dies_with_its_test_process() {
    if std::env::var_os("RL_HARNESS_ORPHAN").is_some() {
        let s = Server::start();
        println!("orphan pid {} dir {}", s.pid().unwrap(), s.dir.display());
        std::process::exit(0);
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_server_dies_with_its_test_process", "--nocapture"])
        .env("RL_HARNESS_ORPHAN", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let Some((pid, dir)) = text.lines().find_map(|l| l.strip_prefix("orphan pid ")?.split_once(" dir ")) else {
        panic!("the child test printed no server: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    };
    // Gone, or a zombie (reparented to an init that may reap it late).
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let leaked = alive();
    if leaked {
        let _ = std::process::Command::new("kill").args(["-9", pid]).status();
    }
    let _ = std::fs::remove_dir_all(dir);
    assert!(!leaked, "redis-server {pid} outlived the test process that started it");
}
