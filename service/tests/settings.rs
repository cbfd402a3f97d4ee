//! envoyproxy/ratelimit's environment variables that this service does not implement
//! (`settings::UNIMPLEMENTED`), against the real binary: each set one is named in a WARN at start
//! and the service serves, or it refuses to start naming it (exit 1, nothing listening); values
//! that ask for nothing more, and unset variables, produce nothing. The processes run in an
//! environment of exactly the variables given (nothing inherited from the test's).

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::time::Duration;

use common::Server;
use redis_ratelimit_service::settings::{Verdict, UNIMPLEMENTED};
use support::*;

const SAID: &str = "is set but not implemented";

/// A redis-server with the module, a configuration with one domain, and the service's flags.
fn setup(tag: &str) -> (Server, TempDir, Vec<String>) {
    let redis = Server::start();
    let dir = TempDir::new(tag);
    dir.write("d.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n");
    let args = vec!["--redis-url".to_string(), format!("127.0.0.1:{}", redis.port)];
    (redis, dir, args)
}

/// The variable names of the rows with `verdict` (a `PREFIX_*` name as one variable of it).
fn names(verdict: Verdict) -> Vec<String> {
    UNIMPLEMENTED
        .iter()
        .filter(|r| r.verdict == verdict)
        .flat_map(|r| r.names.iter().map(|n| n.replace('*', "X_PATTERN")))
        .collect()
}

fn serves(svc: &ServiceProc) {
    let (status, body) =
        svc.http("POST", "/json", r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#);
    assert_eq!(status, 200, "{body}\n{}", svc.log());
    assert!(body.contains(r#""limitRemaining":4"#), "{body}");
}

#[test]
fn no_unimplemented_variable_set_says_nothing() {
    let (_redis, dir, args) = setup("unset");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let svc = ServiceProc::start_in_env(dir.path(), &args, &[]);
    serves(&svc);
    assert!(!svc.log().contains(SAID), "{}", svc.log());
}

/// Every warned variable at once: one WARN line each, naming it; values never logged; the
/// service serves. Refused variables set to inert values (`false`, `redis`, ...) say nothing.
#[test]
fn each_set_warned_variable_is_named_in_a_warning_and_the_service_serves() {
    let (_redis, dir, args) = setup("warn");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let warned = names(Verdict::Warn);
    assert!(warned.len() > 50, "{warned:?}");
    let mut env: Vec<(&str, &str)> = warned.iter().map(|n| (n.as_str(), "s3cret-value")).collect();
    let inert = [
        ("REDIS_PERSECOND", "0"),
        ("BACKEND_TYPE", "redis"),
        ("CONFIG_TYPE", "FILE"),
        ("QUOTA_MODE", "False"),
        ("GRPC_UDS", ""),
    ];
    env.extend(inert);
    let svc = ServiceProc::start_in_env(dir.path(), &args, &env);
    serves(&svc);
    let log = svc.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(SAID)).collect();
    for name in &warned {
        let said: Vec<&&str> = lines.iter().filter(|l| l.contains(&format!("{name} {SAID}"))).collect();
        assert_eq!(said.len(), 1, "{name}:\n{log}");
        assert!(said[0].contains("WARN"), "{}", said[0]);
    }
    assert_eq!(lines.len(), warned.len(), "{log}");
    for (name, _) in inert {
        assert!(!log.contains(&format!("{name} {SAID}")), "{name}:\n{log}");
    }
    assert!(!log.contains("s3cret"), "{log}");
}

/// Each refused variable alone stops the start: exit 1 before listening, naming it on stderr
/// and in the log.
#[test]
fn each_set_refused_variable_stops_the_start_naming_it() {
    let (_redis, dir, args) = setup("refuse");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refused = names(Verdict::Refuse);
    assert!(refused.len() >= 10, "{refused:?}");
    let mut cases: Vec<(&str, &str)> = refused.iter().map(|n| (n.as_str(), "true")).collect();
    cases.extend([("BACKEND_TYPE", "memcache"), ("CONFIG_TYPE", "GRPC_XDS_SOTW"), ("REDIS_PERSECOND", "s3cret-value")]);
    for (name, value) in cases {
        let mut svc = ServiceProc::spawn(dir.path(), &args, Some(&[(name, value)]));
        let status = svc.wait_exit(Duration::from_secs(20));
        let log = svc.log();
        assert_eq!(status.code(), Some(1), "{name}={value}:\n{log}");
        assert!(!log.contains("listening for"), "{name}={value}:\n{log}");
        assert!(log.contains(&format!("redis-ratelimit-service: {name} {SAID}")), "{name}={value}:\n{log}");
        assert!(log.lines().any(|l| l.contains("ERROR") && l.contains(&format!("{name} {SAID}"))), "{log}");
        assert!(!log.contains("s3cret"), "{log}");
    }
}
