//! Smoke tests for the test harness in tests/common: servers start with the
//! module loaded, restart/kill9 keep data as configured, replicas sync, and a
//! small cluster comes up.

mod common;

use common::{raw_cmd, wait_replica_synced, Cluster, Opts, Server};
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
fn module_without_debug_clock() {
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
    let v: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("hz").query(&mut con).unwrap();
    assert_eq!(v[1], "50");
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
fn replica_syncs_plain_key() {
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
fn cluster_3_primaries_3_replicas() {
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
