//! ACLs and key declarations on a single server: key patterns confine every module command to
//! a tenant's keys (NOPERM outside, success inside), module commands are granted by name on
//! every server and by category where the server has categories for them (Redis 7.2+ / Valkey;
//! `@ratelimit` from 7.4 / Valkey 8), RL.DEBUG is refused without DEBUG_CLOCK and
//! changes nothing, and every command declares exactly the keys it touches (COMMAND GETKEYS, and
//! after running it only those keys exist).

mod common;

use common::{err_text, now_us, run, try_run, Args, CellReply, LimiterReply, Opts, Server};
use redis::{Connection, Value};
use redis_ratelimit::{acl, COMMANDS};
use redis_ratelimit_core::{codec::State, gcra, Nanos, Rate, Request, NANOS_PER_MICRO, NANOS_PER_SEC};

fn user_conn(s: &Server, user: &str, pw: &str) -> Connection {
    let client = redis::Client::open(format!("redis://{user}:{pw}@127.0.0.1:{}/", s.port)).unwrap();
    client.get_connection().unwrap_or_else(|e| panic!("AUTH as {user}: {e}"))
}

fn keys_star(con: &mut Connection) -> Vec<String> {
    let mut k: Vec<String> = redis::cmd("KEYS").arg("*").query(con).unwrap();
    k.sort();
    k
}

fn dbsize(con: &mut Connection) -> i64 {
    redis::cmd("DBSIZE").query(con).unwrap()
}

/// A valid RL.SETSTATE payload: a GCRA state (10 per 60 s) after one admitted unit now.
fn gcra_payload() -> Vec<u8> {
    let rate = Rate::new(10, Nanos::new(60 * NANOS_PER_SEC), 10).unwrap();
    let (_, state) = gcra::check(None, &rate, Nanos::new(now_us() * NANOS_PER_MICRO), Request::new(1));
    State::Gcra(state.expect("an admitted check yields a state")).encode()
}

