//! Redis Sentinel for failover tests: a primary and replicas (the harness's [`Server`]s, with
//! the module) watched by sentinels (`redis-server --sentinel`, each its own process and
//! config file), quick to act (down after 500 ms), and a subscriber that notes when the
//! sentinels publish `+switch-master`.

// Each test crate uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{free_port, spawn_owned, wait_until, Opts, Server};

pub const MASTER: &str = "mymaster";

pub struct Sentinels {
    /// Each sentinel's plain port (the test's own connections use it).
    pub ports: Vec<u16>,
    /// Each sentinel's TLS port, when they speak TLS ([`Sentinels::start_tls`]).
    pub tls_ports: Vec<u16>,
    /// The sentinels' own password (`requirepass`), if any.
    password: Option<String>,
    children: Vec<Child>,
    dir: PathBuf,
}

impl Sentinels {
    /// `n` sentinels watching `primary` (quorum 2), ready when each names the primary.
    pub fn start(primary: &Server, n: usize) -> Sentinels {
        Self::start_with_password(primary, n, None)
    }

    /// [`Sentinels::start`], the sentinels asking for `password` (`requirepass`; they give it
    /// to each other with `sentinel sentinel-pass`).
    pub fn start_with_password(primary: &Server, n: usize, password: Option<&str>) -> Sentinels {
        Self::start_on(primary.port, n, password, None)
    }

    /// Sentinels that speak TLS (`tls-replication yes`: to the data nodes and to each other)
    /// and listen on a TLS port besides their plain one (which only the test's own
    /// connections use), watching the primary's TLS port `primary_tls_port`.
    pub fn start_tls(primary_tls_port: u16, n: usize, tls: &SentinelTls) -> Sentinels {
        Self::start_on(primary_tls_port, n, None, Some(tls))
    }

    fn start_on(primary_port: u16, n: usize, password: Option<&str>, tls: Option<&SentinelTls>) -> Sentinels {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir().join(format!("rl-sentinel-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ports = Vec::new();
        let mut tls_ports = Vec::new();
        let mut children = Vec::new();
        for _ in 0..n {
            let port = free_port();
            let conf = dir.join(format!("sentinel-{port}.conf"));
            let mut auth = match password {
                Some(p) => format!("requirepass {p}\nsentinel sentinel-pass {p}\n"),
                None => String::new(),
            };
            if let Some(t) = tls {
                let tls_port = free_port();
                tls_ports.push(tls_port);
                auth += &format!(
                    "tls-port {tls_port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
                     tls-auth-clients no\ntls-replication yes\n",
                    t.cert.display(),
                    t.key.display(),
                    t.ca.display()
                );
            }
            std::fs::write(
                &conf,
                auth + &format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel-{port}.log\n\
                     sentinel monitor {MASTER} 127.0.0.1 {p} 2\n\
                     sentinel down-after-milliseconds {MASTER} 500\n\
                     sentinel failover-timeout {MASTER} 5000\n\
                     sentinel parallel-syncs {MASTER} 2\n",
                    dir = dir.display(),
                    p = primary_port
                ),
            )
            .unwrap();
            let mut cmd = Command::new("redis-server");
            cmd.arg(&conf).arg("--sentinel").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
            children.push(spawn_owned(cmd).expect("start redis-server --sentinel"));
            ports.push(port);
        }
        let s = Sentinels { ports, tls_ports, password: password.map(str::to_string), children, dir };
        for &p in &s.ports {
            wait_until(Duration::from_secs(10), "a sentinel names the primary", || {
                s.master_addr(p).is_some_and(|(_, port)| port == primary_port)
            });
        }
        // Each sentinel knows the others and the replicas before a failover is asked of them.
        wait_until(Duration::from_secs(15), "the sentinels know each other", || {
            s.ports.iter().all(|&p| {
                let v: redis::RedisResult<Vec<redis::Value>> =
                    redis::cmd("SENTINEL").arg("sentinels").arg(MASTER).query(&mut s.conn(p));
                v.is_ok_and(|v| v.len() + 1 == n)
            })
        });
        s
    }

    fn url(&self, port: u16) -> String {
        match &self.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{port}/"),
            None => format!("redis://127.0.0.1:{port}/"),
        }
    }

