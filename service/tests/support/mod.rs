//! Test support: the service binary started on loopback ports against a redis-server from the
//! root harness (tests/common), a gRPC client built from Envoy's protos, a minimal HTTP/1.1
//! client, and helpers. Every wait is a deadline on a condition. The including crate has the
//! root harness as `mod common;` (the service dies with the test process: `spawn_owned`).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use redis_ratelimit_service::pb::{
    Code, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient,
};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// The real Envoy in front of the service (tests/envoy.rs).
pub mod envoy;

/// The `NAME=value` lines of a docs block marked `<!-- test: name -->` (envoy::doc_block), each
/// value through `fill` (the test's files and addresses for the doc's), as an environment.
pub fn doc_env(file: &str, name: &str, fill: impl Fn(&str, &str) -> String) -> Vec<(String, String)> {
    envoy::doc_block(file, name)
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("{file} {name}: not NAME=value: {l}"));
            (k.to_string(), fill(k, v))
        })
        .collect()
}

/// An environment as [`ServiceProc::start_in_env`] takes it.
pub fn env_refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// A day boundary (unix seconds), so every unit's window starts there.
pub const T0_S: u64 = 20_834 * 86_400;

pub fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64
}

/// Pins the module's clock (DEBUG_CLOCK) at `us`.
pub fn set_clock(con: &mut redis::Connection, us: u64) {
    redis::cmd("RL.DEBUG").arg("CLOCK").arg("SET").arg(us).query::<()>(con).unwrap();
}

pub fn advance_clock(con: &mut redis::Connection, us: i64) {
    redis::cmd("RL.DEBUG").arg("CLOCK").arg("ADVANCE").arg(us).query::<()>(con).unwrap();
}

/// A fresh temporary directory (removed on drop).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("rls-test-{tag}-{}-{n}-{}", std::process::id(), now_us()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn write(&self, name: &str, text: &str) {
        // Write then rename: the reloader never reads half a file.
        let tmp = self.0.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.0.join(name)).unwrap();
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// The service's failure modes (`failure_mode:` in a domain), in the order the tests walk them.
pub const FAILURE_MODES: [&str; 4] = ["error", "open", "closed", "local"];

