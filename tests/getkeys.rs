//! RL.MULTI's keys as Redis sees them (issue 10): with a `numkeys` larger than the keys given,
//! the words after the keys are not keys. Redis asks the module (its key spec has
//! VARIABLE_FLAGS), which declares no keys for a call that does not parse, so COMMAND GETKEYS
//! refuses it and a cluster node runs it and answers the module's own argument error instead
//! of CROSSSLOT. A valid call declares exactly its keys, with the spec's flags.

mod common;

use common::{Cluster, Server};
use redis::Value;

fn getkeys(c: &mut redis::Connection, sub: &str, args: &[&str]) -> redis::RedisResult<Value> {
    redis::cmd("COMMAND").arg(sub).arg(args).query(c)
}

const TOO_MANY: &[&str] = &["RL.MULTI", "3", "{t}a", "{t}b", "GCRA", "1", "1s", "FIXED", "1", "1s"];

#[test]
fn getkeys_of_a_malformed_rl_multi_names_no_option_words() {
    let s = Server::start();
    let mut c = s.conn();
    let valid = ["RL.MULTI", "2", "{t}a", "{t}b", "GCRA", "1", "1s", "FIXED", "1", "1s", "COST", "1", "DRYRUN"];
    let got: Vec<String> = redis::from_redis_value(getkeys(&mut c, "GETKEYS", &valid).unwrap()).unwrap();
    assert_eq!(got, vec!["{t}a", "{t}b"]);
    let flags = getkeys(&mut c, "GETKEYSANDFLAGS", &valid).unwrap();
    assert_eq!(format!("{flags:?}").matches("RW").count(), 2, "{flags:?}");
    for bad in [
        TOO_MANY,
        &["RL.MULTI", "4", "{t}a", "{t}b", "GCRA", "1", "1s", "FIXED", "1", "1s"][..],
        &["RL.MULTI", "2", "{t}a", "{t}b", "GCRA", "1", "1s"],
        &["RL.MULTI", "2", "{t}a", "{t}b", "GCRA", "1", "1s", "FIXED", "1", "1s", "BOGUS"],
        &["RL.MULTI", "9", "{t}a"],
    ] {
        let e = getkeys(&mut c, "GETKEYS", bad).expect_err("no keys for a malformed call");
        assert_eq!(e.code(), Some("ERR"), "{bad:?}: {e}");
        // The command itself answers its own argument error.
        let e = redis::cmd(bad[0]).arg(&bad[1..]).query::<Value>(&mut c).expect_err("malformed");
        assert_eq!(e.code(), Some("ERR"), "{bad:?}: {e}");
    }
}

#[test]
fn a_cluster_node_answers_the_argument_error_not_crossslot() {
    let cluster = Cluster::start(3, 0);
    for node in &cluster.nodes {
        let mut c = node.conn();
        // "{t}a", "{t}b" and "GCRA" are in different slots: read as keys this was CROSSSLOT.
        let e = redis::cmd(TOO_MANY[0]).arg(&TOO_MANY[1..]).query::<Value>(&mut c).expect_err("malformed");
        assert_eq!(e.code(), Some("ERR"), "port {}: {e}", node.port);
        assert!(!e.to_string().contains("CROSSSLOT"), "{e}");
        // A valid call with keys in two slots is still CROSSSLOT.
        let e = redis::cmd("RL.MULTI")
            .arg(&["2", "a", "b", "GCRA", "1", "1s", "FIXED", "1", "1s"])
            .query::<Value>(&mut c)
            .expect_err("crossslot");
        assert_eq!(e.code(), Some("CROSSSLOT"), "{e}");
    }
}