    fn conn(&self, port: u16) -> redis::Connection {
        redis::Client::open(self.url(port)).unwrap().get_connection_with_timeout(Duration::from_secs(2)).unwrap()
    }

    /// What sentinel `port` says the primary is.
    pub fn master_addr(&self, port: u16) -> Option<(String, u16)> {
        let client = redis::Client::open(self.url(port)).ok()?;
        let mut c = client.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
        redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(MASTER).query(&mut c).ok()?
    }

    /// `host:port` of each sentinel.
    pub fn addrs(&self) -> Vec<String> {
        self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()
    }

    /// `host:port` of each sentinel's TLS port.
    pub fn tls_addrs(&self) -> Vec<String> {
        self.tls_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()
    }

    /// Starts noting the sentinels' `+switch-master` events (subscribed on every sentinel: the
    /// leader of a failover publishes first, the others when they learn of it).
    pub fn watch_switch(&self) -> SwitchWatch {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        for &port in &self.ports {
            let out = seen.clone();
            let ready = ready_tx.clone();
            let mut c = self.conn(port);
            std::thread::spawn(move || {
                let mut ps = c.as_pubsub();
                ps.subscribe("+switch-master").unwrap();
                ready.send(()).unwrap();
                while let Ok(m) = ps.get_message() {
                    let payload: String = m.get_payload().unwrap_or_default();
                    out.lock().unwrap().push((Instant::now(), payload));
                }
            });
        }
        for _ in &self.ports {
            ready_rx.recv_timeout(Duration::from_secs(5)).expect("subscribed");
        }
        SwitchWatch { seen }
    }

    pub fn log(&self) -> String {
        let mut out = String::new();
        for p in &self.ports {
            out += &std::fs::read_to_string(self.dir.join(format!("sentinel-{p}.log"))).unwrap_or_default();
        }
        out
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The certificate, key and CA (PEM files) of TLS sentinels.
pub struct SentinelTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

pub struct SwitchWatch {
    seen: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl SwitchWatch {
    /// The first `+switch-master` (when it came, and the new primary's port), waiting up to
    /// `timeout` for it.
    pub fn wait(&self, timeout: Duration) -> (Instant, u16) {
        let t = Instant::now();
        loop {
            if let Some((at, payload)) = self.seen.lock().unwrap().first() {
                let port = payload.split_whitespace().nth(4).and_then(|p| p.parse().ok()).expect("new port");
                return (*at, port);
            }
            assert!(t.elapsed() < timeout, "no +switch-master within {timeout:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A primary with the module and `replicas` replicas, synced.
pub fn replicated(replicas: usize) -> (Server, Vec<Server>) {
    let primary = Server::start_with(Opts { debug_clock: false, ..Default::default() });
    let replicas: Vec<Server> = (0..replicas)
        .map(|_| Server::start_with(Opts { debug_clock: false, replica_of: Some(primary.port), ..Default::default() }))
        .collect();
    for r in &replicas {
        crate::common::wait_replica_synced(&primary, r);
    }
    (primary, replicas)
}

/// [`replicated`] over TLS: every node listens on a TLS port beside its plain one (which only
/// the test's own connections use) and replicates over TLS (`tls-replication yes`: replicas
/// follow the primary's TLS port and announce their own, so the sentinels name TLS ports only).
/// `tls_opts` gives a node's TLS directives and its TLS port (`Certs::server_opts`). Each
/// server comes with its TLS port.
pub fn replicated_tls(replicas: usize, tls_opts: impl Fn() -> (u16, Vec<(String, String)>)) -> Vec<(Server, u16)> {
    let node = |replica_of: Option<u16>| {
        let (port, mut extra) = tls_opts();
        extra.push(("tls-replication".into(), "yes".into()));
        if let Some(p) = replica_of {
            extra.push(("replicaof".into(), format!("127.0.0.1 {p}")));
        }
        (Server::start_with(Opts { debug_clock: false, extra, ..Default::default() }), port)
    };
    let primary = node(None);
    let mut nodes = vec![];
    for _ in 0..replicas {
        nodes.push(node(Some(primary.1)));
    }
    for (r, _) in &nodes {
        crate::common::wait_replica_synced(&primary.0, r);
    }
    nodes.insert(0, primary);
    nodes
}
