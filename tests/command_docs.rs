//! Command metadata: every command registers its documentation and key specs with
//! RedisModule_SetCommandInfo, so COMMAND DOCS, COMMAND INFO, COMMAND GETKEYS and redis-cli's
//! hints describe it like a built-in command.

mod common;

use common::Server;
use redis::Value;

/// A reply as text, flattened: enough to find names, tokens and flags in it.
fn words(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => out.push(s.clone()),
        Value::Int(i) => out.push(i.to_string()),
        Value::Array(a) | Value::Set(a) => a.iter().for_each(|x| words(x, out)),
        Value::Map(m) => m.iter().for_each(|(k, x)| {
            words(k, out);
            words(x, out)
        }),
        _ => {}
    }
}

fn flat(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    words(v, &mut out);
    out
}

/// The value that follows `key` in a flat field/value listing.
fn after<'a>(w: &'a [String], key: &str) -> Option<&'a str> {
    w.iter().position(|x| x == key).and_then(|i| w.get(i + 1)).map(|s| s.as_str())
}

const LIMITERS: [&str; 6] = ["rl.gcra", "rl.tokenbucket", "rl.leaky", "rl.sliding", "rl.fixed", "rl.slidinglog"];

#[test]
fn command_docs_describe_every_command() {
    let server = Server::start();
    let mut c = server.conn();
    let all = ["rl.multi", "rl.info", "rl.reset", "cl.throttle", "rl.setstate", "rl.debug", "rl.return"];
    for name in LIMITERS.iter().chain(all.iter()) {
        let docs: Value = redis::cmd("COMMAND").arg("DOCS").arg(*name).query(&mut c).unwrap();
        let w = flat(&docs);
        assert!(!w.is_empty(), "COMMAND DOCS {name}: empty");
        assert!(after(&w, "summary").is_some_and(|s| s.len() > 10), "{name}: no summary in {w:?}");
        assert_eq!(after(&w, "since"), Some("0.1.0"), "{name}");
        assert!(after(&w, "complexity").is_some_and(|s| s.starts_with("O(")), "{name}: {w:?}");
        assert!(w.windows(2).any(|p| p[0] == "module" && p[1] == "ratelimit"), "{name}: {w:?}");
        assert!(w.iter().any(|x| x == "arguments"), "{name}: no arguments");
    }
    for name in LIMITERS {
        let w = flat(&redis::cmd("COMMAND").arg("DOCS").arg(name).query::<Value>(&mut c).unwrap());
        for token in ["COST", "DRYRUN", "PARTIAL"] {
            assert!(w.iter().any(|x| x == token), "{name}: no {token} token in {w:?}");
        }
        let has_burst = w.iter().any(|x| x == "BURST");
        assert_eq!(has_burst, ["rl.gcra", "rl.tokenbucket", "rl.leaky"].contains(&name), "{name}: BURST");
        assert!(w.iter().any(|x| x == "pure-token"), "{name}: DRYRUN is a pure token");
        assert!(w.iter().any(|x| x == "optional"), "{name}: optional arguments");
    }
    let w = flat(&redis::cmd("COMMAND").arg("DOCS").arg("rl.return").query::<Value>(&mut c).unwrap());
    for token in ["n", "AGE", "optional"] {
        assert!(w.iter().any(|x| x == token), "RL.RETURN docs lack {token}: {w:?}");
    }
    let w = flat(&redis::cmd("COMMAND").arg("DOCS").arg("rl.multi").query::<Value>(&mut c).unwrap());
    for token in
        ["GCRA", "TOKENBUCKET", "LEAKY", "SLIDING", "FIXED", "SLIDINGLOG", "numkeys", "oneof", "block", "multiple"]
    {
        assert!(w.iter().any(|x| x == token), "RL.MULTI docs lack {token}: {w:?}");
    }
}

