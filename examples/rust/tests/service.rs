//! Starts redis-server with the module (free port, own temp dir) and checks
//! admitted and limited decisions: sequential, from concurrent tasks, under
//! RESP3, and through the HTTP service.
//!
//! `RL_MODULE`: the module .so (a relative path is taken from the repo root;
//! default target/release/libredis_ratelimit.so). `RL_REDIS_SERVER`: the
//! redis-server binary (default: on PATH).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ratelimit_example::{check, respond, serve, Decision, Policy};

struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Child,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn module_path() -> PathBuf {
    let p = PathBuf::from(std::env::var("RL_MODULE").unwrap_or_else(|_| "target/release/libredis_ratelimit.so".into()));
    let p = if p.is_absolute() { p } else { repo_root().join(p) };
    assert!(
        p.is_file(),
        "module not found at {}: run `cargo build --release` in the repo root (or set RL_MODULE)",
        p.display()
    );
    p.canonicalize().unwrap()
}

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

impl RedisServer {
    fn start() -> RedisServer {
        let module = module_path();
        let bin = std::env::var("RL_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let mut last_log = String::new();
        for attempt in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!("rl-example-rs-{}-{port}-{attempt}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let log = dir.join("redis.log");
            let child = Command::new(&bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir)
                .arg("--logfile")
                .arg(&log)
                .arg("--loadmodule")
                .arg(&module)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
            let mut server = RedisServer { port, dir, child };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && server.child.try_wait().unwrap().is_none() {
                if ping(port) {
                    return server;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            last_log = std::fs::read_to_string(&log).unwrap_or_default();
            drop(server);
            if !last_log.contains("Address already in use") {
                break;
            }
        }
        panic!("redis-server did not start:\n{last_log}");
    }

    async fn conn(&self, query: &str) -> redis::aio::MultiplexedConnection {
        redis::Client::open(format!("redis://127.0.0.1:{}/{query}", self.port))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// 1 token per 2 s, bucket of 3.
fn slow_policy() -> Policy {
    Policy::new(1, "2s", 3)
}

#[tokio::test]
async fn admitted_then_limited() {
    let server = RedisServer::start();
    let mut conn = server.conn("").await;
    let policy = slow_policy();
    let mut ds = Vec::new();
    for _ in 0..4 {
        ds.push(check(&mut conn, "apikey:alice", &policy).await.unwrap());
    }
    for (i, d) in ds[..3].iter().enumerate() {
        let n = i as u64 + 1;
        assert!(d.admitted(), "{d:?}");
        assert_eq!((d.allowed, d.limit, d.remaining, d.retry_after), (1, 3, 3 - n, None));
        // n refill intervals of 2000 ms, minus the few ms that passed
        assert!((n as u128 * 2000 - 500..=n as u128 * 2000).contains(&d.reset_after.as_millis()), "{d:?}");
        assert_eq!(d.retry_after, None);
    }
    let limited = ds[3];
    assert!(!limited.admitted());
    assert_eq!((limited.allowed, limited.limit, limited.remaining), (0, 3, 0));
    assert!((1500..=2000).contains(&limited.retry_after.unwrap().as_millis()), "{limited:?}");
    assert!((5500..=6000).contains(&limited.reset_after.as_millis()), "{limited:?}");
    let h = limited.headers();
    assert_eq!(h["retry-after"], "2");
    assert_eq!(h["ratelimit-remaining"], "0");
    assert_eq!(h["ratelimit-reset"], "6");
    // The current draft's form beside it (docs/http-headers.md): t is no later than Retry-After.
    assert_eq!(h["ratelimit-policy"], r#""default";q=3"#);
    assert_eq!(h["ratelimit"], r#""default";r=0;t=2"#);

    // Waiting retry_after is enough (never early); a limited call consumed nothing.
    tokio::time::sleep(limited.retry_after.unwrap()).await;
    let d = check(&mut conn, "apikey:alice", &policy).await.unwrap();
    assert!(d.admitted(), "still limited after retry_after: {d:?}");
    assert_eq!(d.remaining, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_tasks_admit_exactly_the_burst() {
    let server = RedisServer::start();
    let conn = server.conn("").await;
    let policy = Policy::new(10, "1m", 20); // refills 1 per 6 s: nothing refills during the test
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (mut conn, policy) = (conn.clone(), policy.clone());
            tokio::spawn(async move { check(&mut conn, "apikey:shared", &policy).await.unwrap() })
        })
        .collect();
    let mut decisions: Vec<Decision> = Vec::new();
    for t in tasks {
        decisions.push(t.await.unwrap());
    }
    let (admitted, limited): (Vec<&Decision>, Vec<&Decision>) = decisions.iter().partition(|d| d.admitted());
    assert_eq!(admitted.len(), 20, "exactly BURST calls pass");
    assert_eq!(limited.len(), 30);
    // Each admitted call saw a distinct remaining count: the checks were atomic.
    let mut rem: Vec<u64> = admitted.iter().map(|d| d.remaining).collect();
    rem.sort();
    assert_eq!(rem, (0..20).collect::<Vec<_>>());
    for d in limited {
        assert_eq!((d.allowed, d.limit, d.remaining), (0, 20, 0));
        assert!((1..=6000).contains(&d.retry_after.unwrap().as_millis()), "{d:?}");
    }
}

#[tokio::test]
async fn resp3_map_reply_gives_the_same_decisions() {
    let server = RedisServer::start();
    let mut resp2 = server.conn("").await;
    let mut resp3 = server.conn("?protocol=resp3").await;
    // Under RESP3 the reply is a map: check it really is one.
    let raw: redis::Value =
        redis::cmd("RL.TOKENBUCKET").arg("probe").arg(1).arg("1m").query_async(&mut resp3).await.unwrap();
    assert!(matches!(raw, redis::Value::Map(_)), "{raw:?}");
    let policy = slow_policy();
    for _ in 0..4 {
        let a = check(&mut resp2, "apikey:r2", &policy).await.unwrap();
        let b = check(&mut resp3, "apikey:r3", &policy).await.unwrap();
        assert_eq!((a.allowed, a.limit, a.remaining), (b.allowed, b.limit, b.remaining));
    }
}

/// Sends one HTTP/1.1 GET and returns (status, headers lower-cased).
async fn get(port: u16, api_key: Option<&str>) -> (u16, BTreeMap<String, String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let key = api_key.map(|k| format!("X-API-Key: {k}\r\n")).unwrap_or_default();
    s.write_all(format!("GET /hello HTTP/1.1\r\nHost: localhost\r\n{key}\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let (head, _body) = out.split_once("\r\n\r\n").expect("response head");
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers)
}

#[tokio::test]
async fn http_service_answers_429_with_headers() {
    let server = RedisServer::start();
    let conn = server.conn("").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let svc = tokio::spawn(serve(listener, conn, slow_policy()));

    let mut seen = Vec::new();
    for _ in 0..10 {
        let r = get(port, Some("carol")).await;
        let done = r.0 == 429;
        seen.push(r);
        if done {
            break;
        }
    }
    assert_eq!(seen.iter().map(|r| r.0).collect::<Vec<_>>(), [200, 200, 200, 429]);
    for (i, (_, h)) in seen[..3].iter().enumerate() {
        assert_eq!(h["ratelimit-limit"], "3");
        assert_eq!(h["ratelimit-remaining"], (2 - i).to_string());
        assert_eq!(h["ratelimit-reset"], (2 * (i + 1)).to_string());
        assert!(!h.contains_key("retry-after"));
    }
    let (_, h) = &seen[3];
    assert_eq!(
        (h["retry-after"].as_str(), h["ratelimit-remaining"].as_str(), h["ratelimit-reset"].as_str()),
        ("2", "0", "6")
    );

    assert_eq!(get(port, None).await.0, 401);
    svc.abort();
}

#[tokio::test]
async fn redis_down_is_503() {
    // Fail closed: with Redis gone, `respond` answers 503 and no RateLimit headers.
    let server = RedisServer::start();
    let mut conn = server.conn("").await;
    drop(server);
    let r = respond(&mut conn, Some("dave"), &slow_policy()).await;
    assert_eq!(r.status, 503);
    assert!(r.headers.is_empty());
}