/// A command's name, its arguments and the keys it declares.
type CommandCase = (&'static str, Vec<Vec<u8>>, Vec<String>);

/// Every key-taking module command on `key` (RL.MULTI also on `key:2`), each with valid
/// arguments. Returns (name, args, declared keys).
fn all_commands(key: &str, payload: &[u8]) -> Vec<CommandCase> {
    let k2 = format!("{key}:2");
    let pxat = (now_us() / 1000 + 60_000).to_string();
    let s = |v: &[&str]| v.iter().map(|x| x.as_bytes().to_vec()).collect::<Vec<_>>();
    let one = vec![key.to_string()];
    vec![
        ("rl.gcra", s(&["RL.GCRA", key, "10", "60s"]), one.clone()),
        ("rl.tokenbucket", s(&["RL.TOKENBUCKET", key, "10", "60s"]), one.clone()),
        ("rl.leaky", s(&["RL.LEAKY", key, "10", "60s"]), one.clone()),
        ("rl.sliding", s(&["RL.SLIDING", key, "10", "60s"]), one.clone()),
        ("rl.fixed", s(&["RL.FIXED", key, "10", "60s"]), one.clone()),
        ("rl.slidinglog", s(&["RL.SLIDINGLOG", key, "10", "60s"]), one.clone()),
        ("cl.throttle", s(&["CL.THROTTLE", key, "9", "10", "60"]), one.clone()),
        ("rl.info", s(&["RL.INFO", key]), one.clone()),
        (
            "rl.multi",
            s(&["RL.MULTI", "2", key, &k2, "GCRA", "10", "60s", "SLIDINGLOG", "10", "60s"]),
            vec![key.to_string(), k2.clone()],
        ),
        (
            "rl.setstate",
            vec![
                b"RL.SETSTATE".to_vec(),
                key.as_bytes().to_vec(),
                payload.to_vec(),
                b"PXAT".to_vec(),
                pxat.into_bytes(),
            ],
            one.clone(),
        ),
        ("rl.reset", s(&["RL.RESET", key]), one),
    ]
}

/// The newest ACL LOG entry's reason (`command`, `key`, …) and object (the command or key
/// refused): what a NOPERM was about, on every server whatever its wording.
fn last_denial(admin: &mut Connection) -> (String, String) {
    let Value::Array(entries) = run(admin, &["ACL", "LOG", "1"]) else { panic!("ACL LOG") };
    let Some(Value::Array(entry)) = entries.first() else { panic!("ACL LOG is empty") };
    let field = |name: &str| -> String {
        entry
            .chunks(2)
            .find(|kv| kv[0] == Value::BulkString(name.as_bytes().to_vec()))
            .map(|kv| match &kv[1] {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                other => format!("{other:?}"),
            })
            .unwrap_or_else(|| panic!("ACL LOG entry without {name}: {entry:?}"))
    };
    (field("reason"), field("object"))
}

fn is_noperm(r: &redis::RedisResult<Value>) -> bool {
    matches!(r, Err(e) if e.code() == Some("NOPERM"))
}

/// Runs every command as `con` on a key inside and outside the user's pattern: NOPERM outside
/// (nothing written), success inside. `denied` lists commands the user may not run at all.
fn check_tenant_user(s: &Server, con: &mut Connection, denied: &[&str]) -> usize {
    let mut admin = s.conn();
    run(&mut admin, &["FLUSHALL"]);
    let payload = gcra_payload();
    let mut checked = 0;
    for outside in ["tenantB:x", "other", "tenantA"] {
        for (name, args, _) in all_commands(outside, &payload) {
            let r = try_run(con, &args);
            assert!(is_noperm(&r), "{} outside ~tenantA:* must be NOPERM, got {r:?}", args.shown());
            // What was refused, from ACL LOG (the sentences differ between servers).
            let expected =
                if denied.contains(&name) { ("command", name.to_string()) } else { ("key", outside.to_string()) };
            assert_eq!(last_denial(&mut admin), (expected.0.to_string(), expected.1), "{}", args.shown());
            checked += 1;
        }
    }
    // RL.MULTI with one key inside and one outside: NOPERM too.
    if !denied.contains(&"rl.multi") {
        let r = try_run(
            con,
            &["RL.MULTI", "2", "tenantA:ok", "tenantB:no", "GCRA", "10", "60s", "GCRA", "10", "60s"]
                .map(|x| x.as_bytes().to_vec()),
        );
        assert!(is_noperm(&r), "RL.MULTI with a key outside the pattern: {r:?}");
        assert_eq!(last_denial(&mut admin), ("key".to_string(), "tenantB:no".to_string()));
        checked += 1;
    }
    assert_eq!(dbsize(&mut admin), 0, "a refused command wrote: {:?}", keys_star(&mut admin));

    let names: Vec<&str> = all_commands("x", &payload).iter().map(|c| c.0).collect();
    for name in names {
        // Each limiter on its own key; RL.INFO and RL.RESET on the RL.GCRA key (created first).
        let key = match name {
            "rl.info" | "rl.reset" => "tenantA:rl.gcra".to_string(),
            _ => format!("tenantA:{name}"),
        };
        let args = all_commands(&key, &payload).into_iter().find(|c| c.0 == name).unwrap().1;
        let r = try_run(con, &args);
        if denied.contains(&name) {
            assert!(is_noperm(&r), "{name} must be refused to this user: {r:?}");
            assert_eq!(last_denial(&mut admin), ("command".to_string(), name.to_string()), "{name}");
        } else {
            let v = r.unwrap_or_else(|e| panic!("{} inside ~tenantA:* failed: {}", args.shown(), err_text(&e)));
            match name {
                "rl.info" => assert!(matches!(v, Value::Array(_)), "RL.INFO: {v:?}"),
                "rl.reset" => assert_eq!(v, Value::Int(1), "RL.RESET"),
                "rl.setstate" => {
                    assert!(matches!(v, Value::Okay) || v == Value::SimpleString("OK".into()), "RL.SETSTATE: {v:?}")
                }
                _ => assert!(matches!(v, Value::Array(_)), "{name}: {v:?}"),
            }
        }
        checked += 1;
    }
    checked
}

/// `~tenantA:* +@all`: every module command is NOPERM on a key outside the pattern (and on the
/// bare `tenantA`), including RL.MULTI with a single outside key; inside, all succeed.
#[test]
fn key_patterns_confine_every_command() {
    let s = Server::start();
    let mut admin = s.conn();
    run(&mut admin, &["ACL", "SETUSER", "tenantA", "on", ">pw", "~tenantA:*", "+@all"]);
    let mut con = user_conn(&s, "tenantA", "pw");
    let n = check_tenant_user(&s, &mut con, &[]);
    println!("acl figures [tenantA +@all]: commands checked {n}");
}

/// Granting by name, which works on every server (and is the only way on Redis 7.0, where module
/// commands are in no ACL category): the application user gets the checks, RL.INFO and RL.RESET, not
/// RL.SETSTATE or RL.DEBUG.
#[test]
fn module_commands_are_granted_by_name() {
    let s = Server::start();
    let mut admin = s.conn();
    run(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "u2",
            "on",
            ">pw",
            "~tenantA:*",
            "+rl.gcra",
            "+rl.tokenbucket",
            "+rl.leaky",
            "+rl.sliding",
            "+rl.fixed",
            "+rl.slidinglog",
            "+rl.multi",
            "+cl.throttle",
            "+rl.info",
            "+rl.reset",
        ],
    );
    let mut con = user_conn(&s, "u2", "pw");
    let n = check_tenant_user(&s, &mut con, &["rl.setstate"]);
    let r = try_run(&mut con, &["RL.DEBUG", "CLOCK", "GET"].map(|x| x.as_bytes().to_vec()));
    assert!(is_noperm(&r), "RL.DEBUG not granted: {r:?}");

    // The same user written as "everything except the internal commands".
    run(&mut admin, &["ACL", "SETUSER", "app", "on", ">pw", "~tenantA:*", "+@all", "-rl.setstate", "-rl.debug"]);
    let mut app = user_conn(&s, "app", "pw");
    let n2 = check_tenant_user(&s, &mut app, &["rl.setstate"]);
    let r = try_run(&mut app, &["RL.DEBUG", "CLOCK", "SET", "0"].map(|x| x.as_bytes().to_vec()));
    assert!(is_noperm(&r), "-rl.debug: {r:?}");

    println!("acl figures [granted by name, {}]: commands checked {}", s.version().describe(), n + n2);
}