/// A config directory with one domain per failure mode, `<prefix>_<mode>`, each with one
/// descriptor `k` at 4 requests per `unit`.
pub fn failure_mode_configs(tag: &str, prefix: &str, unit: &str) -> TempDir {
    let dir = TempDir::new(tag);
    for m in FAILURE_MODES {
        let yaml = format!(
            "domain: {prefix}_{m}\nfailure_mode: {m}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {unit}, requests_per_unit: 4}}\n"
        );
        dir.write(&format!("{m}.yaml"), &yaml);
    }
    dir
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The service process.
pub struct ServiceProc {
    child: Option<Child>,
    pub grpc: String,
    pub http: String,
    log: PathBuf,
    _dir: TempDir,
}

impl ServiceProc {
    /// Starts the service on free ports with the config directory `config` and extra flags
    /// (`--redis-url …`); waits until it listens.
    pub fn start(config: &Path, args: &[&str]) -> ServiceProc {
        Self::spawn(config, args, None).listening()
    }

    /// [`ServiceProc::start`] in an environment of exactly `env`: nothing inherited.
    pub fn start_in_env(config: &Path, args: &[&str], env: &[(&str, &str)]) -> ServiceProc {
        Self::spawn(config, args, Some(env)).listening()
    }

    /// Starts the process (in an environment of exactly `env` when given) without waiting for
    /// it to listen: for a start that must fail ([`ServiceProc::wait_exit`]). An empty `config`
    /// passes no `--config`: the service reads its default path (`RUNTIME_ROOT`, …).
    pub fn spawn(config: &Path, args: &[&str], env: Option<&[(&str, &str)]>) -> ServiceProc {
        let dir = TempDir::new("svc");
        let log = dir.0.join("service.log");
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_redis-ratelimit-service"));
        cmd.args(["--grpc-host", "127.0.0.1", "--grpc-port", "0", "--http-host", "127.0.0.1", "--http-port", "0"])
            .args(["--config-poll-interval", "100ms", "--log-level", "debug"]);
        if !config.as_os_str().is_empty() {
            cmd.arg("--config").arg(config);
        }
        cmd.args(args)
            .env_remove("PORT")
            .env_remove("HOST")
            .env_remove("DRAIN_PERIOD")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if let Some(env) = env {
            cmd.env_clear().envs(env.iter().copied());
        }
        // Killed with the test process, however that ends (a panic, a kill, the watchdog).
        let child = crate::common::spawn_owned(cmd).expect("start redis-ratelimit-service");
        ServiceProc { child: Some(child), grpc: String::new(), http: String::new(), log, _dir: dir }
    }

    /// Waits until the process listens (its gRPC and HTTP addresses logged).
    fn listening(mut self) -> ServiceProc {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = self.log();
            let find = |what: &str| text.lines().find_map(|l| l.split_once(what).map(|(_, a)| a.trim().to_string()));
            if let (Some(g), Some(h)) = (find("listening for gRPC on "), find("listening for HTTP on ")) {
                self.grpc = g;
                self.http = h;
                return self;
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("the service exited ({st}) at start:\n{text}");
                }
            }
            if Instant::now() > deadline {
                panic!("the service did not listen within 20 s:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// A gRPC client (a new connection).
    pub async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc)).await.expect("grpc connect")
    }

    /// An HTTP/1.1 request; returns (status, body).
    pub fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        http(&self.http, method, path, body)
    }

    /// The value of a /metrics sample (exact name and labels), 0 when absent.
    pub fn metric(&self, sample: &str) -> u64 {
        let (_, text) = self.http("GET", "/metrics", "");
        text.lines()
            .find_map(|l| {
                l.strip_prefix(sample)
                    .and_then(|r| r.strip_prefix(' '))
                    .map(|v| v.trim().parse::<f64>().unwrap_or(0.0) as u64)
            })
            .unwrap_or(0)
    }

    pub fn wait_log(&self, what: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(what) {
            if Instant::now() > deadline {
                panic!("the service log never said '{what}':\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// grpc.health.v1 Check of `service` (a new connection): the status, or the call's error.
    pub async fn grpc_health(&self, service: &str) -> Result<ServingStatus, tonic::Status> {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", self.grpc)).unwrap();
        let mut c = HealthClient::new(channel.connect().await.expect("grpc connect"));
        let r = c.check(HealthCheckRequest { service: service.to_string() }).await?;
        Ok(r.into_inner().status())
    }

    /// Sends `sig` (`-TERM`, `-INT`, …) to the service.
    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill").args([sig, &self.pid().to_string()]).status().unwrap();
        assert!(st.success(), "kill {sig} {}", self.pid());
    }

    /// Waits for the process to exit, at most `timeout` (then kills it and panics).
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut c = self.child.take().expect("the service was started");
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!("the service did not exit within {timeout:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGTERM, then waits for the process to exit (at most 20 s); returns whether it exited
    /// with success.
    pub fn terminate(&mut self) -> bool {
        if self.child.is_none() {
            return false;
        }
        self.signal("-TERM");
        self.wait_exit(Duration::from_secs(20)).success()
    }

    /// How many times the log says `what`.
    pub fn log_count(&self, what: &str) -> usize {
        self.log().matches(what).count()
    }
}

impl Drop for ServiceProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("http connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    // Chunked bodies (axum streams): strip the chunk sizes.
    let body = if text.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(&body) } else { body };
    (status, body)
}

fn dechunk(b: &str) -> String {
    let mut out = String::new();
    let mut rest = b;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    out
}

/// A descriptor from `(key, value)` pairs.
pub fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() }).collect(),
        limit: None,
        hits_addend: None,
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest { domain: domain.to_string(), descriptors, hits_addend: 0 }
}

/// Sends a request; panics on a gRPC error.
pub async fn ask(c: &mut RateLimitServiceClient<tonic::transport::Channel>, r: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(r.clone()).await.unwrap_or_else(|e| panic!("ShouldRateLimit({r:?}) failed: {e}")).into_inner()
}

pub fn ok(r: &RateLimitResponse) -> bool {
    r.overall_code == Code::Ok as i32
}

pub fn codes(r: &RateLimitResponse) -> Vec<Code> {
    r.statuses.iter().map(|s| Code::try_from(s.code).unwrap()).collect()
}

pub fn remaining(r: &RateLimitResponse) -> Vec<u32> {
    r.statuses.iter().map(|s| s.limit_remaining).collect()
}

pub fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add.iter().find(|h| h.key.eq_ignore_ascii_case(name)).map(|h| h.value.as_str())
}

