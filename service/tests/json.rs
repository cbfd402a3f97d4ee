//! `/json`'s numeric fields over real HTTP against the service and redis-server with the module:
//! out of range or not an integer, each answers 400 naming the field and touches no limit (issue
//! 31.11: a `unit` of 2^40 + 1 was taken as SECOND); in range, as numbers or strings, they
//! decide as gRPC does.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use common::Server;
use support::*;

#[test]
fn out_of_range_numbers_answer_400_naming_the_field() {
    let redis = Server::start();
    let dir = TempDir::new("json-numbers");
    dir.write("d.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n");
    let svc = ServiceProc::start(dir.path(), &["--redis-url", &format!("127.0.0.1:{}", redis.port)]);
    let mut con = redis.conn();
    reset_stats(&mut con);
    let body = |descriptor: &str| format!(r#"{{"domain":"d","descriptors":[{descriptor}]}}"#);
    let with = |extra: &str| body(&format!(r#"{{"entries":[{{"key":"k","value":"v"}}],{extra}}}"#));
    let cases = [
        // 2^40 + 1: its low 32 bits are 1, SECOND.
        (with(r#""limit":{"requestsPerUnit":1,"unit":1099511627777}"#), "descriptors[0].limit.unit 1099511627777"),
        (with(r#""limit":{"requestsPerUnit":1,"unit":4294967298}"#), "descriptors[0].limit.unit 4294967298"),
        (with(r#""limit":{"requestsPerUnit":1,"unit":99}"#), "descriptors[0].limit.unit 99 is not a unit"),
        (with(r#""limit":{"requestsPerUnit":1,"unit":-2}"#), "descriptors[0].limit.unit -2"),
        (with(r#""limit":{"requestsPerUnit":1,"unit":"WEEK"}"#), "descriptors[0].limit.unit \"WEEK\""),
        (with(r#""limit":{"requestsPerUnit":4294967296,"unit":"MINUTE"}"#), "descriptors[0].limit.requestsPerUnit"),
        (with(r#""limit":{"requests_per_unit":2.5,"unit":"MINUTE"}"#), "descriptors[0].limit.requestsPerUnit 2.5"),
        (with(r#""hitsAddend":18446744073709551616"#), "descriptors[0].hitsAddend"),
        (with(r#""hitsAddend":-1"#), "descriptors[0].hitsAddend -1"),
        (with(r#""hits_addend":"1e3""#), "descriptors[0].hitsAddend \"1e3\""),
        (
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"hitsAddend":4294967296}"#
                .to_string(),
            "hitsAddend 4294967296 is not an integer from 0 to 4294967295",
        ),
    ];
    for (req, want) in &cases {
        let (status, answer) = svc.http("POST", "/json", req);
        assert_eq!(status, 400, "{req}: {answer}");
        assert!(answer.starts_with(want), "{req}: '{answer}' should start with '{want}'");
    }
    assert_eq!(command_calls(&mut con), 0, "a refused request touches no limit");

    // In range: a request's own limit of 1 per MINUTE (unit 2 by number), hits as a string.
    let own = with(r#""limit":{"requestsPerUnit":"1","unit":2},"hitsAddend":"1""#);
    let (status, answer) = svc.http("POST", "/json", &own);
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains(r#""currentLimit":{"requestsPerUnit":1,"unit":"MINUTE"}"#), "{answer}");
    let (status, answer) = svc.http("POST", "/json", &own);
    assert_eq!(status, 429, "{answer}");
    // The configured rule (5 per minute) on another value.
    let (status, answer) = svc.http("POST", "/json", &body(r#"{"entries":[{"key":"k","value":"w"}],"hitsAddend":2}"#));
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains(r#""limitRemaining":3"#), "{answer}");
}