/// The module commands in `category`, from each command's COMMAND INFO categories (the
/// server's own view; Redis 7.2's ACL CAT leaves module commands out).
fn acl_cat(con: &mut Connection, category: &str) -> Vec<String> {
    let want = Value::SimpleString(format!("@{category}"));
    let want_bulk = Value::BulkString(format!("@{category}").into_bytes());
    let mut v: Vec<String> = COMMANDS
        .iter()
        .map(|c| c.name.to_str().unwrap().to_string())
        .filter(|name| {
            let Value::Array(entries) = run(con, &["COMMAND", "INFO", name]) else { panic!("COMMAND INFO {name}") };
            let Some(Value::Array(entry)) = entries.first() else { panic!("COMMAND INFO {name}: {entries:?}") };
            let Some(Value::Array(categories)) = entry.get(6) else {
                panic!("COMMAND INFO {name} without categories: {entry:?}")
            };
            categories.contains(&want) || categories.contains(&want_bulk)
        })
        .collect();
    v.sort();
    v
}

/// The module commands the command table (src/commands.rs) puts in `category` (on a server
/// that has it).
fn expected_in(category: &str) -> Vec<String> {
    let mut v: Vec<String> = COMMANDS
        .iter()
        .filter(|c| c.acl.builtin.split(' ').any(|b| b == category) || (category == acl::CATEGORY && c.acl.ratelimit))
        .map(|c| c.name.to_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// ACL categories on whatever server runs the tests: on Redis 7.0 module commands are in no
/// category (and `@ratelimit` does not exist); from 7.2 / Valkey each command is in the built-in
/// categories of src/acl.rs; from 7.4 / Valkey 8 `+@ratelimit` grants exactly the application
/// commands and `-@ratelimit` removes them. RL.SETSTATE and RL.DEBUG are never in `@ratelimit`
/// nor `@fast`, and are in `@dangerous` wherever categories exist.
#[test]
fn acl_categories_where_the_server_has_them() {
    let s = Server::start();
    let v = s.version();
    let mut admin = s.conn();

    // Every module command has a row in the table (a new command without one fails here).
    let mut listed: Vec<String> =
        redis::cmd("COMMAND").arg("LIST").arg("FILTERBY").arg("MODULE").arg("ratelimit").query(&mut admin).unwrap();
    listed.sort();
    let mut rows: Vec<String> = COMMANDS.iter().map(|c| c.name.to_str().unwrap().to_string()).collect();
    rows.sort();
    assert_eq!(listed, rows, "the command table (src/commands.rs) must list every module command");

    let all_cats: Vec<String> = redis::cmd("ACL").arg("CAT").query(&mut admin).unwrap();
    assert_eq!(
        all_cats.iter().any(|c| c == "ratelimit"),
        v.has_module_acl_category(),
        "@ratelimit on {}",
        v.describe()
    );
    let app_commands = expected_in(acl::CATEGORY);
    for internal in ["rl.setstate", "rl.debug"] {
        assert!(!app_commands.iter().any(|c| c == internal), "{internal} must not be an application command");
    }

    run(&mut admin, &["ACL", "SETUSER", "cats", "on", ">pw", "~*", "+@write", "+@read", "+@fast"]);
    let mut cats = user_conn(&s, "cats", "pw");
    let r = try_run(&mut cats, &["RL.GCRA", "k", "10", "60s"].map(|x| x.as_bytes().to_vec()));
    if !v.has_command_acl_categories() {
        // Redis 7.0: no category holds a module command.
        for category in ["write", "read", "fast", "slow", "admin", "dangerous"] {
            assert_eq!(acl_cat(&mut admin, category), Vec::<String>::new(), "@{category} on {}", v.describe());
        }
        assert!(is_noperm(&r), "on {} +@write/+@fast must not cover RL.GCRA: {r:?}", v.describe());
    } else {
        for category in ["write", "read", "fast", "slow", "admin", "dangerous"] {
            assert_eq!(acl_cat(&mut admin, category), expected_in(category), "@{category} on {}", v.describe());
        }
        for internal in ["rl.setstate", "rl.debug"] {
            assert!(acl_cat(&mut admin, "dangerous").iter().any(|c| c == internal), "{internal} in @dangerous");
            assert!(!acl_cat(&mut admin, "fast").iter().any(|c| c == internal), "{internal} not in @fast");
        }
        r.unwrap_or_else(|e| panic!("on {} +@write +@fast covers RL.GCRA: {}", v.describe(), err_text(&e)));
        let r = try_run(&mut cats, &["RL.DEBUG", "CLOCK", "GET"].map(|x| x.as_bytes().to_vec()));
        assert!(is_noperm(&r), "+@write +@read +@fast must not grant RL.DEBUG: {r:?}");
    }

    if !v.has_module_acl_category() {
        let e = try_run(&mut admin, &["ACL", "SETUSER", "app", "+@ratelimit"].map(|x| x.as_bytes().to_vec()));
        assert!(e.is_err(), "@ratelimit must be unknown on {}: {e:?}", v.describe());
        println!("acl figures [categories, {}]: @ratelimit absent", v.describe());
        return;
    }
    assert_eq!(acl_cat(&mut admin, acl::CATEGORY), app_commands, "ACL CAT ratelimit");
    // Listing the category's commands: COMMAND LIST FILTERBY ACLCAT works on every server that
    // has it; ACL CAT ratelimit lists nothing on Redis 7.4.1 and Valkey 8.0.1 (docs/operations.md).
    let mut filtered: Vec<String> =
        redis::cmd("COMMAND").arg(&["LIST", "FILTERBY", "ACLCAT", acl::CATEGORY]).query(&mut admin).unwrap();
    filtered.sort();
    assert_eq!(filtered, app_commands, "COMMAND LIST FILTERBY ACLCAT ratelimit");
    let mut cat: Vec<String> = redis::cmd("ACL").arg("CAT").arg(acl::CATEGORY).query(&mut admin).unwrap();
    cat.sort();
    let lists_nothing = (v.valkey.is_none() && v.redis < (7, 9, 0)) || v.valkey.is_some_and(|k| k < (8, 1, 0));
    if lists_nothing {
        assert_eq!(cat, Vec::<String>::new(), "ACL CAT ratelimit on {} (docs/operations.md)", v.describe());
    } else if v.redis_at_least(7, 9) {
        assert_eq!(cat, app_commands, "ACL CAT ratelimit on {} (docs/operations.md)", v.describe());
    }
    println!("acl figures [categories, {}]: ACL CAT ratelimit lists {} commands", v.describe(), cat.len());

    // +@ratelimit alone: every application command inside the pattern, not RL.SETSTATE / RL.DEBUG.
    run(&mut admin, &["ACL", "SETUSER", "app", "on", ">pw", "~tenantA:*", "+@ratelimit"]);
    let mut app = user_conn(&s, "app", "pw");
    let n = check_tenant_user(&s, &mut app, &["rl.setstate"]);
    let r = try_run(&mut app, &["RL.DEBUG", "CLOCK", "GET"].map(|x| x.as_bytes().to_vec()));
    assert!(is_noperm(&r), "+@ratelimit must not grant RL.DEBUG: {r:?}");
    assert_eq!(last_denial(&mut admin), ("command".to_string(), "rl.debug".to_string()));
    let r = try_run(&mut app, &["GET", "tenantA:x"].map(|x| x.as_bytes().to_vec()));
    assert!(is_noperm(&r), "+@ratelimit grants module commands only: {r:?}");

    // +@all -@ratelimit: none of the application commands, everything else.
    run(&mut admin, &["ACL", "SETUSER", "noapp", "on", ">pw", "~*", "+@all", "-@ratelimit"]);
    let mut noapp = user_conn(&s, "noapp", "pw");
    for (name, args, _) in all_commands("k", &gcra_payload()) {
        let r = try_run(&mut noapp, &args);
        if app_commands.iter().any(|c| c == name) {
            assert!(is_noperm(&r), "-@ratelimit must remove {name}: {r:?}");
            assert_eq!(last_denial(&mut admin), ("command".to_string(), name.to_string()));
        } else {
            r.unwrap_or_else(|e| panic!("{name} under +@all -@ratelimit: {}", err_text(&e)));
        }
    }
    run(&mut noapp, &["SET", "plain", "1"]);
    println!(
        "acl figures [categories, {}]: @ratelimit holds {} commands, commands checked {n}",
        v.describe(),
        app_commands.len()
    );
}

/// RL.DEBUG on a module loaded without DEBUG_CLOCK: every form is an error, and the clock the
/// limiters use stays the real one (state and TTLs agree with the wall clock afterwards).
#[test]
fn rl_debug_without_debug_clock_changes_nothing() {
    let s = Server::start_with(Opts { debug_clock: false, ..Default::default() });
    let mut con = s.conn();
    let first = run(&mut con, &["RL.GCRA", "k", "10", "60s"]);
    let info_before = run(&mut con, &["RL.INFO", "k"]);
    for args in [
        vec!["RL.DEBUG", "CLOCK", "SET", "0"],
        vec!["RL.DEBUG", "CLOCK", "SET", "1700000000000000"],
        vec!["RL.DEBUG", "CLOCK", "ADVANCE", "1000000000000"],
        vec!["RL.DEBUG", "CLOCK", "ADVANCE", "-1000000000000"],
        vec!["RL.DEBUG", "CLOCK", "REAL"],
        vec!["RL.DEBUG", "CLOCK", "GET"],
        vec!["RL.DEBUG", "CLOCK"],
        vec!["RL.DEBUG", "NONSENSE"],
        vec!["RL.DEBUG"],
    ] {
        let a: Vec<Vec<u8>> = args.iter().map(|x| x.as_bytes().to_vec()).collect();
        let e = try_run(&mut con, &a).expect_err(&format!("{} must fail without DEBUG_CLOCK", args.join(" ")));
        let msg = err_text(&e);
        if args.len() > 2 {
            assert!(
                msg.contains("RL.DEBUG is disabled: load the module with the argument DEBUG_CLOCK"),
                "{}: {msg}",
                args.join(" ")
            );
        }
    }
    assert_eq!(keys_star(&mut con), vec!["k".to_string()], "RL.DEBUG wrote something");
    let strip_ttl = |v: &Value| -> Vec<Value> {
        let Value::Array(a) = v else { panic!("RL.INFO: {v:?}") };
        a.chunks(2).filter(|kv| kv[0] != Value::BulkString(b"ttl_ms".to_vec())).flatten().cloned().collect()
    };
    assert_eq!(strip_ttl(&run(&mut con, &["RL.INFO", "k"])), strip_ttl(&info_before), "RL.DEBUG changed the state");
    // The limiter still runs on the wall clock: a second call 2 intervals later than a frozen
    // clock would say, and tat_us within a few seconds of now.
    let second = run(&mut con, &["RL.GCRA", "k", "10", "60s"]);
    let (a1, a2) = (LimiterReply::of(&first), LimiterReply::of(&second));
    assert_eq!(a1.remaining, 9);
    assert_eq!(a2.remaining, 8, "second call: {second:?}");
    let reset = a2.reset_after_ms;
    assert!((11_000..=12_000).contains(&reset), "reset_after {reset} (expected ~12000 on the real clock)");
    let Value::Array(info) = run(&mut con, &["RL.INFO", "k"]) else { panic!() };
    let tat: i64 = info
        .chunks(2)
        .find(|kv| kv[0] == Value::BulkString(b"tat_us".to_vec()))
        .and_then(|kv| match &kv[1] {
            Value::Int(i) => Some(*i),
            Value::BulkString(b) => String::from_utf8_lossy(b).parse().ok(),
            _ => None,
        })
        .expect("tat_us");
    let now = now_us();
    assert!((tat - now - 12_000_000).abs() < 5_000_000, "tat_us {tat} vs now {now}: the clock moved");
    let Value::Int(pttl) = run(&mut con, &["PTTL", "k"]) else { panic!() };
    assert!((reset - 2_000..=reset + reset / 2).contains(&pttl), "PTTL {pttl}, reset_after {reset}");
}

/// COMMAND GETKEYS names exactly the declared key(s) for every command, and running each command
/// (as admin, on an empty database) creates no key other than those: DBSIZE grows by at most the
/// number of declared keys and KEYS * lists only them.
#[test]
fn commands_touch_only_their_declared_keys() {
    let s = Server::start();
    let mut con = s.conn();
    let payload = gcra_payload();
    let mut checked = 0;
    for key in ["tenantA:k", "{t}:k", "k"] {
        for (name, args, declared) in all_commands(key, &payload) {
            let mut getkeys = vec![b"COMMAND".to_vec(), b"GETKEYS".to_vec()];
            getkeys.extend(args.iter().cloned());
            let got: Vec<String> =
                getkeys.cmd().query(&mut con).unwrap_or_else(|e| panic!("GETKEYS {name}: {}", err_text(&e)));
            assert_eq!(got, declared, "COMMAND GETKEYS {}", args.shown());

            // Run on an empty db (and, for RL.INFO / RL.RESET, on a db holding the key).
            for prefill in [false, true] {
                run(&mut con, &["FLUSHALL"]);
                if prefill {
                    if name == "rl.info" || name == "rl.reset" {
                        run(&mut con, &["RL.GCRA", key, "10", "60s"]);
                    } else {
                        try_run(&mut con, &args).unwrap_or_else(|e| panic!("{}: {}", args.shown(), err_text(&e)));
                    }
                }
                let before = dbsize(&mut con);
                try_run(&mut con, &args).unwrap_or_else(|e| panic!("{}: {}", args.shown(), err_text(&e)));
                let after = dbsize(&mut con);
                let ks = keys_star(&mut con);
                assert!(after - before <= declared.len() as i64, "{name}: DBSIZE {before} → {after}");
                assert!(ks.iter().all(|k| declared.contains(k)), "{name} left keys {ks:?}, declared {declared:?}");
                checked += 1;
            }
        }
    }
    // RL.DEBUG declares no key.
    let e = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("RL.DEBUG")
        .arg("CLOCK")
        .arg("GET")
        .query::<Vec<String>>(&mut con)
        .expect_err("RL.DEBUG has no keys");
    assert!(err_text(&e).contains("no key arguments"), "{}", err_text(&e));
    // RL.MULTI with three keys declares all three, in order.
    let got: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(&["RL.MULTI", "3", "a", "b", "c", "GCRA", "1", "1s", "FIXED", "1", "1s", "SLIDING", "1", "1s"])
        .query(&mut con)
        .unwrap();
    assert_eq!(got, vec!["a", "b", "c"]);
    println!("acl figures [declared keys]: command runs checked {checked}");
}

/// Every application command on `key`, as a `+@ratelimit` user would send it: the six
/// limiters (a check, a DRYRUN, a peek), CL.THROTTLE (a check, a peek), RL.MULTI, RL.INFO,
/// RL.RESET and RL.RETURN.
fn app_calls(key: &str) -> Vec<Vec<String>> {
    let mut calls: Vec<Vec<&str>> = Vec::new();
    for cmd in ["RL.GCRA", "RL.TOKENBUCKET", "RL.LEAKY", "RL.SLIDING", "RL.FIXED", "RL.SLIDINGLOG"] {
        calls.push(vec![cmd, key, "10", "1m"]);
        calls.push(vec![cmd, key, "10", "1m", "DRYRUN"]);
        calls.push(vec![cmd, key, "10", "1m", "COST", "0"]);
    }
    calls.extend([
        vec!["CL.THROTTLE", key, "9", "10", "60"],
        vec!["CL.THROTTLE", key, "9", "10", "60", "0"],
        vec!["RL.MULTI", "1", key, "GCRA", "10", "1m"],
        vec!["RL.MULTI", "1", key, "GCRA", "10", "1m", "COST", "0"],
        vec!["RL.INFO", key],
        vec!["RL.RESET", key],
        vec!["RL.RETURN", key, "1"],
        vec!["RL.RETURN", key, "1", "AGE", "0"],
    ]);
    calls.into_iter().map(|c| c.into_iter().map(String::from).collect()).collect()
}

/// What a string key is, as its owner sees it: value, encoding, absolute expiry.
fn string_snapshot(admin: &mut Connection, key: &str) -> (Value, Value, Value, Value) {
    (
        run(admin, &["TYPE", key]),
        run(admin, &["GET", key]),
        run(admin, &["OBJECT", "ENCODING", key]),
        run(admin, &["PEXPIRETIME", key]),
    )
}

/// A user granted only the rate-limit commands (`+@ratelimit` where the server has it, the
/// same commands by name elsewhere) cannot change or read a string that is not rate-limit
/// state: counters (INCR's, with and without a TTL, "-7", "+7", "0"), nanosecond timestamps
/// whose TTL does not match them, text. Every call answers WRONGTYPE (or NOPERM), RL.INFO
/// shows nothing, and every string keeps its value, encoding and expiry. Only a key that is
/// exactly what redis-cell leaves is rate-limit state: CL.THROTTLE reads it (the drop-in),
/// the native commands answer WRONGTYPE unless the module is loaded with REDIS_CELL_KEYS.
#[test]
fn ratelimit_user_cannot_change_or_read_strings() {
    ratelimit_user_on_strings(false);
}

/// The same with REDIS_CELL_KEYS: the option lets the native commands read keys redis-cell
/// left, and nothing else (every other string is still WRONGTYPE and untouched).
#[test]
fn ratelimit_user_cannot_change_or_read_strings_with_redis_cell_keys() {
    ratelimit_user_on_strings(true);
}

fn ratelimit_user_on_strings(cell_keys: bool) {
    let s = if cell_keys { Server::start_with(common::redis_cell_keys()) } else { Server::start() };
    let mut admin = s.conn();
    let now_ns = now_us() * 1_000;
    let strings: Vec<(&str, Vec<Vec<String>>)> = {
        let set = |k: &str, v: &str| vec![vec!["SET".to_string(), k.to_string(), v.to_string()]];
        let with_ttl = |mut c: Vec<Vec<String>>, ms: &str| {
            c[0].extend(["PX".to_string(), ms.to_string()]);
            c
        };
        vec![
            ("s:counter", vec![vec!["INCRBY".into(), "s:counter".into(), "42".into()]]),
            (
                "s:window",
                vec![vec!["INCR".into(), "s:window".into()], vec!["PEXPIRE".into(), "s:window".into(), "60000".into()]],
            ),
            ("s:neg", set("s:neg", "-7")),
            ("s:plus", set("s:plus", "+7")),
            ("s:zero", set("s:zero", "0")),
            ("s:padded", with_ttl(set("s:padded", &format!("0{}", now_ns + 30_000_000_000)), "30000")),
            ("s:ts", set("s:ts", &now_ns.to_string())),
            ("s:seen", with_ttl(set("s:seen", &(now_ns - 3_600_000_000_000).to_string()), "600000")),
            ("s:later", with_ttl(set("s:later", &(now_ns + 3_600_000_000_000).to_string()), "600000")),
            ("s:text", set("s:text", "hello")),
        ]
    };
    for (_, setup) in &strings {
        for c in setup {
            let c: Vec<&str> = c.iter().map(String::as_str).collect();
            run(&mut admin, &c);
        }
    }
    let v = s.version();
    if v.has_module_acl_category() {
        run(&mut admin, &["ACL", "SETUSER", "app", "on", ">pw", "~s:*", "-@all", "+@ratelimit"]);
    } else {
        run(&mut admin, &["ACL", "SETUSER", "app", "on", ">pw", "~s:*", "-@all"]);
        for c in app_command_names() {
            run(&mut admin, &["ACL", "SETUSER", "app", &format!("+{c}")]);
        }
    }
    let mut app = user_conn(&s, "app", "pw");
    let mut checked = 0;
    for (key, _) in &strings {
        let before = string_snapshot(&mut admin, key);
        for call in app_calls(key) {
            let args: Vec<Vec<u8>> = call.iter().map(|a| a.as_bytes().to_vec()).collect();
            let r = try_run(&mut app, &args);
            match &r {
                Err(e) if matches!(e.code(), Some("WRONGTYPE") | Some("NOPERM")) => {}
                other => panic!("{} on string {key} answered {other:?}, not WRONGTYPE", args.shown()),
            }
            assert_eq!(string_snapshot(&mut admin, key), before, "{} changed string {key}", args.shown());
            checked += 1;
        }
    }

    // A key exactly as redis-cell leaves it (its arrival time in ns, expiring then): CL.THROTTLE
    // reads it and takes it over; the native commands leave it alone by default, and read it
    // with REDIS_CELL_KEYS (RL.INFO: its arrival time).
    let tat = now_ns + 20_000_000_000;
    let pxat = (tat / 1_000_000).to_string();
    run(&mut admin, &["SET", "s:cell", &tat.to_string(), "PXAT", &pxat]);
    let before = string_snapshot(&mut admin, "s:cell");
    if cell_keys {
        let Value::Array(info) = run(&mut app, &["RL.INFO", "s:cell"]) else { panic!("RL.INFO on a redis-cell key") };
        assert!(info.contains(&Value::BulkString(b"redis-cell".to_vec())), "{info:?}");
        let peek = run(&mut app, &["RL.GCRA", "s:cell", "10", "1m", "COST", "0"]);
        assert!(matches!(&peek, Value::Array(p) if p[..3] == [0, 10, 6].map(Value::Int)), "{peek:?}");
        assert_eq!(string_snapshot(&mut admin, "s:cell"), before, "a peek writes nothing");
        run(&mut app, &["RL.GCRA", "s:cell", "10", "1m"]);
        assert_eq!(run(&mut admin, &["TYPE", "s:cell"]), Value::SimpleString("ratelimit".into()));
        println!("acl figures [strings, {}, REDIS_CELL_KEYS]: calls refused {checked}", v.describe());
        return;
    }
    for call in app_calls("s:cell").into_iter().filter(|c| c[0] != "CL.THROTTLE") {
        let args: Vec<Vec<u8>> = call.iter().map(|a| a.as_bytes().to_vec()).collect();
        let e = try_run(&mut app, &args).expect_err(&args.shown());
        assert_eq!(e.code(), Some("WRONGTYPE"), "{}: {}", args.shown(), err_text(&e));
        assert!(err_text(&e).contains("REDIS_CELL_KEYS"), "{}: {}", args.shown(), err_text(&e));
        assert_eq!(string_snapshot(&mut admin, "s:cell"), before);
    }
    // 20 s of a 6 s interval used: 6 of 10 left, reset in 20 s (19 when the call comes late).
    let peek = run(&mut app, &["CL.THROTTLE", "s:cell", "9", "10", "60", "0"]);
    let p = CellReply::of(&peek);
    assert_eq!(p.ints()[..4], [0, 10, 6, -1], "CL.THROTTLE reads the arrival time: {peek:?}");
    assert!(matches!(p.reset_after_s, 19 | 20), "{peek:?}");
    assert_eq!(string_snapshot(&mut admin, "s:cell"), before, "a peek writes nothing");
    run(&mut app, &["CL.THROTTLE", "s:cell", "9", "10", "60"]);
    assert_eq!(run(&mut admin, &["TYPE", "s:cell"]), Value::SimpleString("ratelimit".into()));
    println!("acl figures [strings, {}]: calls refused {checked}", v.describe());
}

/// The application commands by name (Redis 7.0 and 7.2 have no `@ratelimit`).
fn app_command_names() -> Vec<String> {
    COMMANDS.iter().filter(|c| c.acl.ratelimit).map(|c| c.name.to_str().unwrap().to_string()).collect()
}

/// RL.SETSTATE needs write permission on its key and nothing more (its key spec: RW update, no
/// access): a user with `%W~` on the key may call it, one with only `%R~` may not.
#[test]
fn rl_setstate_needs_write_permission_only() {
    let s = Server::start();
    let mut admin = s.conn();
    run(&mut admin, &["ACL", "SETUSER", "writer", "on", ">pw", "resetkeys", "%W~w:*", "-@all", "+rl.setstate"]);
    run(&mut admin, &["ACL", "SETUSER", "reader", "on", ">pw", "resetkeys", "%R~w:*", "-@all", "+rl.setstate"]);
    let payload = gcra_payload();
    let call = |key: &str| vec![b"RL.SETSTATE".to_vec(), key.as_bytes().to_vec(), payload.clone()];
    let mut writer = user_conn(&s, "writer", "pw");
    let r = try_run(&mut writer, &call("w:k"));
    assert_eq!(r.unwrap_or_else(|e| panic!("write permission: {}", err_text(&e))), Value::Okay);
    let mut reader = user_conn(&s, "reader", "pw");
    let r = try_run(&mut reader, &call("w:other"));
    assert!(is_noperm(&r), "read permission alone: {r:?}");
    assert_eq!(last_denial(&mut admin), ("key".to_string(), "w:other".to_string()));
}
