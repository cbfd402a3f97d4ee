//! Eviction risk (issue 10): every limiter key has a TTL, so every `maxmemory-policy` but
//! `noeviction` may evict it once a `maxmemory` is set, and an evicted key is a fresh limit.
//! The module warns in the server log at load and after a `CONFIG SET` that makes the risk
//! appear, and shows it in `INFO ratelimit`.

mod common;

use common::{Opts, Server};

const POLICIES: [&str; 8] = [
    "noeviction",
    "allkeys-lru",
    "volatile-lru",
    "volatile-ttl",
    "allkeys-random",
    "volatile-random",
    "allkeys-lfu",
    "volatile-lfu",
];

const WARNING: &str = "lets Redis evict limiter keys";

fn warnings(s: &Server) -> usize {
    s.log().lines().filter(|l| l.contains(WARNING)).count()
}

fn notices(s: &Server) -> usize {
    s.log().lines().filter(|l| l.contains("limiter keys can no longer be evicted")).count()
}

fn expected_risk(policy: &str, maxmemory: u64) -> &'static str {
    if maxmemory > 0 && policy != "noeviction" {
        "yes"
    } else {
        "no"
    }
}

/// Each policy at load, with a maxmemory: INFO and the log line.
#[test]
fn every_policy_at_load_reports_its_eviction_risk_and_warns_if_it_evicts() {
    for policy in POLICIES {
        let s = Server::start_with(Opts {
            extra: vec![("maxmemory".into(), "100mb".into()), ("maxmemory-policy".into(), policy.into())],
            ..Opts::default()
        });
        let risk = expected_risk(policy, 1);
        assert_eq!(s.ratelimit_field("eviction_risk"), risk, "{policy}");
        assert_eq!(s.ratelimit_field("maxmemory_policy"), policy);
        assert_eq!(s.ratelimit_field("maxmemory"), (100u64 << 20).to_string());
        let logged = s.log().lines().any(|l| {
            l.contains(WARNING) && l.contains(&format!("maxmemory-policy {policy} ")) && l.contains("at load")
        });
        assert_eq!(logged, risk == "yes", "{policy}: warning at load\n{}", s.log());
    }
}

/// The default configuration (maxmemory 0): nothing is evicted, whatever the policy.
#[test]
fn no_maxmemory_means_no_eviction_risk_until_one_is_set() {
    let s =
        Server::start_with(Opts { extra: vec![("maxmemory-policy".into(), "allkeys-lru".into())], ..Opts::default() });
    assert_eq!(s.ratelimit_field("eviction_risk"), "no");
    assert_eq!(s.ratelimit_field("maxmemory"), "0");
    assert_eq!(warnings(&s), 0);
    // Setting a maxmemory makes the risk appear.
    s.config_set("maxmemory", "50mb");
    assert_eq!(s.ratelimit_field("eviction_risk"), "yes");
    assert_eq!(warnings(&s), 1);
}

/// CONFIG SET through every policy: INFO follows, a warning is logged each time the setting
/// changes to one that may evict, a notice when it stops, and nothing on unrelated changes.
#[test]
fn config_set_of_the_policy_updates_the_risk_and_logs_each_change() {
    let s = Server::start_with(Opts { extra: vec![("maxmemory".into(), "100mb".into())], ..Opts::default() });
    assert_eq!(s.ratelimit_field("maxmemory_policy"), "noeviction");
    assert_eq!(s.ratelimit_field("eviction_risk"), "no");
    let (mut expected_warnings, mut expected_notices) = (0, 0);
    let mut previous = "noeviction";
    for policy in POLICIES.iter().skip(1).chain(["noeviction", "volatile-ttl", "noeviction"].iter()) {
        s.config_set("maxmemory-policy", policy);
        let risk = expected_risk(policy, 1);
        assert_eq!(s.ratelimit_field("eviction_risk"), risk, "after CONFIG SET maxmemory-policy {policy}");
        assert_eq!(s.ratelimit_field("maxmemory_policy"), *policy);
        if risk == "yes" {
            expected_warnings += 1;
            let last = s.log().lines().rev().find(|l| l.contains(WARNING)).unwrap_or_default().to_string();
            assert!(
                last.contains(&format!("maxmemory-policy {policy} ")) && last.contains("after CONFIG SET"),
                "{last}"
            );
        } else if previous != "noeviction" {
            expected_notices += 1;
        }
        assert_eq!(warnings(&s), expected_warnings, "warnings after {policy}");
        assert_eq!(notices(&s), expected_notices, "notices after {policy}");
        previous = policy;
    }
    // An unrelated CONFIG SET logs nothing.
    s.config_set("maxmemory-policy", "allkeys-lru");
    let n = warnings(&s);
    s.config_set("hz", "11");
    assert_eq!(warnings(&s), n);
    // Dropping maxmemory to 0 removes the risk.
    s.config_set("maxmemory", "0");
    assert_eq!(s.ratelimit_field("eviction_risk"), "no");
}