/// Calls of every command since the last `CONFIG RESETSTAT` (INFO commandstats), but INFO,
/// CONFIG and RL.DEBUG themselves.
pub fn command_calls(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let base = name.split('|').next().unwrap_or(name);
            if ["info", "config", "rl.debug", "ping", "client", "hello", "cluster", "readonly"].contains(&base) {
                return None;
            }
            rest.split(',').find_map(|kv| kv.strip_prefix("calls=")).and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

/// Like [`command_calls`], per command name.
pub fn command_calls_of(con: &mut redis::Connection, cmd: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    info.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(&format!("cmdstat_{cmd}:"))?;
            rest.split(',').find_map(|kv| kv.strip_prefix("calls=")).and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
}

pub fn reset_stats(con: &mut redis::Connection) {
    redis::cmd("CONFIG").arg("RESETSTAT").query::<()>(con).unwrap();
}

pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `sig` (`-STOP`, `-CONT`, …) to process `pid`.
pub fn signal(pid: u32, sig: &str) {
    let st = std::process::Command::new("kill").args([sig, &pid.to_string()]).status().unwrap();
    assert!(st.success(), "kill {sig} {pid}");
}

/// Issue 31.3: with Redis unable to answer, a call to each domain of
/// [`failure_mode_configs`]`(_, prefix, _)` with a descriptor `k` per value of `values` (new
/// values: nothing known of them locally) and a `grpc-timeout` of `timeout` is answered before
/// the timeout by its domain's failure mode: `error` UNAVAILABLE, `open` OK, `closed`
/// OVER_LIMIT, `local` OK (new values, within their share). An answer after the deadline would
/// be tonic's own CANCELLED instead.
pub async fn assert_failure_modes_answer_in_time(
    c: &mut RateLimitServiceClient<tonic::transport::Channel>,
    prefix: &str,
    values: &[String],
    timeout: Duration,
) {
    for m in FAILURE_MODES {
        let mut r =
            tonic::Request::new(request(&format!("{prefix}_{m}"), values.iter().map(|v| desc(&[("k", v)])).collect()));
        r.set_timeout(timeout);
        let asked = std::time::Instant::now();
        let answer = c.should_rate_limit(r).await;
        let took = asked.elapsed();
        assert!(took < timeout, "{m}: answered after {took:?}, beyond the grpc-timeout {timeout:?}: {answer:?}");
        match (m, answer) {
            ("error", Err(e)) => assert_eq!(e.code(), tonic::Code::Unavailable, "{m}: {e:?}"),
            ("closed", Ok(r)) => assert_eq!(r.get_ref().overall_code, Code::OverLimit as i32, "{m}: {r:?}"),
            ("open" | "local", Ok(r)) => assert!(ok(r.get_ref()), "{m}: {r:?}"),
            (m, r) => panic!("{m}: {r:?}"),
        }
    }
}

/// docs/service.md's Redis user ("The Redis user") as written, as Redis's `ACL` arguments:
/// `redis-user` where the server has the `@ratelimit` category, else `redis-user-by-name`; with
/// the grants of the block `extra` added (`redis-user-cluster`, `redis-user-sentinel`).
pub fn doc_redis_user(has_module_acl_category: bool, extra: Option<&str>) -> Vec<String> {
    let name = if has_module_acl_category { "redis-user" } else { "redis-user-by-name" };
    let mut acl = doc_acl_setuser(name);
    if let Some(extra) = extra {
        let extra = envoy::doc_block("docs/service.md", extra);
        acl.extend(
            extra
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .flat_map(|l| l.split_whitespace())
                .map(str::to_string),
        );
    }
    acl
}

/// The one `ACL SETUSER …` line of docs/service.md's block `name`, without `ACL`.
pub fn doc_acl_setuser(name: &str) -> Vec<String> {
    let block = envoy::doc_block("docs/service.md", name);
    let lines: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')).collect();
    assert_eq!(lines.len(), 1, "{name}: one ACL line: {block}");
    let words: Vec<String> = lines[0].split_whitespace().map(str::to_string).collect();
    assert_eq!(words[..2], ["ACL", "SETUSER"], "{name}: {block}");
    words[1..].to_vec()
}

/// ACL LOG's entries as (reason, object): what was refused, whatever the server's wording,
/// less redis-rs's `CLIENT SETINFO` at each connection's setup (7.2+: refused to a user without
/// it, and ignored by redis-rs: docs/service.md, "The Redis user").
pub fn acl_log(con: &mut redis::Connection) -> Vec<(String, String)> {
    let entries: Vec<std::collections::HashMap<String, redis::Value>> =
        redis::cmd("ACL").arg("LOG").query(con).unwrap();
    let text = |e: &std::collections::HashMap<String, redis::Value>, f: &str| match e.get(f) {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("ACL LOG entry's {f}: {other:?}"),
    };
    entries
        .iter()
        .map(|e| (text(e, "reason"), text(e, "object")))
        .filter(|(_, object)| object != "client|setinfo")
        .collect()
}