#[test]
fn command_info_has_arity_flags_and_key_specs() {
    let server = Server::start();
    let mut c = server.conn();
    let info = |c: &mut redis::Connection, name: &str| -> Vec<String> {
        flat(&redis::cmd("COMMAND").arg("INFO").arg(name).query::<Value>(c).unwrap())
    };
    for name in LIMITERS.iter().chain(["cl.throttle"].iter()) {
        let w = info(&mut c, name);
        assert_eq!(w[0], *name, "{w:?}");
        assert_eq!(w[1], if *name == "cl.throttle" { "-5" } else { "-4" }, "{name} arity");
        for flag in ["write", "denyoom", "fast"] {
            assert!(w.iter().any(|x| x == flag), "{name}: no {flag} flag in {w:?}");
        }
        // Key spec: read-write access + update.
        for spec_flag in ["RW", "access", "update"] {
            assert!(w.iter().any(|x| x == spec_flag), "{name}: key spec lacks {spec_flag}: {w:?}");
        }
    }
    let w = info(&mut c, "rl.info");
    assert_eq!(w[1], "2");
    assert!(w.iter().any(|x| x == "readonly") && !w.iter().any(|x| x == "write"), "RL.INFO flags: {w:?}");
    assert!(w.iter().any(|x| x == "RO") && !w.iter().any(|x| x == "RW"), "RL.INFO key spec: {w:?}");
    let w = info(&mut c, "rl.reset");
    assert!(w.iter().any(|x| x == "delete"), "RL.RESET key spec: {w:?}");
    let w = info(&mut c, "rl.multi");
    assert!(w.iter().any(|x| x == "movablekeys") && w.iter().any(|x| x == "keynum"), "RL.MULTI: {w:?}");
    let w = info(&mut c, "rl.return");
    assert_eq!(w[1], "-3", "RL.RETURN arity: {w:?}");
    for flag in ["write", "denyoom", "fast", "RW", "access", "update"] {
        assert!(w.iter().any(|x| x == flag), "RL.RETURN: no {flag} in {w:?}");
    }
    let keys: Vec<String> =
        redis::cmd("COMMAND").arg(&["GETKEYS", "rl.return", "rk", "3", "AGE", "10"]).query(&mut c).unwrap();
    assert_eq!(keys, ["rk"]);
    // RL.SETSTATE: read-write (a sliding-log commit applies to the stored log) and update, but
    // no access: it returns nothing of the key, so write permission on it is enough.
    let w = info(&mut c, "rl.setstate");
    assert_eq!(w[1], "-3", "RL.SETSTATE arity: {w:?}");
    for flag in ["RW", "update"] {
        assert!(w.iter().any(|x| x == flag), "RL.SETSTATE key spec lacks {flag}: {w:?}");
    }
    for flag in ["access", "OW", "RO"] {
        assert!(!w.iter().any(|x| x == flag), "RL.SETSTATE key spec has {flag}: {w:?}");
    }
    let w = info(&mut c, "rl.debug");
    assert!(!w.iter().any(|x| x == "begin_search"), "RL.DEBUG declares no key: {w:?}");

    // The key specs are what Redis uses to find keys (ACLs, cluster routing).
    for name in LIMITERS {
        let keys: Vec<String> =
            redis::cmd("COMMAND").arg("GETKEYS").arg(name).arg("k1").arg("10").arg("1s").query(&mut c).unwrap();
        assert_eq!(keys, ["k1"], "{name}");
    }
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg(&["GETKEYS", "rl.multi", "3", "a", "b", "c", "GCRA", "1", "1", "FIXED", "1", "1", "SLIDINGLOG", "1", "1"])
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["a", "b", "c"]);
    let keys: Vec<String> =
        redis::cmd("COMMAND").arg(&["GETKEYS", "cl.throttle", "ck", "1", "2", "3"]).query(&mut c).unwrap();
    assert_eq!(keys, ["ck"]);
    // Redis itself enforces the declared arity, with its usual message.
    let err = redis::cmd("RL.GCRA").arg("k").query::<Value>(&mut c).unwrap_err();
    assert!(err.to_string().contains("wrong number of arguments for 'rl.gcra' command"), "{err}");
}
