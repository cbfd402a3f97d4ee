//! TLS to Redis through the service, with envoyproxy/ratelimit's variables (REDIS_TLS,
//! REDIS_TLS_CACERT, REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY,
//! REDIS_TLS_SKIP_HOSTNAME_VERIFICATION), against redis-server's TLS port and certificates made
//! in the test (tests/common/tls.rs): a private CA with mTLS decides from Redis; a wrong host
//! name serves with the failure mode, /healthcheck naming the problem, and is decided by Redis
//! with REDIS_TLS_SKIP_HOSTNAME_VERIFICATION; an unreadable CA file or half a client pair stop
//! the start.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;
#[path = "../../tests/common/tls.rs"]
mod tls;

use std::time::Duration;

use common::{Opts, Server};
use redis_ratelimit_service::pb::Code;
use support::*;
use tls::Certs;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_redis_with_envoyproxys_settings() {
    let certs = Certs::generate();
    let (port, extra) = certs.server_opts(true);
    let _redis = Server::start_with(Opts { extra, ..Default::default() });
    let dir = failure_mode_configs("tls", "p", "hour");
    let p = |f: &str| certs.path(f).display().to_string();
    let (ca, cert, key) = (p("ca.crt"), p("client.crt"), p("client.key"));
    let by_name = format!("localhost:{port}");
    let by_address = format!("127.0.0.1:{port}");
    let env = |url: &str, skip: &str| {
        vec![
            ("REDIS_URL".to_string(), url.to_string()),
            ("REDIS_TLS".to_string(), "true".to_string()),
            ("REDIS_TLS_CACERT".to_string(), ca.clone()),
            ("REDIS_TLS_CLIENT_CERT".to_string(), cert.clone()),
            ("REDIS_TLS_CLIENT_KEY".to_string(), key.clone()),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION".to_string(), skip.to_string()),
        ]
    };
    let start = |env: &[(String, String)]| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let svc = ServiceProc::start_in_env(dir.path(), &[], &env);
        svc.wait_log("loaded rate limit configuration", Duration::from_secs(10));
        svc
    };
    // docs/service.md's settings as written, the files and the address replaced by the test's.
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/service.md")).unwrap();
    let block = doc.split("## TLS to Redis").nth(1).and_then(|s| s.split("```sh\n").nth(1)).unwrap();
    let documented: Vec<(String, String)> = block
        .split("```")
        .next()
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            let v = match v.strip_prefix("/etc/redis-tls/") {
                Some(file) => p(file),
                None if k == "REDIS_URL" => by_name.clone(),
                None => v.to_string(),
            };
            (k.to_string(), v)
        })
        .collect();
    assert_eq!(documented.len(), 5, "{documented:?}");
    // The private CA, mTLS, the name in the certificate: decided by Redis (3 of 4 left).
    for (url, env) in [(&by_name, documented), (&by_address, env(&by_address, "true"))] {
        let svc = start(&env);
        let mut c = svc.client().await;
        wait_until(Duration::from_secs(5), "decided by Redis over TLS", || {
            let r = futures_block(c.should_rate_limit(request("p_closed", vec![desc(&[("k", url)])])));
            matches!(r, Ok(r) if remaining(r.get_ref()) == [3])
        });
        let (_, body) = svc.http("GET", "/healthcheck", "");
        assert!(body.contains(&format!("redis connected to {url}")), "{body}");
    }
    // A name the certificate does not carry: the service serves with the failure mode and
    // says why.
    let svc = start(&env(&by_address, "false"));
    let mut c = svc.client().await;
    let r = ask(&mut c, request("p_closed", vec![desc(&[("k", "v")])])).await;
    assert_eq!(codes(&r), [Code::OverLimit], "closed while Redis cannot be reached");
    let (status, body) = svc.http("GET", "/healthcheck", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("TLS: the certificate of 127.0.0.1 is not valid for the name '127.0.0.1'"), "{body}");
    // Without a client certificate the server refuses the handshake.
    let mut no_cert = env(&by_name, "false");
    no_cert.retain(|(k, _)| !k.starts_with("REDIS_TLS_CLIENT"));
    let svc = start(&no_cert);
    let r = ask(&mut svc.client().await, request("p_closed", vec![desc(&[("k", "v")])])).await;
    assert_eq!(codes(&r), [Code::OverLimit]);
    wait_until(Duration::from_secs(5), "the refusal named", || {
        svc.http("GET", "/healthcheck", "").1.contains("client certificate")
    });
    // Configuration errors stop the start, naming the setting or the file.
    let mut missing = env(&by_name, "false");
    missing[2].1 = p("missing.crt");
    let mut half = env(&by_name, "false");
    half.retain(|(k, _)| k != "REDIS_TLS_CLIENT_KEY");
    for (case, what) in [(missing, "missing.crt"), (half, "REDIS_TLS_CLIENT_CERT is set without REDIS_TLS_CLIENT_KEY")]
    {
        let env: Vec<(&str, &str)> = case.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut svc = ServiceProc::spawn(dir.path(), &[], Some(&env));
        let status = svc.wait_exit(Duration::from_secs(20));
        assert_eq!(status.code(), Some(1), "{}", svc.log());
        assert!(svc.log().contains(what), "{what}:\n{}", svc.log());
    }
}

fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| rt.block_on(f))
}
